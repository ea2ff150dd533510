"""What a job leaves in its directories, as the worker touches it. The job is another team's
code: it may leave a FIFO, a socket or a link where a results file should be, a file of any
size, a tree thousands of directories deep, directories it made unreadable. So every file the
worker reads of it is opened here (open_file: no link followed, never blocking, a regular file
or a refusal naming what it is), read with a cap (read_capped, copy_capped); a tree is walked
and removed without recursion, on its own device, whatever modes the job set (walk, remove);
and what still cannot be removed is moved to a quarantine beside the jobs root, reported, so it
never stops a slot, the next job or the worker's start."""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1024 * 1024
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"))


class NotAFile(OSError):
    """A job left something other than a regular file where the worker reads one."""


def kind(mode: int) -> str:
    """What a file of this mode is, in words ("a FIFO")."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _size_text(n: int) -> str:
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} bytes"


def _not_a_file(path: Path | str, mode: int) -> NotAFile:
    return NotAFile(22, f"{path} is {kind(mode)}, not a regular file: the worker reads only regular files a job "
                        "leaves, and follows no link")


@contextmanager
def open_file(path: Path | str) -> Iterator[tuple[BinaryIO, int]]:
    """A file a job made, open for reading, and its size; NotAFile naming it when it is a link,
    a FIFO, a socket, a device or a directory. Opened without following a last link and without
    blocking (a FIFO's open waits for a writer, a leased file's for its holder), then checked on
    the open descriptor, so nothing is read from what the path names a moment later."""
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP for a link, ENXIO for a socket: say what it is
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            raise e from None
        if stat.S_ISREG(mode):
            raise
        raise _not_a_file(path, mode) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_a_file(path, st.st_mode)
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        yield fh, st.st_size


def read_capped(path: Path | str, limit: int) -> tuple[bytes, int]:
    """The first ``limit`` bytes of a job's file and how many bytes past them were not read."""
    with open_file(path) as (fh, size):
        data = fh.read(limit)
    return data, max(0, size - len(data))


@dataclass(frozen=True)
class Copied:
    size: int  # of the job's file
    kept: int  # bytes copied
    dropped: int  # bytes not copied, past the cap

    def note(self, path: Path | str, limit_key: str = "[farm] result_limit") -> str:
        """What was dropped, said where the copy ends and in the job's log."""
        return (f"{path} is {self.size} bytes: {self.dropped} bytes after its first {_size_text(self.kept)} were "
                f"dropped (results capped at {_size_text(self.kept)}: {limit_key}); what it says after them is not "
                "recorded")


def copy_capped(path: Path | str, dst: Path, limit: int) -> Copied:
    """Copy at most ``limit`` bytes of a job's file to the worker's own ``dst``, streaming (a
    chunk at a time, whatever the file's size)."""
    kept = 0
    with open_file(path) as (fh, size), dst.open("wb") as out:
        while kept < limit and (chunk := fh.read(min(CHUNK, limit - kept))):
            out.write(chunk)
            kept += len(chunk)
    return Copied(size, kept, max(0, size - kept))


def walk(top: Path | str) -> Iterator[tuple[str, list[str], list[str]]]:
    """(directory, its subdirectories, its other entries) for ``top`` and every directory below
    it, like os.walk top-down (names sorted; pruning ``dirs`` skips them), but without recursion
    (Python 3.11's os.walk and Path.rglob raise RecursionError on a tree a thousand deep), never
    through a link, and never onto another device. A directory whose path is longer than
    PATH_MAX is not entered: no caller could name what is in it (removal goes by descriptors)."""
    try:
        dev = os.lstat(top).st_dev
    except OSError:
        return
    pending = [os.fspath(top)]
    while pending:
        here = pending.pop()
        dirs, files = [], []
        try:
            with os.scandir(here) as it:
                for e in it:
                    try:
                        is_dir = e.is_dir(follow_symlinks=False) and e.stat(follow_symlinks=False).st_dev == dev
                    except OSError:
                        is_dir = False
                    (dirs if is_dir else files).append(e.name)
        except OSError:
            continue
        dirs.sort()
        files.sort()
        yield here, dirs, files
        pending.extend(os.path.join(here, d) for d in reversed(dirs))


# -- removal ------------------------------------------------------------------------------------


def _open_dir(parent: int, name: str) -> int:
    """A subdirectory the job made, opened after giving its owner every permission on it when it
    cannot be opened as it is (a job's 0o000 or 0o100 directory; root needs no such fix). Opened
    as O_PATH first so a chmod never goes through a link."""
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except PermissionError:
        pass
    ref = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        os.chmod(f"/proc/self/fd/{ref}", 0o700)
    finally:
        os.close(ref)
    return os.open(name, _DIR, dir_fd=parent)


def _writable(fd: int) -> None:
    """Let this process remove entries of a directory the job made read-only."""
    with suppress(OSError):
        mode = os.fstat(fd).st_mode
        if mode & 0o700 != 0o700:
            os.fchmod(fd, stat.S_IMODE(mode) | 0o700)


def _unlink(fd: int, name: str, problems: list[str], where: str) -> bool:
    try:
        os.unlink(name, dir_fd=fd)
        return True
    except FileNotFoundError:
        return True
    except PermissionError:
        _writable(fd)
    except OSError as e:
        problems.append(f"{where}/{name}: {e.strerror}")
        return False
    try:
        os.unlink(name, dir_fd=fd)
        return True
    except FileNotFoundError:
        return True
    except OSError as e:
        problems.append(f"{where}/{name}: {e.strerror}")
        return False


def _empty(parent: int, name: str, problems: list[str]) -> None:
    """Remove the directory ``name`` of ``parent`` and everything under it, without recursion
    and with one directory open at a time: depth costs a (device, inode) pair, not a stack frame
    or a descriptor. The way back up is "..", checked to be the directory come down from. Mount
    points and entries that cannot go are left, each said in ``problems``."""
    top = os.fstat(parent)
    fd = _open_dir(parent, name)
    _writable(fd)
    st = os.fstat(fd)
    dev = st.st_dev
    # Per level: (device, inode) of the directory, its name in its parent, what it could not remove.
    stack: list[tuple[tuple[int, int], str, set[str]]] = [((st.st_dev, st.st_ino), name, set())]
    depth_path: list[str] = [name]
    try:
        while stack:
            skip = stack[-1][2]
            where = "/".join(depth_path) if len(depth_path) < 8 else f"{depth_path[0]}/…/{depth_path[-1]}"
            child = None
            with os.scandir(fd) as it:
                for e in it:
                    if e.name in skip:
                        continue
                    try:
                        est = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    except OSError as err:
                        problems.append(f"{where}/{e.name}: {err.strerror}")
                        skip.add(e.name)
                        continue
                    if not stat.S_ISDIR(est.st_mode):
                        if not _unlink(fd, e.name, problems, where):
                            skip.add(e.name)
                        continue
                    if est.st_dev != dev:
                        problems.append(f"{where}/{e.name}: another filesystem is mounted there; not entered")
                        skip.add(e.name)
                        continue
                    child = e.name
                    break
            if child is not None:
                try:
                    sub = _open_dir(fd, child)
                except OSError as err:
                    problems.append(f"{where}/{child}: {err.strerror}")
                    skip.add(child)
                    continue
                _writable(sub)
                sst = os.fstat(sub)
                os.close(fd)
                fd = sub
                stack.append(((sst.st_dev, sst.st_ino), child, set()))
                depth_path.append(child)
                continue
            # Nothing more here (or only what could not go): up, and remove it.
            _, here, left = stack.pop()
            depth_path.pop()
            up = os.open("..", _DIR, dir_fd=fd)
            ust = os.fstat(up)
            expected = stack[-1][0] if stack else (top.st_dev, top.st_ino)
            os.close(fd)
            fd = up
            if (ust.st_dev, ust.st_ino) != expected:
                problems.append(f"{name}: its tree was moved while it was being removed; stopped")
                return
            if left:
                if stack:
                    stack[-1][2].add(here)
                continue
            try:
                os.rmdir(here, dir_fd=fd)
            except FileNotFoundError:
                pass
            except PermissionError:
                _writable(fd)
                try:
                    os.rmdir(here, dir_fd=fd)
                except OSError as err:
                    problems.append(f"{here}: {err.strerror}")
                    if stack:
                        stack[-1][2].add(here)
            except OSError as err:
                problems.append(f"{here}: {err.strerror}")
                if stack:
                    stack[-1][2].add(here)
    finally:
        os.close(fd)


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (this process's view): a job cannot mount, but what is
    mounted there is not the job's to remove, on whatever device it is (a bind mount shares its
    source's)."""
    top = os.path.abspath(path)
    found = []
    with suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 4:
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                if point == top or point.startswith(top + "/"):
                    found.append(point)
    return found


def _remove(path: Path) -> list[str]:
    """Remove ``path`` (a tree, a file, a link: never followed); what could not be removed."""
    mounted = _mounts_under(path)
    if mounted:
        return [f"{m}: a filesystem is mounted there" for m in mounted]
    problems: list[str] = []
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return problems
    except OSError as e:
        return [f"{path}: {e.strerror}"]
    try:
        parent = os.open(path.parent, _DIR)
    except OSError as e:
        return [f"{path.parent}: {e.strerror}"]
    try:
        if not stat.S_ISDIR(st.st_mode):
            _unlink(parent, path.name, problems, str(path.parent))
        else:
            _empty(parent, path.name, problems)
    except OSError as e:
        problems.append(f"{path}: {e.strerror or e}")
    finally:
        os.close(parent)
    if not problems and os.path.lexists(path):
        problems.append(f"{path}: still there")
    return problems


def remove(path: Path, quarantine: Path | None = None, what: str = "") -> Path | None:
    """Remove ``path`` whatever the job left in it: any depth, any file type, any modes; never
    raises. What cannot be removed (a mount point, a file the worker may not unlink) is moved,
    whole, to ``quarantine`` (a directory beside the jobs root, on its filesystem) and said in the
    worker's log naming ``what`` (the job, the worker it came from); returns where it went, None
    when it is gone (or could not even be moved: said in the log)."""
    try:
        problems = _remove(path)
    except Exception as e:  # the worker's own fault here must not stop its slot either
        problems = [f"{type(e).__name__}: {e}"]
    if not problems:
        return None
    said = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    if quarantine is None or not os.path.lexists(path):
        log.warning("REMOVAL of %s (%s) left things behind: %s", path, what or "no job named", said)
        return None
    try:
        quarantine.mkdir(mode=0o700, parents=True, exist_ok=True)
        dest = quarantine / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{path.parent.name}-{path.name}"
        os.rename(path, dest)
    except OSError as e:
        log.error("REMOVAL of %s (%s) failed (%s) and it cannot be quarantined in %s (%s): remove it by hand",
                  path, what or "no job named", said, quarantine, e.strerror or e)
        return None
    log.warning("QUARANTINED %s (%s) as %s: it could not be removed (%s); look at it, then remove it by hand",
                path, what or "no job named", dest, said)
    return dest
