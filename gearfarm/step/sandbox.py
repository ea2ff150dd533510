"""Where a job's commands run: a build, a suite or a benchmark is the project's code, and a
commit can be hostile, so it runs where it cannot reach the worker's secrets.

Mode ``bwrap`` (the default): bubblewrap (Debian's ``bubblewrap``) starts the command in new
user, PID, mount, IPC, UTS and network namespaces, as uid/gid 65534 with no capabilities.
Outside those namespaces the command is not the worker either: a worker running as root first
switches it to the farm's job uid ([farm] job_uid, by setpriv), so a job that got out of its
mount view would still be a user who can read none of the worker's files (its config is 0600)
and none of its processes' /proc entries. A worker that is not root cannot switch: its jobs are
its own uid outside the sandbox, and it says so at start (docs/security.md).
Its file system holds only:
  * the system's programs, read-only (/usr, /etc and the merged-/usr links), with the farm's
    own files inside them masked: /etc/gearfarm and every file the worker's config names
    (the config itself, TLS keys and certificates, CA bundles);
  * a fresh /proc of its own PID namespace (no /proc/<worker>/environ to read), a minimal
    /dev and an empty /tmp of at most [farm] job_tmp_size;
  * the job's own directories, writable (handed to the job's uid).
Nothing a catalog says can add to this: mounts, HOME, TMPDIR and a wine prefix (one per job,
inside the job's directory) come from the worker only, and catalog.parse refuses an `env` that
names them (gearfarm.formats.catalog.RESERVED_ENV).
Nothing else of the host exists there: not the state directory with the results database,
the spool or the caches; not /root, /home, /var or /run. The network namespace has only its
own loopback, so the job cannot reach gearmand, MinIO or the database.

In both modes the environment is built from scratch (ENV_PASSED from the worker, then the
catalog's own variables): no S3 keys, HMAC keys, GEARFARM_* settings or anything else of the
worker's environment reaches the command.

Mode ``none`` runs commands unconfined, apart from the environment. It is for hosts where
user namespaces are off, and the worker says so in its log at start.

Hand-written glue around bubblewrap: the sandbox itself is bubblewrap's, the layout (what to
show, what to mask) is the farm's decision.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from gearfarm.config import Config
from gearfarm.formats.catalog import RESERVED_ENV  # the rule is the catalog's
from gearfarm.hosts import process

log = logging.getLogger(__name__)

MODES = ("bwrap", "none")
# Read-only system trees; on merged-/usr systems some are symlinks, which are recreated as such.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# Always masked when present: the farm's conventional config and key directory.
FARM_DIRS = ("/etc/gearfarm",)
# What a command may inherit from the worker's environment: what makes tools behave (search
# path, locale, time zone), never what configures the farm.
ENV_PASSED = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "SOURCE_DATE_EPOCH")
ENV_PREFIXES = ("LC_",)
UNPRIVILEGED = "65534"  # nobody / nogroup


# Where a root worker binds a job's directories for bubblewrap to find as the job's uid (in a
# mount namespace of the command's own, over a tmpfs: the host's /mnt is not touched). The
# command's supervisor makes it (gearfarm/step/reaper.c stage()).
STAGE = "/mnt"


class Launch(NamedTuple):
    """A confined command as it must be started: process.run_logged(argv, env=env, stage=stage)."""
    argv: list[str]
    env: dict[str, str]
    # (STAGE, the directories bound at STAGE/0, /1, ...) or None: see Sandbox.command.
    stage: tuple[str, list[str]] | None = None


class SandboxError(RuntimeError):
    """The configured sandbox cannot run commands on this host."""


@dataclass(frozen=True)
class Sandbox:
    mode: str = "bwrap"
    # Files and directories to mask inside the read-only system trees.
    hidden: tuple[Path, ...] = field(default_factory=tuple)
    # Extra read-only trees for toolchains that live outside /usr (e.g. /opt/cross).
    readonly: tuple[Path, ...] = field(default_factory=tuple)
    # Directories every job may write besides its own (e.g. a ccache shared by the builds).
    shared: tuple[Path, ...] = field(default_factory=tuple)
    # Variables of the worker's environment passed on besides ENV_PASSED (e.g. CCACHE_DIR).
    env_names: tuple[str, ...] = field(default_factory=tuple)
    # The uid (and gid) job commands run as outside the sandbox; None: the worker's own (a
    # worker that is not root cannot switch, see for_config).
    uid: int | None = None
    # The most of a command's output its job's log keeps ([farm] log_limit; None: process's default).
    log_limit: int | None = None
    # The builds' compiler cache ([farm] ccache): each project's builds write only its own part.
    ccache: Path | None = None
    # The size of the sandbox's /tmp, a tmpfs ([farm] job_tmp_size; None: the kernel's default,
    # half the host's memory): a job that fills it finds it full, the host's memory does not.
    tmp_size: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SandboxError(f"sandbox mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.uid is not None and self.uid <= 0:
            raise SandboxError(f"job uid {self.uid} would run jobs as root: set [farm] job_uid to an unused uid")

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The base environment of a job's command: ENV_PASSED from this process, then ``extra``."""
        env = {k: v for k, v in os.environ.items()
               if k in ENV_PASSED or k in self.env_names or k.startswith(ENV_PREFIXES)}
        env.setdefault("PATH", os.defpath)
        env.update(extra or {})
        return env

    def command(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path,
                writable: Iterable[Path], wine_prefix: Path | None = None,
                inner: Mapping[str, str] | None = None) -> Launch:
        """``argv`` and ``env`` as they must be started to run confined, with ``writable`` (the
        job's directories, made by the worker) as the only places it can write. HOME is the first
        of them, TMPDIR the sandbox's /tmp, WINEPREFIX ``wine_prefix`` (one of the job's own,
        given by the worker): whatever ``env`` says of these three is replaced. ``inner``: variables
        for the confined command only, not for the tools that confine it (the loader's LD_DEBUG:
        bwrap's own loader, unable to reach the job's directories, would write to the log)."""
        dirs = [Path(p).resolve() for p in writable]
        if wine_prefix is not None:
            dirs.append(Path(wine_prefix).resolve())
        dirs += [d for d in self.shared if d.is_dir()]
        out_env = {k: v for k, v in env.items() if k not in RESERVED_ENV}
        if dirs:
            out_env["HOME"] = str(dirs[0])
        if wine_prefix is not None:
            out_env["WINEPREFIX"] = str(Path(wine_prefix).resolve())
        if self.mode == "none":
            return Launch(list(argv), {**out_env, **(inner or {})})
        out_env["TMPDIR"] = "/tmp"
        setenv = [a for k, v in (inner or {}).items() for a in ("--setenv", k, v)]
        if self.uid is None:
            return Launch([*self._bwrap(dirs, Path(cwd).resolve(), {}), *setenv, "--", *argv], out_env)
        # The job's uid cannot reach the directories it binds: they lie under the worker's own,
        # private ones (its state directory is 0700). So, still as root, in a mount namespace
        # of the command's own, the supervisor binds each at STAGE/<n>, where bubblewrap, as the
        # job's uid, finds it; nothing else of the host becomes reachable that way.
        sources = [*dirs, *(d for d in self.readonly if d.is_dir())]
        staged = {d: f"{STAGE}/{n}" for n, d in enumerate(sources)}
        user = [find_tool("setpriv", "util-linux"), f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                "--inh-caps=-all", "--"]
        return Launch([*user, *self._bwrap(dirs, Path(cwd).resolve(), staged), *setenv, "--", *argv], out_env,
                      (STAGE, [str(d) for d in sources]))

    def run(self, argv: Sequence[str], log_path: Path, timeout: float, cwd: Path, env: Mapping[str, str],
            writable: Iterable[Path], wine_prefix: Path | None = None,
            inner: Mapping[str, str] | None = None) -> tuple[int | None, bool]:
        """Run ``argv`` confined (command()) under its supervisor, its output appended to
        ``log_path``: process.run_logged's (exit code, timed out)."""
        launch = self.command(argv, env, cwd, writable, wine_prefix, inner)
        return process.run_logged(launch.argv, log_path, timeout, cwd=cwd, env=launch.env, shown=argv,
                                  limit=self.log_limit, stage=launch.stage)

    def compiler_cache(self, project: str) -> Path | None:
        """The project's part of the compiler cache (made, and the job uid's), or None without one.
        Only its top is handed over: what is inside, the job uid wrote."""
        if self.ccache is None:
            return None
        mine = self.ccache / project
        mine.mkdir(parents=True, exist_ok=True)
        if self.uid is not None and self.mode != "none":
            os.lchown(mine, self.uid, self.uid)
        return mine

    def give(self, paths: Iterable[Path]) -> None:
        """Hand the job's own directories to its uid, whole (the worker unpacked them as itself):
        links are changed, never followed."""
        if self.uid is None or self.mode == "none":
            return
        for top in paths:
            if not top.is_dir() or top.is_symlink():
                continue
            os.lchown(top, self.uid, self.uid)
            for d, dirs, files in os.walk(top):
                for name in dirs + files:
                    os.lchown(os.path.join(d, name), self.uid, self.uid)

    def _bwrap(self, writable: list[Path], cwd: Path, staged: Mapping[Path, str]) -> list[str]:
        args = [find_bwrap(), "--unshare-all", "--die-with-parent", "--new-session",
                "--uid", UNPRIVILEGED, "--gid", UNPRIVILEGED]
        # First: what is mounted later (a toolchain or a job directory under /tmp) must not be
        # covered by the empty /tmp.
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += [*(["--size", str(self.tmp_size)] if self.tmp_size else []), "--tmpfs", "/tmp"]
        trees: list[Path] = []
        for top in SYSTEM:
            p = Path(top)
            if p.is_symlink():
                args += ["--symlink", os.readlink(p), top]
            elif p.is_dir():
                args += ["--ro-bind", top, top]
                trees.append(p)
        for extra in self.readonly:
            if extra.is_dir():
                args += ["--ro-bind", staged.get(extra, str(extra)), str(extra)]
                trees.append(extra)
        for secret in [*(Path(d) for d in FARM_DIRS), *self.hidden]:
            # Only what the sandbox would otherwise show needs masking (and only that can be
            # masked: bwrap cannot mount over a path that does not exist in the sandbox).
            if not any(secret == t or t in secret.parents for t in trees) or not secret.exists():
                continue
            if secret.is_dir():
                args += ["--tmpfs", str(secret)]
            else:
                args += ["--ro-bind", "/dev/null", str(secret)]
        for d in writable:
            args += ["--bind", staged.get(d, str(d)), str(d)]
        # The sandbox's own root (where bwrap made the mount points) is a tmpfs: read-only, so
        # the job's directories and /tmp are the only places it can write.
        args += ["--remount-ro", "/", "--chdir", str(cwd)]
        return args

    def check(self) -> None:
        """Start a trivial command the way jobs start: SandboxError with the fix if it fails."""
        if self.mode == "none":
            return
        if self.uid is not None:
            with suppress(OSError):  # the FHS's /mnt, absent from some minimal images
                Path(STAGE).mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gearfarm-sandbox-check-") as tmp:
            log = Path(tmp) / "log"
            try:
                rc, timed_out = self.run(["true"], log, 30, Path("/"), self.environment(), [])
                said = log.read_text(errors="replace").splitlines()[1:]
            except OSError as e:
                rc, timed_out, said = None, False, [str(e)]
        if rc != 0:
            # The log's first line is the command; its last, when it ran, how it ended.
            said = [line.strip() for line in said if line.strip() and not line.startswith("--- ")]
            reason = "; ".join(said) or ("timed out" if timed_out else f"exit {rc}")
            raise SandboxError(
                f"bubblewrap cannot confine jobs on this host ({reason}). "
                "Jobs would be able to read this worker's keys. Fix: allow unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1); in a container, let it mount a /proc of its own "
                "(--security-opt systempaths=unconfined, for podman and docker alike)"
                + (" and, as the worker runs jobs as the job uid, make their mount namespaces (--cap-add SYS_ADMIN)"
                   if self.uid is not None else "")
                + "; or set [farm] sandbox = \"none\" to run jobs unconfined on purpose")


def find_tool(name: str, package: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if found is None:
        raise SandboxError(f"{name} not found: install {package} (apt-get install {package}), or set "
                           "[farm] sandbox = \"none\" to run jobs unconfined on purpose")
    return found


def find_bwrap() -> str:
    return find_tool("bwrap", "bubblewrap")


def within(path: Path, roots: Iterable[Path]) -> Path | None:
    """``path`` with every link resolved, if it is one of ``roots`` or inside one; else None.
    The worker reads what a job left (results, metrics, counts) only through this: a job's
    link to the worker's config, or to /etc/shadow, must not become a file the worker uploads."""
    real = Path(os.path.realpath(path))
    for root in roots:
        top = Path(os.path.realpath(root))
        if real == top or top in real.parents:
            return real
    return None


def for_config(cfg: Config) -> Sandbox:
    """The sandbox a worker runs its jobs in, as ``cfg`` says ([farm] sandbox, job_uid), checked
    once: a worker that cannot confine its jobs refuses to start rather than run them with its
    keys in reach. Only root can switch jobs to the job uid; another worker warns that its jobs
    share its uid outside the sandbox."""
    uid: int | None = cfg.farm.job_uid or None
    if uid is not None and os.geteuid() != 0:
        log.warning("jobs run as this worker's own uid %d outside their sandbox ([farm] job_uid %d needs a worker "
                    "started as root): a job that escaped its mount view could read what this worker reads",
                    os.geteuid(), uid)
        uid = None
    keys = [Path(cfg.source) if cfg.source else None, cfg.path(cfg.gearman.tls_key) if cfg.gearman.tls_key else None]
    exposed = [f for f in keys if f is not None and f.is_file() and f.stat().st_mode & 0o004]
    if exposed:
        # A sandbox keeps jobs from these files' paths; their mode must keep them from their bytes.
        raise SandboxError(f"{', '.join(map(str, exposed))}: readable by every user of this host, and it holds the "
                           "farm's keys: a job (or anyone) could read them. Fix: chmod o-r "
                           + " ".join(map(str, exposed)))
    box = Sandbox(cfg.farm.sandbox, tuple(cfg.secret_files()),
                  tuple(cfg.path(p) for p in cfg.farm.sandbox_readonly),
                  tuple(cfg.path(p) for p in cfg.farm.sandbox_shared), tuple(cfg.farm.sandbox_env),
                  uid if cfg.farm.sandbox != "none" else None, cfg.farm.log_limit,
                  cfg.path(os.path.expanduser(cfg.farm.ccache)) if cfg.farm.ccache else None,
                  cfg.farm.job_tmp_size)
    box.check()
    try:
        process.reaper_command()  # built now: no command of any job runs without its supervisor
    except process.ReaperError as e:
        raise SandboxError(str(e)) from e
    # Directories meant to be shared by every job are the job uid's: jobs write there.
    box.give(list(box.shared))
    if box.mode == "none":
        log.warning("jobs run unconfined ([farm] sandbox = \"none\"): a hostile commit can read this "
                    "host's farm config and keys")
    return box

