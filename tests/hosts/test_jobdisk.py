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
        bdi = jobdisk._bdi(disk.top)
        assert (bdi / "strict_limit").read_text().strip() == "1"
        assert abs(int((bdi / "max_bytes").read_text()) - jobdisk.DIRTY_MAX) < 4 * MiB
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
        # The old image's blocks go when the kernel lets go of its loop device, a moment after
        # the unmount (the detach is asynchronous).
        deadline = time.monotonic() + 30
        while (after := jobdisk.fs_free(state)) < free_before - 2 * MiB and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"dd wrote {written} bytes; state free {free_before} -> lowest {lowest} -> after {after}")
        assert 40 * MiB < written <= 64 * MiB
        assert free_before - lowest <= 66 * MiB  # the job's disk and no more
        assert abs(free_before - after) <= 2 * MiB
    finally:
        disk.close()
    assert not os.path.ismount(disk.top) and not image.exists() and loops_of(image) == []
    # The loop device it had is the host's again as it was: no bound on its writes held in memory.
    assert (bdi / "strict_limit").read_text().strip() == "0" and (bdi / "max_ratio").read_text().strip() == "100"


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


@root_only
def test_gearmands_queue_works_again_once_its_full_disk_has_room(tmp_path: Path) -> None:
    """gearmand's sqlite queue on a 16 MiB tmpfs, filled: submissions fail with QUEUE_ERROR, and
    go on failing once the space is back (gearmand 1.1.20 loses its transaction); heal() restarts
    it on the same port and queue, and the jobs it took before are still queued."""
    from gearfarm.gearman import BackgroundJob, Client, admin
    from gearfarm.gearman.errors import ServerError
    from gearfarm.hosts.gearmand import Gearmand

    top = tmp_path / "fs"
    top.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "gearfarm-test-queue", str(top)], check=True)
    try:
        with Gearmand(top / "gm", queue_db=top / "queue.db") as gm:
            client = Client([gm.address])

            def submit(tag: str) -> str:
                try:
                    client.submit_background_many([BackgroundJob("f", b"x" * 1000, tag)])
                    return "ok"
                except ServerError as e:
                    return e.code

            assert [submit(f"before-{i}") for i in range(3)] == ["ok"] * 3
            assert not gm.heal()
            fill = top / "fill"
            with fill.open("wb") as f, pytest.raises(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            assert submit("full") == "QUEUE_ERROR"
            fill.unlink()
            # The space is back, and gearmand still refuses: what a restart alone mends.
            assert submit("after") == "QUEUE_ERROR"
            port = gm.address
            assert gm.heal() and gm.address == port
            client = Client([gm.address])
            assert [submit(f"healed-{i}") for i in range(3)] == ["ok"] * 3
            # The three before and the three after; and the one refused once the space was back,
            # which gearmand wrote outside its lost transaction (the same unique id sent again joins it).
            assert admin.status(*gm.address)["f"].queued == 7
            assert not gm.heal()
            client.close()
    finally:
        subprocess.run(["umount", "-l", str(top)])


@root_only
def test_what_no_removal_can_take_goes_with_the_disk_made_again(state: Path) -> None:
    """An immutable file (chattr +i: root's removal fails on it too) left in a job's dir: the
    next job finds its disk empty, the disk made again."""
    disk = jobdisk.JobDisk(process.owner_dir(state / "work"), 64 * MiB).open()
    try:
        with disk.job_dir("test", later=True) as job:
            stuck = job / "stuck"
            stuck.write_bytes(b"x")
            subprocess.run(["chattr", "+i", str(stuck)], check=True)
        process.tidy()  # the removal, which leaves it (and quarantines nothing across filesystems)
        assert stuck.exists()
        with disk.job_dir("test", later=True) as second:
            assert os.listdir(disk.top) == [second.name] and not stuck.exists()
    finally:
        disk.close()
    assert not os.path.ismount(disk.top)
