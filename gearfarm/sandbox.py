"""Where a job's commands run: a build, a suite or a benchmark is the project's code, and a
commit can be hostile, so it runs where it cannot reach the worker's secrets.

Mode ``bwrap`` (the default): bubblewrap (Debian's ``bubblewrap``) starts the command in new
user, PID, mount, IPC, UTS and network namespaces, as uid/gid 65534 with no capabilities.
Its file system holds only:
  * the system's programs, read-only (/usr, /etc and the merged-/usr links), with the farm's
    own files inside them masked: /etc/gearfarm and every file the worker's config names
    (the config itself, TLS keys and certificates, CA bundles);
  * a fresh /proc of its own PID namespace (no /proc/<worker>/environ to read), a minimal
    /dev and an empty /tmp;
  * the job's own directories, writable.
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
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gearfarm.config import Config

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

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SandboxError(f"sandbox mode {self.mode!r} is not one of {', '.join(MODES)}")

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The base environment of a job's command: ENV_PASSED from this process, then ``extra``."""
        env = {k: v for k, v in os.environ.items()
               if k in ENV_PASSED or k in self.env_names or k.startswith(ENV_PREFIXES)}
        env.setdefault("PATH", os.defpath)
        env.update(extra or {})
        return env

    def command(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path,
                writable: Iterable[Path]) -> tuple[list[str], dict[str, str]]:
        """``argv`` and ``env`` as they must be started to run confined, with ``writable``
        (the job's directories) and a WINEPREFIX the environment names as the only places
        it can write. HOME is the first writable directory, TMPDIR the sandbox's /tmp."""
        dirs = [Path(p).resolve() for p in writable]
        if "WINEPREFIX" in env:
            dirs.append(Path(env["WINEPREFIX"]).resolve())
        dirs += [d for d in self.shared if d.is_dir()]
        out_env = dict(env)
        if dirs:
            out_env["HOME"] = str(dirs[0])
        if self.mode == "none":
            return list(argv), out_env
        out_env["TMPDIR"] = "/tmp"
        return [*self._bwrap(dirs, Path(cwd).resolve()), "--", *argv], out_env

    def _bwrap(self, writable: list[Path], cwd: Path) -> list[str]:
        args = [find_bwrap(), "--unshare-all", "--die-with-parent", "--new-session",
                "--uid", UNPRIVILEGED, "--gid", UNPRIVILEGED]
        # First: what is mounted later (a toolchain or a job directory under /tmp) must not be
        # covered by the empty /tmp.
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
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
                args += ["--ro-bind", str(extra), str(extra)]
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
            args += ["--bind", str(d), str(d)]
        # The sandbox's own root (where bwrap made the mount points) is a tmpfs: read-only, so
        # the job's directories and /tmp are the only places it can write.
        args += ["--remount-ro", "/", "--chdir", str(cwd)]
        return args

    def check(self) -> None:
        """Start a trivial command the way jobs start: SandboxError with the fix if it fails."""
        if self.mode == "none":
            return
        argv, env = self.command(["true"], self.environment(), Path("/"), [])
        try:
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            p = subprocess.CompletedProcess(argv, -1, "", str(e))
        if p.returncode != 0:
            raise SandboxError(
                f"bubblewrap cannot confine jobs on this host ({p.stderr.strip() or f'exit {p.returncode}'}). "
                "Jobs would be able to read this worker's keys. Fix: allow unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1); in a container, let it mount a /proc of its own "
                "(podman run --security-opt unmask=ALL, docker run --security-opt systempaths=unconfined); or "
                "set [farm] sandbox = \"none\" to run jobs unconfined on purpose")


def find_bwrap() -> str:
    found = shutil.which("bwrap") or ("/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)
    if found is None:
        raise SandboxError("bwrap not found: install bubblewrap (apt-get install bubblewrap), or set "
                           "[farm] sandbox = \"none\" to run jobs unconfined on purpose")
    return found


def for_config(cfg: Config) -> Sandbox:
    """The sandbox a worker runs its jobs in, as ``cfg`` says ([farm] sandbox), checked once: a
    worker that cannot confine its jobs refuses to start rather than run them with its keys in
    reach."""
    box = Sandbox(cfg.farm.sandbox, tuple(cfg.secret_files()),
                  tuple(cfg.path(p) for p in cfg.farm.sandbox_readonly),
                  tuple(cfg.path(p) for p in cfg.farm.sandbox_shared), tuple(cfg.farm.sandbox_env))
    box.check()
    if box.mode == "none":
        log.warning("jobs run unconfined ([farm] sandbox = \"none\"): a hostile commit can read this "
                    "host's farm config and keys")
    return box
