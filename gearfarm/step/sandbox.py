"""Where a job's commands run: a build, a suite or a benchmark is the project's code, and a
commit can be hostile, so it runs where it cannot reach the worker's secrets.

Every command, in both modes, runs in a cgroup of its own where the host lets the worker make
one (gearfarm/hosts/cgroup.py): its processes, memory and CPU weight bounded by [farm]
job_pids_max, job_memory_max and job_cpu_weight, lowered by the catalog's [limits]; a command
that reaches one is said to (Ran.reached) and its step fails naming it.

Each worker process (a slot) runs its jobs as a uid of its own, the first of [farm] job_uid's
range whose lock in UID_LOCKS it can take (slot_uid): no two slots of any farm on the host run
jobs as one uid at once. Every slot's jobs share one group, job_uid's gid, which owns what the
jobs share (the compiler cache, sandbox_shared).

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

import fcntl
import functools
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
from gearfarm.formats.words import size_text
from gearfarm.hosts import cgroup, process

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


# Where a root worker's slots lock the uid each runs its jobs as (slot_uid): host-wide, so two
# farms on the host never share one, and root's alone.
UID_LOCKS = Path("/run/gearfarm/job-uids")


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


class Ran(NamedTuple):
    """How a command ended: process.run_logged's exit code and whether it timed out, and the
    limit of its cgroup it reached ("": none, or no cgroup) with the peaks the kernel counted."""
    rc: int | None
    timed_out: bool
    reached: str = ""
    usage: cgroup.Usage | None = None


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
    # The uid job commands run as outside the sandbox (the slot's: slot_uid); None: the worker's
    # own (a worker that is not root cannot switch, see for_config).
    uid: int | None = None
    # The most of a command's output its job's log keeps ([farm] log_limit; None: process's default).
    log_limit: int | None = None
    # The most of a suite's results file (JUnit, TAP) the worker reads and stores ([farm] result_limit).
    result_limit: int | None = None
    # The builds' compiler cache ([farm] ccache): each project's builds write only its own part.
    ccache: Path | None = None
    # The gid every slot's jobs run as, which owns what they share; None: uid's.
    gid: int | None = None
    # Where each command's cgroup is made (None: the host gives none) and the farm's limits.
    cgroups: cgroup.Tree | None = None
    limits: cgroup.Limits = cgroup.Limits()
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
        gid = self.uid if self.gid is None else self.gid
        user = [find_tool("setpriv", "util-linux"), f"--reuid={self.uid}", f"--regid={gid}", "--clear-groups",
                "--inh-caps=-all", "--"]
        return Launch([*user, *self._bwrap(dirs, Path(cwd).resolve(), staged), *setenv, "--", *argv], out_env,
                      (STAGE, [str(d) for d in sources]))

    def run(self, argv: Sequence[str], log_path: Path, timeout: float, cwd: Path, env: Mapping[str, str],
            writable: Iterable[Path], wine_prefix: Path | None = None,
            inner: Mapping[str, str] | None = None, limits: cgroup.Limits | None = None) -> Ran:
        """Run ``argv`` confined (command()) under its supervisor, its output appended to
        ``log_path``, in a cgroup of its own with the farm's limits lowered to ``limits`` (the
        catalog's): how it ended. A limit it reached is said at the end of its log."""
        launch = self.command(argv, env, cwd, writable, wine_prefix, inner)
        if self.cgroups is None:
            rc, timed_out = process.run_logged(launch.argv, log_path, timeout, cwd=cwd, env=launch.env, shown=argv,
                                               limit=self.log_limit, stage=launch.stage)
            return Ran(rc, timed_out)
        group = self.cgroups.group(self.limits.within(limits or cgroup.Limits()))
        try:
            rc, timed_out = process.run_logged(launch.argv, log_path, timeout, cwd=cwd, env=launch.env, shown=argv,
                                               limit=self.log_limit, stage=launch.stage, cgroup=group.procs())
            usage = group.usage()
        finally:
            group.close()
        if usage.reached:
            peaks = [f"{usage.processes_peak} processes" if usage.processes_peak is not None else "",
                     f"{usage.memory_peak / 2**20:.1f} MiB of memory" if usage.memory_peak is not None else ""]
            with log_path.open("a") as f:
                f.write(f"*** {usage.reached} (at most {' and '.join(p for p in peaks if p) or 'unknown'}): the "
                        "job's cgroup stopped it ([farm] job_pids_max, job_memory_max or the catalog's [limits]) ***\n")
        return Ran(rc, timed_out, usage.reached, usage)

    def compiler_cache(self, project: str) -> Path | None:
        """The project's part of the compiler cache (made, and the job uid's), or None without one.
        Only its top is handed over: what is inside, the job uid wrote."""
        if self.ccache is None:
            return None
        mine = self.ccache / project
        mine.mkdir(parents=True, exist_ok=True)
        if self.uid is not None and self.mode != "none":
            self.share([mine])
        return mine

    def share(self, paths: Iterable[Path]) -> None:
        """Hand directories every slot's jobs write to the jobs' group: setgid and group-writable,
        so what one slot's uid makes there stays the group's (ccache: CCACHE_UMASK=002). The tops
        stay the worker's: no slot's job can take them from the others (chmod)."""
        if self.uid is None or self.mode == "none":
            return
        gid = self.uid if self.gid is None else self.gid
        for top in paths:
            if not top.is_dir() or top.is_symlink():
                continue
            os.lchown(top, os.geteuid(), gid)
            os.chmod(top, 0o2770)
            for d, dirs, files in os.walk(top):
                for name in dirs + files:
                    os.lchown(os.path.join(d, name), -1, gid)

    def give(self, paths: Iterable[Path]) -> None:
        """Hand the job's own directories to its uid, whole (the worker unpacked them as itself):
        links are changed, never followed."""
        if self.uid is None or self.mode == "none":
            return
        for top in paths:
            if not top.is_dir() or top.is_symlink():
                continue
            gid = self.uid if self.gid is None else self.gid
            os.lchown(top, self.uid, gid)
            for d, dirs, files in os.walk(top):
                for name in dirs + files:
                    os.lchown(os.path.join(d, name), self.uid, gid)

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
                rc, timed_out, _, _ = self.run(["true"], log, 30, Path("/"), self.environment(), [])
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


_slot: tuple[int, int, int] | None = None  # (pid, uid, the lock's fd) of this process's slot_uid


def slot_uid(first: int, count: int, locks: Path | None = None) -> int:
    """The uid this process (a worker slot) runs its jobs as, for its whole life: the first of
    ``first`` .. ``first + count - 1`` whose lock file in ``locks`` (UID_LOCKS) no other process of
    the host holds, held (flock) until this process ends. SandboxError when every one is held,
    or when the lock directory is not root's alone (anyone who could write it could take uids)."""
    global _slot
    if _slot is not None and _slot[0] == os.getpid():
        return _slot[1]
    where = locks or UID_LOCKS
    where.mkdir(mode=0o755, parents=True, exist_ok=True)
    for d in (where, where.parent):
        st = d.lstat()
        if st.st_uid != 0 or st.st_mode & 0o022 or not os.path.isdir(d) or os.path.islink(d):
            raise SandboxError(f"{d} holds the host's job uid locks but is owned by uid {st.st_uid} with mode "
                               f"{st.st_mode & 0o7777:o}: another user could take or fake them. Fix: make it root's, "
                               "mode 0755 (or remove it: the worker makes it)")
    for uid in range(first, first + count):
        fd = os.open(where / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _slot = (os.getpid(), uid, fd)
        return uid
    raise SandboxError(f"every job uid from {first} to {first + count - 1} ([farm] job_uid, job_uids) is held by "
                       f"another worker slot on this host (locks in {where}): raise [farm] job_uids, or run fewer "
                       "slots")


@functools.cache
def host_cgroups(version: int | None = None) -> cgroup.Tree | str:
    """This process's tree of job cgroups, made once, with what dead workers left removed; or
    why the host gives it none."""
    try:
        tree = cgroup.detect(version)
    except cgroup.CgroupError as e:
        return str(e)
    for gone in tree.sweep():
        log.info("removed the job cgroup %s, left by a worker that is gone", gone)
    return tree


_said: set[str] = set()


def _once(level: int, text: str) -> None:
    """Log ``text`` once in this process's life: a worker of several roles makes a sandbox each."""
    if text not in _said:
        _said.add(text)
        log.log(level, text)


def release() -> None:
    """A stopping worker's own job cgroups go."""
    if host_cgroups.cache_info().currsize:
        tree = host_cgroups()
        if isinstance(tree, cgroup.Tree):
            tree.release()


def for_config(cfg: Config) -> Sandbox:
    """The sandbox a worker runs its jobs in, as ``cfg`` says ([farm] sandbox, job_uid, the job
    limits), checked once: a worker that cannot confine its jobs refuses to start rather than run
    them with its keys in reach. Only root can switch jobs to a job uid (this slot's: slot_uid);
    another worker warns that its jobs share its uid outside the sandbox. A worker whose host
    gives it no cgroups for its jobs says so, and runs them without those limits, or refuses to
    start when [farm] job_limits = "required"."""
    uid: int | None = cfg.farm.job_uid or None
    if uid is not None and os.geteuid() != 0:
        log.warning("jobs run as this worker's own uid %d outside their sandbox ([farm] job_uid %d needs a worker "
                    "started as root): a job that escaped its mount view could read what this worker reads",
                    os.geteuid(), uid)
        uid = None
    gid = uid
    if uid is not None and cfg.farm.sandbox != "none":
        uid = slot_uid(uid, cfg.farm.job_uids)
        _once(logging.INFO, f"this slot runs its jobs as uid {uid} (group {gid})")
    tree = host_cgroups()
    if isinstance(tree, str):
        if cfg.farm.job_limits == "required":
            raise SandboxError(f"[farm] job_limits = \"required\", and {tree}")
        _once(logging.WARNING, f"jobs run without process, memory and CPU limits: {tree}")
        tree = None
    else:
        _once(logging.INFO, f"each job command runs in a cgroup (v{tree.version}: "
              f"{', '.join(tree.controllers()) or 'no controller'}) of at most {cfg.farm.job_pids_max or 'any'} "
              f"processes and {size_text(cfg.farm.job_memory_max) if cfg.farm.job_memory_max else 'any'} of memory, "
              f"CPU weight {cfg.farm.job_cpu_weight}")
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
                  uid if cfg.farm.sandbox != "none" else None, cfg.farm.log_limit, cfg.farm.result_limit,
                  cfg.path(os.path.expanduser(cfg.farm.ccache)) if cfg.farm.ccache else None,
                  gid if cfg.farm.sandbox != "none" else None, tree,
                  cgroup.Limits(cfg.farm.job_pids_max or None, cfg.farm.job_memory_max or None,
                                cfg.farm.job_cpu_weight),
                  cfg.farm.job_tmp_size)
    box.check()
    try:
        process.reaper_command()  # built now: no command of any job runs without its supervisor
    except process.ReaperError as e:
        raise SandboxError(str(e)) from e
    # Directories meant to be shared by every job are the jobs' group's: every slot's jobs write there.
    box.share(list(box.shared))
    if box.mode == "none":
        log.warning("jobs run unconfined ([farm] sandbox = \"none\"): a hostile commit can read this "
                    "host's farm config and keys")
    return box

