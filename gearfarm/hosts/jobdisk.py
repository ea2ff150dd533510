"""The filesystem a worker slot's jobs write on, bounded: a job that writes until its disk is full
fills its own, never the one the farm's state (gearmand's queue, MinIO, the results database, the
worker's logs and spool) lives on.

A root worker makes, at its start, one sparse ext4 image of [farm] job_disk bytes in its owner
directory (``<work>/<owner>/disk.img``), loop-mounted nosuid,nodev at ``<owner>/disk``, and puts
each job's own directories there (its tree, $HOME, scratch; not a wine prefix, hard links to the
host's template, which stays on the state directory's filesystem); the worker's own files
of the job (its log, archives) stay beside, on the state directory's filesystem, where a full job
disk cannot fail them. One image per slot, not per job: mkfs + mount + umount of a fresh 8 GiB
image cost 60-75 ms (measured here: mkfs.ext4 28-42 ms, mount 20-26 ms, umount 11-17 ms), which
would be on every job's way; emptying it is the removal of the last job's directories, and when
that does not free it (a tree the removal cannot take, anything left), the image is made again:
emptying a job's disk cannot fail. Mounted with ``discard``, so what a job deletes, or the
emptying removes, is given back to the state directory's filesystem, not kept by the sparse file.

A worker that cannot mount (not root, no loop devices, no mkfs.ext4) says so in its log and
keeps its jobs' directories on the state directory's filesystem; [farm] min_free (workers/base.py)
still protects that filesystem.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from gearfarm.formats.words import size_text
from gearfarm.hosts import process

log = logging.getLogger(__name__)

MiB = 1024 * 1024
GiB = 1024 * MiB
# Used space past an empty disk's at which the disk is made again when a job ends (whatever it
# left goes at once, in one unmount and mkfs, which for a large tree also costs less than its
# removal), and at which a job's start first removes the last jobs' directories (left for later,
# process.tidy) rather than leave them for its first command: a job after one that filled its
# disk must find room to unpack its tree, and the state directory's filesystem its space back.
HEAVY = 64 * MiB
# The most of a job disk's writes the kernel may hold in memory before they reach its image (its
# loop device's max_bytes, strict): else the state directory's filesystem learns of a job's writes
# only at writeback, up to 30 s and gigabytes later (dirty_ratio of the host's memory), after
# min_free could have stopped it, and an unmount writes them all out even to an image being removed.
DIRTY_MAX = 32 * MiB
# A job's disk with less than this free (or 1/200 of it) after a command: the job reached its limit.
FULL_SLACK = MiB


class JobDisk:
    """One slot's job disk: ``job_dir`` gives each job a directory on it."""

    def __init__(self, owner: Path, size: int) -> None:
        self.owner, self.size = owner, size
        self.top = owner / "disk"
        self.image = owner / "disk.img"
        self.mounted = False
        self.empty = 0  # bytes used on the disk just made (ext4's own)
        self.base = 0  # its footprint then

    def open(self) -> JobDisk:
        """Make and mount the image; without it (said in the log), a plain directory."""
        self.top.mkdir(parents=True, exist_ok=True)
        os.chmod(self.top, 0o700)
        why = "the worker is not root" if os.geteuid() != 0 else self._make()
        if why:
            log.warning("jobs' directories are on the state directory's filesystem, not on a disk of their own: "
                        "cannot mount a %s job disk ([farm] job_disk) at %s: %s; [farm] min_free still keeps that "
                        "filesystem's free space", size_text(self.size), self.top, why)
        else:
            log.info("jobs' directories on a %s ext4 image at %s", size_text(self.size), self.top)
        return self

    def _make(self) -> str:
        """A fresh image, mounted: "" or why not."""
        self.image.unlink(missing_ok=True)
        try:
            fd = os.open(self.image, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, self.size)  # sparse: blocks are taken as the job writes
            finally:
                os.close(fd)
            # No journal (the disk is made again at each start: nothing on it survives a crash
            # anyway), no blocks reserved for root (the job's limit is the whole size).
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard", str(self.image)])
            _run(["mount", "-o", "loop,nosuid,nodev,noatime,discard", str(self.image), str(self.top)])
        except (OSError, subprocess.SubprocessError) as e:
            self.image.unlink(missing_ok=True)
            return str(e)
        self.mounted = True
        os.chmod(self.top, 0o700)
        _bound_dirty(self.top)
        with suppress(OSError):
            (self.top / "lost+found").rmdir()
        self.empty = self.used()
        self.base = self.footprint()
        return ""

    def _unmount(self) -> None:
        if not self.mounted:
            return
        _unbound_dirty(self.top)
        try:
            _run(["umount", str(self.top)])
        except (OSError, subprocess.SubprocessError) as e:
            # Something still holds it (the reaper kills every process of a job: it should not):
            # detached now, its loop device and blocks freed when the last holder lets go.
            log.warning("cannot unmount the job disk %s (%s): detaching it lazily", self.top, e)
            with suppress(OSError, subprocess.SubprocessError):
                _run(["umount", "-l", str(self.top)])
        self.mounted = False
        self.image.unlink(missing_ok=True)

    def remake(self) -> None:
        """The disk made again, empty (whatever the last jobs left on it)."""
        self._unmount()
        why = self._make()
        if why:
            log.error("cannot make the job disk %s again (%s): jobs' directories go on the state directory's "
                      "filesystem", self.top, why)

    def close(self) -> None:
        """The worker stops: the disk goes, and what is on it."""
        if not self.mounted:
            process.tidy()  # a plain directory's jobs' dirs left for later
        self._unmount()
        with suppress(OSError):
            self.top.rmdir()

    def free(self) -> int:
        st = os.statvfs(self.top)
        return st.f_bavail * st.f_frsize

    def used(self) -> int:
        st = os.statvfs(self.top)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def heavy(self) -> bool:
        """Whether the disk holds too much to leave for later (HEAVY, or full)."""
        return self.mounted and (self.used() - self.empty > HEAVY or self.full())

    def full(self) -> bool:
        """Whether the job disk has (next to) no room left: a job that failed now reached its limit."""
        return self.mounted and self.free() < max(FULL_SLACK, self.size // 200)

    def footprint(self) -> int:
        """What the jobs' directories take of the state directory's filesystem now: the image's
        blocks, or, on a plain directory, the sizes of its files."""
        if self.mounted:
            return os.stat(self.image).st_blocks * 512
        return tree_size(self.top)

    def written(self) -> int:
        """What the jobs wrote to the state directory's filesystem through this disk, or will
        have once the kernel writes back what it holds of it in memory."""
        used = self.used() - self.empty if self.mounted else 0
        return max(0, self.footprint() - self.base, used)

    def writes_most(self, floor: int) -> bool:
        """Whether this slot's jobs wrote more than ``floor`` to the state directory's filesystem,
        and no other live slot's job disk beside it holds more: the job to end when that
        filesystem runs short."""
        mine = self.written()
        if mine <= floor:
            return False
        for other in self.owner.parent.glob("*/disk.img"):
            if other != self.image and cost(other.parent) - self.base > mine:
                return False
        return True

    def limit_note(self) -> str:
        return (f"disk limit {size_text(self.size)} reached: the job filled its own disk (its $HOME, tree and "
                "scratch; [farm] job_disk)")

    @contextmanager
    def job_dir(self, prefix: str, later: bool = False) -> Iterator[Path]:
        """A fresh directory for one job on the disk, removed on exit, or with ``later`` when
        the next command starts or the worker is idle (process.job_dir's)."""
        self._ready()
        self.top.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.top))
        try:
            yield path
        finally:
            if self.heavy():
                # At once, whatever the job left (a full disk, gigabytes of the state directory's
                # filesystem held by the image): made again, which cannot fail as a removal can.
                self.remake()
            elif later:
                process.remove_later(path)
            else:
                process.remove(path)

    def _ready(self) -> None:
        """Room for the next job: the last jobs' directories removed if they hold much, or if
        anything else is there (what a removal could not take), and the disk made again if that
        did not empty it."""
        if not self.mounted:
            return
        waiting = {p.name for p in process.pending() if p.parent == self.top}
        if not self.heavy() and set(os.listdir(self.top)) <= waiting:
            return
        process.tidy()
        left = sorted(os.listdir(self.top))
        if self.heavy() or left:
            log.warning("the job disk %s still holds %d MiB (%s) after its jobs' directories were removed: made "
                        "again", self.top, (self.used() - self.empty) // MiB, ", ".join(left[:5]))
            self.remake()


def _bdi(top: Path) -> Path:
    dev = os.stat(top).st_dev
    return Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}")


def _bound_dirty(top: Path) -> None:
    """DIRTY_MAX on the loop device holding ``top`` (its backing device info), where the kernel
    has it (max_bytes: Linux 6.2); said in the log where not. The loop device is the host's and
    keeps the setting after it is detached: _unbound_dirty gives the kernel's defaults back."""
    bdi = _bdi(top)
    try:
        (bdi / "max_bytes").write_text(str(DIRTY_MAX))
        (bdi / "strict_limit").write_text("1")
    except OSError as e:
        log.warning("cannot bound the job disk %s's writes held in memory (%s): the state directory's free space "
                    "learns of a job's writes only at writeback", top, e)


def _unbound_dirty(top: Path) -> None:
    """The kernel's defaults back on the loop device holding ``top``, before it is unmounted."""
    with suppress(OSError):
        bdi = _bdi(top)
        (bdi / "strict_limit").write_text("0")
        (bdi / "max_ratio").write_text("100")


def tree_size(top: Path, limit: int = 200_000) -> int:
    """Bytes of the files under ``top`` (at most ``limit`` entries looked at), links not followed."""
    total = seen = 0
    for d, dirs, files in os.walk(top):
        for name in files + dirs:
            seen += 1
            with suppress(OSError):
                total += os.lstat(os.path.join(d, name)).st_blocks * 512
            if seen >= limit:
                return total
    return total


def release(owner: Path) -> None:
    """The disk of a worker that is gone (its owner directory about to be swept): unmounted and
    its image removed, so the sweep removes a plain directory."""
    top = owner / "disk"
    if os.path.ismount(top):
        _unbound_dirty(top)
        try:
            _run(["umount", str(top)])
        except (OSError, subprocess.SubprocessError):
            with suppress(OSError, subprocess.SubprocessError):
                _run(["umount", "-l", str(top)])
    (owner / "disk.img").unlink(missing_ok=True)


def cost(owner: Path) -> int:
    """What the job disk of the slot ``owner`` takes of the state directory's filesystem, or will:
    its image's blocks or, when more, the bytes used on it, which the kernel may hold in memory a
    while (up to its writeback's 30 s) before they reach the image."""
    try:
        blocks = os.stat(owner / "disk.img").st_blocks * 512
    except OSError:
        return 0
    top = owner / "disk"
    try:
        st = os.statvfs(top)
    except OSError:
        return blocks
    return max(blocks, (st.f_blocks - st.f_bfree) * st.f_frsize) if os.path.ismount(top) else blocks


def fs_free(path: Path, work: Path | None = None) -> int:
    """Free bytes of the filesystem holding ``path``, as an unprivileged writer sees them; with
    ``work`` (the job dirs' root on it), less what its slots' job disks are yet to write there."""
    free = shutil.disk_usage(path).free
    if work is not None and work.is_dir():
        for image in work.glob("*/disk.img"):
            with suppress(OSError):
                free -= max(0, cost(image.parent) - os.stat(image).st_blocks * 512)
    return free


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise subprocess.SubprocessError(f"{' '.join(argv[:2])} ... exited {done.returncode}: "
                                         f"{(done.stderr or done.stdout).strip()[-500:]}")


def sweep(root: Path) -> None:
    """Before process.sweep_work_dirs: the disks of the workers that are gone, released."""
    if root.is_dir():
        for owner in sorted(root.iterdir()):
            if process.owner_gone(owner.name) and not owner.is_symlink() and owner.is_dir():
                release(owner)
