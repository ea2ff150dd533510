"""A job's own wine prefix. Wine keeps its registry and C: drive in a prefix that every program it
runs writes, so a prefix shared by jobs carries one job's writes into the next, and a prefix a
catalog could name (WINEPREFIX=/tmp, or the state directory) would be mounted writable into the
job. So the worker makes one per job, inside the job's directory, and no catalog can set it
(gearfarm.formats.catalog.RESERVED_ENV).

A fresh prefix costs wineboot 8-30 s and ~700 MB (wine 8 copies its DLLs into it), so a host makes
one template per wine version, confined like a job, and each job gets a copy: its directories and
registry files are the job's own, every other file is a hard link to the template's, which the
worker owns and jobs cannot write (they run as another uid). Measured here: 0.09 s per job.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from gearfarm.step.sandbox import Sandbox

# Files wine rewrites in place while it runs: each job gets its own copy of these.
_OWN = (".reg", ".update-timestamp")
TEMPLATE_TIMEOUT = 300.0


class WineError(RuntimeError):
    """The host could not make its wine template."""


def is_wine(runner: list[str]) -> bool:
    return bool(runner) and Path(runner[0]).name.startswith("wine")


def _version() -> str:
    try:
        out = subprocess.run(["wine", "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        raise WineError(f"wine does not start on this host ({e}): install wine (apt-get install wine wine64)") from e
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in out) or "unknown"


def template(box: Sandbox, cache: Path) -> Path:
    """This host's template prefix for its wine version, made once (under a lock, so parallel
    workers make it once): wineboot runs confined, as the job uid, then the tree is the worker's
    and not writable by anyone else."""
    dest = cache / f"template-{_version()}"
    if (dest / ".complete").exists():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "template.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").exists():
            return dest
        making = cache / f".making-{os.getpid()}"
        shutil.rmtree(making, ignore_errors=True)
        making.mkdir()
        log = cache / "template.log"
        # wineserver -w: the registry is on disk before the reaper ends the command's processes.
        argv = ["sh", "-c", "wineboot --init && wineserver -w"]
        box.give([making])
        rc, timed_out, _, _ = box.run(argv, log, TEMPLATE_TIMEOUT, making, box.environment({"WINEDEBUG": "-all"}),
                                      [making], wine_prefix=making)
        if rc != 0 or timed_out or not (making / "system.reg").is_file():
            shutil.rmtree(making, ignore_errors=True)
            raise WineError(f"wineboot could not make this host's wine prefix template (exit {rc}"
                            f"{', timed out' if timed_out else ''}): see {log}")
        # The running wineserver's own record of its directory: each job's server writes its own.
        (making / "wineserver").unlink(missing_ok=True)
        uid, gid = os.getuid(), os.getgid()
        for d, dirs, files in os.walk(making):
            for name in [*dirs, *files, ""]:
                path = os.path.join(d, name) if name else d
                os.lchown(path, uid, gid)
                if not os.path.islink(path):
                    os.chmod(path, os.lstat(path).st_mode & 0o755)
        (making / ".complete").write_text("")
        shutil.rmtree(dest, ignore_errors=True)
        making.rename(dest)
    return dest


def job_prefix(box: Sandbox, cache: Path, runner: list[str], job: Path) -> Path | None:
    """The job's own prefix under ``job`` when its target runs under wine (None otherwise)."""
    if not is_wine(runner):
        return None
    return copy(template(box, cache), job / "wine", box.uid)


def copy(src: Path, dest: Path, uid: int | None) -> Path:
    """A prefix at ``dest`` for a job running as ``uid``: its directories, links and registry
    files its own, the rest hard links to ``src``'s files, which it cannot write. A job running
    as the worker's own uid could write those, so it gets copies instead (slower, ~700 MB)."""
    link = uid is not None and uid != os.getuid()
    dest.parent.mkdir(parents=True, exist_ok=True)
    for d, dirs, files in os.walk(src):
        out = dest / os.path.relpath(d, src)
        out.mkdir()
        if uid is not None:
            os.lchown(out, uid, uid)
        for name in [*files, *(x for x in dirs if os.path.islink(os.path.join(d, x)))]:
            s, o = os.path.join(d, name), out / name
            if name in (".complete", "wineserver"):
                continue
            if os.path.islink(s) and Path(d).relative_to(src).parts[:2] == ("drive_c", "users"):
                # wineboot linked the user's folders (Documents, Desktop...) to the HOME it ran
                # with, which is gone: each job gets them as folders of its own prefix.
                o.mkdir()
            elif os.path.islink(s):
                os.symlink(os.readlink(s), o)
            elif link and not name.endswith(_OWN):
                os.link(s, o)
                continue
            else:
                shutil.copy2(s, o, follow_symlinks=False)
            if uid is not None:
                os.lchown(o, uid, uid)
    return dest
