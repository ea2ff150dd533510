"""A slot's job disk (gearfarm/hosts/jobdisk.py) on this machine's real loop devices: a job
writing without end stops at the disk's size, the state directory's filesystem gives nothing,
the disk is made again empty, and nothing (mount, loop device, image) outlives the slot. Each
test mounts only under its own temporary directory and unmounts what it mounted."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm.hosts import jobdisk, process

MiB = 1024 * 1024
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts need root")


def loops_of(image: Path) -> list[str]:
    """The loop devices backed by ``image`` (losetup -j)."""
    out = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout
    return [line.split(":")[0] for line in out.splitlines() if line.strip()]


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """A state directory on a 256 MiB tmpfs of the test's own: its free space is the job disk's
    and nobody else's."""
    top = tmp_path / "state"
    top.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "gearfarm-test-state", str(top)], check=True)
    try:
        yield top
    finally:
        for line in reversed(Path("/proc/self/mounts").read_text().splitlines()):
            point = line.split()[1]
            if point.startswith(str(top)):
                subprocess.run(["umount", "-l", point])


@root_only
def test_a_job_writing_without_end_stops_at_its_disk_and_the_state_filesystem_keeps_its_space(state: Path) -> None:
    work = state / "work"
    disk = jobdisk.JobDisk(process.owner_dir(work), 64 * MiB).open()
    image = disk.image
    try:
        assert disk.mounted and os.path.ismount(disk.top)
        free_before = jobdisk.fs_free(state)
        with disk.job_dir("test", later=True) as job:
            # As the job would: dd until the disk says no.
            dd = subprocess.run(["dd", "if=/dev/zero", f"of={job / 'fill'}", "bs=1M", "count=1024"],
                                capture_output=True, text=True)
            assert dd.returncode != 0 and "No space left on device" in dd.stderr
            written = (job / "fill").stat().st_size
            lowest = jobdisk.fs_free(state)
            assert disk.full()
            assert "disk limit 64 MiB reached" in disk.limit_note()
        # The disk was made again at once: empty, and the image's blocks given back.
        assert not disk.full() and not job.exists() and os.path.ismount(disk.top)
        after = jobdisk.fs_free(state)
        print(f"dd wrote {written} bytes; state free {free_before} -> lowest {lowest} -> after {after}")
        assert 40 * MiB < written <= 64 * MiB
        assert free_before - lowest <= 66 * MiB  # the job's disk and no more
        assert abs(free_before - after) <= 2 * MiB
    finally:
        disk.close()
    assert not os.path.ismount(disk.top) and not image.exists() and loops_of(image) == []


@root_only
def test_a_dead_slots_disk_is_released_by_the_next_start(state: Path) -> None:
    work = state / "work"
    dead = work / f"1-1-{process.boot_id()[:12]}"  # pid 1 never started at tick 1: a gone owner
    disk = jobdisk.JobDisk(dead, 32 * MiB).open()
    assert disk.mounted
    (disk.top / "left").write_bytes(b"x" * MiB)
    jobdisk.sweep(work)
    assert not os.path.ismount(dead / "disk") and not (dead / "disk.img").exists()
    assert process.sweep_work_dirs(work) == [dead]
    assert loops_of(disk.image) == []


def test_a_worker_that_cannot_mount_says_so_and_uses_a_plain_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no mkfs.ext4, no mount
    disk = jobdisk.JobDisk(process.owner_dir(tmp_path / "work"), 64 * MiB).open()
    try:
        assert not disk.mounted and disk.top.is_dir()
        assert "cannot mount a 64 MiB job disk" in caplog.text and "min_free" in caplog.text
        with disk.job_dir("test") as job:
            (job / "f").write_bytes(b"x" * 4096)
            assert disk.written() >= 4096 and not disk.full()
        assert not job.exists()
    finally:
        disk.close()


@root_only
def test_mount_costs(tmp_path: Path) -> None:
    """What a slot's disk costs (printed for docs/security.md): made and mounted once per slot."""
    times = []
    for _ in range(3):
        disk = jobdisk.JobDisk(tmp_path / f"o{len(times)}", 8 * 1024 * MiB)
        t0 = time.monotonic()
        disk.open()
        t1 = time.monotonic()
        disk.close()
        times.append((t1 - t0, time.monotonic() - t1))
        assert not disk.image.exists()
    print("open (truncate, mkfs, mount), close (umount):", [(round(a * 1000), round(b * 1000)) for a, b in times], "ms")
    assert all(a < 30 and b < 30 for a, b in times)
