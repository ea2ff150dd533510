"""What a job leaves, as the worker touches it (gearfarm.hosts.jobtree, issue #76 cases 1 and 2):
a FIFO, a socket, a link or a directory where a file is read is refused at once, naming it; a
file is read up to its cap; a tree 3,000 deep, with directories the job made unreadable,
unsearchable or read-only, is removed (by root and by the job's own uid) without touching what
its links point at; and what cannot be removed (a mount point) is quarantined beside the jobs
root, reported with its job, and never stops a sweep."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm.hosts import jobtree, process

DEPTH = 3000
NOBODY = 65534


def deep(top: Path, depth: int = DEPTH) -> None:
    """A chain of ``depth`` directories under ``top`` (longer than PATH_MAX: made by descriptors)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        with open(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("the bottom\n")
    finally:
        os.close(fd)


def unix_socket(at: Path) -> None:
    """A socket file at ``at`` (bound where its path fits in sun_path, then moved)."""
    short = Path(tempfile.mkdtemp(prefix="gf-"))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(short / "s"))
    sock.close()
    os.rename(short / "s", at)
    short.rmdir()


def hostile_tree(top: Path, outside: Path) -> None:
    """What a suite may leave in its $HOME: every kind of file, modes that lock a worker out, and
    links to files and directories of the worker's (which must survive)."""
    top.mkdir()
    (top / "deep").mkdir()
    deep(top / "deep")
    os.mkfifo(top / "fifo")
    unix_socket(top / "sock")
    (top / "link-to-file").symlink_to(outside / "keep.txt")
    (top / "link-to-dir").symlink_to(outside)
    for name, mode in (("readonly", 0o555), ("no-x", 0o600), ("none", 0o000), ("x-only", 0o100)):
        d = top / name
        d.mkdir()
        (d / "inner").mkdir()
        (d / "inner" / "f").write_text("x")
        (d / "f").write_text("x")
        d.chmod(mode)
    (top / "readonly-file").write_text("x")
    (top / "readonly-file").chmod(0o400)


@pytest.fixture(autouse=True)
def _removed(tmp_path: Path) -> Iterator[None]:
    """pytest's own cleanup of its temporary directories is shutil.rmtree: a deep tree left
    there would make it fail in every later pytest run of this user."""
    yield
    for p in tmp_path.iterdir():
        jobtree.remove(p)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    o = tmp_path / "outside"
    o.mkdir()
    (o / "keep.txt").write_text("keep me\n")
    return o


# -- opening a job's file -----------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_fifo_socket_link_or_directory_is_refused_at_once_naming_what_it_is(tmp_path: Path, outside: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    unix_socket(tmp_path / "sock")
    (tmp_path / "link").symlink_to(outside / "keep.txt")
    (tmp_path / "dir").mkdir()
    t0 = time.monotonic()
    said = {}
    for name in ("fifo", "sock", "link", "dir"):
        with pytest.raises(jobtree.NotAFile) as e:
            jobtree.read_capped(tmp_path / name, 1024)
        said[name] = e.value.strerror
    assert time.monotonic() - t0 < 5
    assert said["fifo"].startswith(f"{tmp_path / 'fifo'} is a FIFO, not a regular file")
    assert "is a socket" in said["sock"] and "is a symbolic link" in said["link"] and "is a directory" in said["dir"]
    # A FIFO with a writer waiting is not read either: nothing of it reaches the worker.
    with pytest.raises(jobtree.NotAFile):
        jobtree.copy_capped(tmp_path / "fifo", tmp_path / "copy", 1024)


def test_a_file_is_read_and_copied_up_to_its_cap_with_what_was_dropped(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"0123456789" * 300_000)
    data, dropped = jobtree.read_capped(big, 1000)
    assert (data, dropped) == (b"0123456789" * 100, 3_000_000 - 1000)
    got = jobtree.copy_capped(big, tmp_path / "copy", 1 << 20)
    assert (got.size, got.kept, got.dropped) == (3_000_000, 1 << 20, 3_000_000 - (1 << 20))
    assert (tmp_path / "copy").read_bytes() == big.read_bytes()[: 1 << 20]
    assert "bytes after its first 1 MiB were dropped (results capped at 1 MiB: [farm] result_limit)" in got.note(big)
    small = jobtree.copy_capped(tmp_path / "copy", tmp_path / "again", 2 << 20)
    assert small.dropped == 0 and (tmp_path / "again").read_bytes() == (tmp_path / "copy").read_bytes()


def test_walk_goes_3000_deep_without_recursion_and_never_through_a_link(tmp_path: Path, outside: Path) -> None:
    """Every directory a path can name (PATH_MAX, 4,096 bytes, about 2,000 levels here): what
    the walk's callers read by path. Python 3.11's os.walk raised RecursionError at 1,000."""
    deep(tmp_path)
    (tmp_path / "out").symlink_to(outside)
    seen = list(jobtree.walk(tmp_path))
    nameable = sum(1 for k in range(DEPTH + 1) if len(str(tmp_path) + "/d" * k) < 4096)
    assert 1000 < nameable < DEPTH
    assert len(seen) == nameable + 1  # and outside/
    assert seen[0] == (str(tmp_path), ["d", "outside"], ["out"])
    assert not any(top == str(tmp_path / "out") or top.startswith(f"{tmp_path}/out/") for top, _, _ in seen)


# -- removing a job's tree ----------------------------------------------------------------------


def test_shutil_rmtree_is_what_failed_on_a_3000_deep_tree(tmp_path: Path) -> None:
    """The cause, kept as a fact of this Python: rmtree recurses, and ignore_errors does not
    catch the RecursionError (what made every worker's start fail)."""
    (tmp_path / "t").mkdir()
    deep(tmp_path / "t")
    if sys.version_info < (3, 12):
        with pytest.raises(RecursionError):
            shutil.rmtree(tmp_path / "t", ignore_errors=True)


def test_a_3000_deep_hostile_tree_is_removed_and_what_its_links_name_is_kept(tmp_path: Path, outside: Path) -> None:
    top = tmp_path / "job"
    hostile_tree(top, outside)
    t0 = time.monotonic()
    assert jobtree.remove(top, tmp_path / "quarantine", "a test") is None
    seconds = time.monotonic() - t0
    assert not os.path.lexists(top) and not (tmp_path / "quarantine").exists()
    assert (outside / "keep.txt").read_text() == "keep me\n"
    assert seconds < 60, f"removal took {seconds:.1f}s"


def test_the_jobs_own_uid_removes_the_tree_it_locked_itself_out_of(outside: Path) -> None:
    """A worker that is not root runs jobs as its own uid: the modes the job set lock that uid
    out (0o000, 0o100, 0o555), which root's removal never notices. A child of this test drops to
    nobody, makes the tree and removes it, as such a worker would."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another uid")
    base = Path(tempfile.mkdtemp(prefix="gearfarm-jobtree-", dir="/tmp"))
    try:
        os.chown(base, NOBODY, NOBODY)
        pid = os.fork()
        if pid == 0:  # the child: nobody from here on; its answer is its exit status
            code = 1
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                hostile_tree(base / "job", outside)
                code = 0 if jobtree.remove(base / "job", base / "quarantine", "nobody's") is None else 2
                code = code or (3 if os.path.lexists(base / "job") else 0)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not os.path.lexists(base / "job") and not (base / "quarantine").exists()
        assert (outside / "keep.txt").read_text() == "keep me\n"
    finally:
        jobtree.remove(base)


@pytest.fixture
def mounted(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A tmpfs mounted inside a job dir (a job cannot mount; a host's admin or a bug might), and
    unmounted at the end wherever it went."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount")
    points: list[Path] = []

    def mount(at: Path) -> Path:
        at.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "gearfarm-test", str(at)], check=True)
        points.append(at)
        (at / "inside.txt").write_text("on the mount")
        return at

    yield mount
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        point = line.split()[4]
        if point.startswith(str(tmp_path) + "/"):
            subprocess.run(["umount", "-l", point], check=False)


def test_a_sweep_quarantines_what_it_cannot_remove_names_the_job_and_never_raises(
        tmp_path: Path, outside: Path, mounted, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "state" / "work"
    dead = root / "1-1-000000000000"  # an owner of another boot: gone
    job = dead / "testab12"
    job.mkdir(parents=True)
    (job / "test.log").write_text("gearfarm test-deep of hostile for linux-x86_64 at abc on host-test-7\n")
    hostile_tree(job / "scratch", outside)
    mounted(job / "scratch" / "mnt")
    other = dead / "buildcd34"
    other.mkdir()
    deep(other)
    caplog.set_level(logging.WARNING)
    removed = process.sweep_work_dirs(root)  # the old code raised RecursionError here
    assert removed == [dead] and not dead.exists()
    kept = list((tmp_path / "state" / "quarantine").iterdir())
    assert len(kept) == 1 and (kept[0] / "scratch" / "mnt" / "inside.txt").read_text() == "on the mount"
    said = [r.getMessage() for r in caplog.records if "QUARANTINED" in r.getMessage()]
    assert len(said) == 1 and "gearfarm test-deep of hostile for linux-x86_64" in said[0], said
    assert "a filesystem is mounted there" in said[0]
    # Moved whole, not emptied: nothing under a mount point is the job's to remove. Once the
    # mount is gone, the next sweep removes it all.
    assert {"mnt", "deep", "fifo", "none"} <= {p.name for p in (kept[0] / "scratch").iterdir()}
    subprocess.run(["umount", str(kept[0] / "scratch" / "mnt")], check=True)
    assert process.sweep_work_dirs(root) == [kept[0]] and not kept[0].exists()


def test_a_job_dir_left_for_later_is_removed_at_any_depth_and_tidy_never_raises(tmp_path: Path) -> None:
    with process.job_dir(tmp_path / "work", "test", later=True) as d:
        (d / "scratch").mkdir()
        deep(d / "scratch")
    assert process.untidy()
    process.tidy()  # the old code: RecursionError, and the next job on the slot was `infra`
    assert not d.exists()
    process.release_work_dir(tmp_path / "work")
