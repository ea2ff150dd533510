"""A job cannot fill the disk the farm lives on (issue #76, case 5, and case 6's /tmp and $HOME).
Real gearmand, MinIO, workers and collector of an embedded farm whose state directory is on a
filesystem of the test's own (a loop-mounted ext4 image it makes, unmounts and removes), so that
its free space, sampled through the night, is the farm's and its jobs' alone.

* A hog project's suites write 1 GiB into $HOME and 512 MiB into /tmp, with [farm] job_disk and
  job_tmp_size at 64 MiB: each stops at 64 MiB, fails naming its limit, and the state directory's
  free space falls by no more than the job disk; an innocent project's jobs pass the same night
  and the next one, on the same worker slots, none restarted.
* On a state filesystem of 640 MiB with [farm] min_free at 320 MiB and the default 8 GiB job
  disk, a suite writing without end is stopped once the free space falls below min_free and
  fails naming it and what it wrote; the innocent project passes, and the farm (collector,
  results database, MinIO) works on: the next night passes too.

Before the change (on main), the first: the hog's suites wrote the full 1 GiB and 512 MiB, the
/tmp suite passed, the state filesystem lost its free space to the $HOME suite; the second: the
suite filled the state filesystem."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gearfarm import config as config_mod
from gearfarm.config import EmbeddedSettings, ProjectConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import commit, gearfarm
from tests.projects import _init

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test mounts the farm's state filesystem: root only")

MiB = 1024 * 1024
T = "linux-x86_64"

HOG = """schema = 2

[build]
argv = ["sh", "-c", "echo built > built.txt"]
outputs = ["built.txt", "hog.sh"]
timeout = 120

[suites.home]
argv = ["sh", "{root}/hog.sh", "home"]
format = "exit-code"
timeout = 300

[suites.tmp]
argv = ["sh", "{root}/hog.sh", "tmp"]
format = "exit-code"
timeout = 300

[suites.slow]
argv = ["sh", "{root}/hog.sh", "slow"]
format = "exit-code"
timeout = 300

[targets.linux-x86_64]
tools = ["sh", "dd"]
suites = SUITES
"""
# home: 1 GiB at once into $HOME; tmp: 512 MiB into /tmp; slow: 16 MiB every 0.2 s into $HOME
# until the disk says no (a suite writing at a pace the farm's watch sees between two samples).
HOG_SH = """case "$1" in
home) dd if=/dev/zero of="$HOME/fill" bs=1M count=1024 ;;
tmp) dd if=/dev/zero of=/tmp/fill bs=1M count=512 ;;
slow) i=0; while dd if=/dev/zero of="$HOME/fill$i" bs=1M count=16 2>/dev/null; do i=$((i+1)); sleep 0.2; done
      echo "wrote $i x 16 MiB"; exit 1 ;;
esac
"""
INNOCENT = """schema = 2

[build]
argv = ["sh", "-c", "echo built > built.txt && head -c 8M /dev/zero > $HOME/own"]
outputs = ["built.txt"]
timeout = 120

[suites.calm]
argv = ["sh", "-c", "head -c 8M /dev/zero > $HOME/own && head -c 4M /dev/zero > /tmp/own"]
format = "exit-code"
timeout = 300

[targets.linux-x86_64]
tools = ["sh"]
suites = ["calm"]
"""


class StateDisk:
    """An ext4 image of ``size`` bytes, loop-mounted at ``top``: the farm's state directory."""

    def __init__(self, base: Path, size: int) -> None:
        self.image, self.top = base / "state.img", base / "state"
        self.top.mkdir()
        with self.image.open("wb") as f:
            f.truncate(size)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(self.image), str(self.top)], check=True)

    def free(self) -> int:
        st = os.statvfs(self.top)
        return st.f_bavail * st.f_frsize

    def close(self) -> None:
        # The farm's job disks inside it first (a worker killed mid-job leaves its own mounted).
        for line in reversed(Path("/proc/self/mounts").read_text().splitlines()):
            point = line.split()[1]
            if point.startswith(str(self.top) + "/"):
                subprocess.run(["umount", "-l", point])
        gc.collect()  # the farm's start registered its key through a database engine of this process
        for _ in range(100):  # the farm's last processes may take a moment to let go of it
            if subprocess.run(["umount", str(self.top)]).returncode == 0:
                break
            time.sleep(0.3)
        else:
            subprocess.run(["umount", "-l", str(self.top)], check=True)
        self.image.unlink()
        assert loops(self.image) == []


def loops(image: Path) -> list[str]:
    out = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout
    return [line.split(":")[0] for line in out.splitlines() if line.strip()]


class Lowest(threading.Thread):
    """The lowest free space of a filesystem while it runs, sampled every 20 ms."""

    def __init__(self, disk: StateDisk) -> None:
        super().__init__(daemon=True)
        self.disk, self.lowest, self.done = disk, disk.free(), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.lowest = min(self.lowest, self.disk.free())

    def __enter__(self) -> Lowest:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.join()


def nights(base: Path, state_size: int, settings: EmbeddedSettings, suites: str, n: int) -> dict[str, Any]:
    """``n`` nights of the hog and the innocent project on one embedded farm whose state is on a
    StateDisk of ``state_size``: each night's nightly, its lowest free space, and the farm's
    worker pids before and after."""
    hog, innocent = base / "hog", base / "innocent"
    for repo, files in ((hog, {"jobs/catalog.toml": HOG.replace("SUITES", suites), "hog.sh": HOG_SH}),
                        (innocent, {"jobs/catalog.toml": INNOCENT})):
        repo.mkdir()
        _init(repo, files)
    (base / "no-repo").mkdir()
    disk = StateDisk(base, state_size)
    out: dict[str, Any] = {"nights": []}
    try:
        farm = EmbeddedFarm(disk.top / "farm", base / "no-repo", slots=2, settings=settings,
                            projects=[ProjectConfig(name="hog", repo=str(hog)),
                                      ProjectConfig(name="innocent", repo=str(innocent))])
        try:
            farm.start([catalog_mod.parse(HOG.replace("SUITES", suites), "hog"),
                        catalog_mod.parse(INNOCENT, "innocent")])
            pids = {name: p.pid for name, p in farm.procs.items()}  # type: ignore[attr-defined]
            out["free_start"] = disk.free()
            for i in range(n):
                if i:
                    commit_innocent(innocent, i)
                with Lowest(disk) as low:
                    p = gearfarm("nightly", "--config", str(farm.config_path), "--benchmarks", "none", timeout=1200)
                # The last job dirs go when their worker is idle, and a job disk made again gives
                # its old image's blocks back once the kernel lets go of its loop device: soon.
                deadline = time.monotonic() + 60
                while disk.free() < out["free_start"] - 48 * MiB and time.monotonic() < deadline:
                    time.sleep(0.5)
                out["nights"].append({"p": p, "lowest": low.lowest, "free_after": disk.free()})
            out["pids_same"] = pids == {name: p.pid for name, p in farm.procs.items()}  # type: ignore[attr-defined]
            out["restarts"] = dict(farm.restarts)
            # Each night's run of each project (not the re-runs of its new failures), oldest first,
            # its jobs and logs read now: the state filesystem goes with the test's fixture.
            runs = sorted((d for d in (disk.top / "farm" / "runs").iterdir()
                           if d.is_dir() and not d.name.endswith(".rerun")), key=lambda d: d.name)
            out["runs"] = [d.name for d in runs]
            db = ResultsDB(config_mod.load(farm.config_path).database.url)
            out["jobs"] = {run: {r.step: r for r in db.jobs(run)} for run in out["runs"]}
            db.engine.dispose()
            out["logs"] = {(d.name, log.parent.name): log.read_text(errors="replace")
                           for d in runs for log in d.glob(f"logs/{T}/*/log.txt")}
        finally:
            farm.stop()
    finally:
        disk.close()
    return out


def commit_innocent(repo: Path, i: int) -> None:
    (repo / "night.txt").write_text(f"{i}\n")
    subprocess.run(["git", "add", "night.txt"], cwd=repo, check=True)
    commit(repo, f"night {i}")


def wrote(log: str) -> int:
    """Bytes dd says it copied."""
    m = re.search(r"(\d+) bytes .* copied", log)
    assert m, log[-2000:]
    return int(m.group(1))


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("disk-bounded")
    settings = EmbeddedSettings(job_disk=64 * MiB, job_tmp_size=64 * MiB, min_free=64 * MiB)  # type: ignore[arg-type]
    yield nights(base, 1536 * MiB, settings, '["home", "tmp"]', 2)


def test_dd_into_home_and_tmp_stops_at_the_jobs_limits_and_fails_naming_them(bounded: dict[str, Any]) -> None:
    first, second = bounded["nights"]
    assert first["p"].returncode == 1, first["p"].stdout[-3000:] + first["p"].stderr[-3000:]
    hog_runs = [run for run in bounded["runs"] if "-hog-" in run]
    assert hog_runs, bounded["runs"]
    hog = bounded["jobs"][hog_runs[0]]
    home, tmp = hog["test-home"], hog["test-tmp"]
    assert home.status == "failed" and "disk limit 64 MiB reached" in home.message, home.message
    assert tmp.status == "failed" and "64 MiB ([farm] job_tmp_size)" in tmp.message, tmp.message
    home_wrote = wrote(bounded["logs"][(hog_runs[0], "test-home")])
    tmp_wrote = wrote(bounded["logs"][(hog_runs[0], "test-tmp")])
    print(f"dd wrote {home_wrote} bytes into $HOME, {tmp_wrote} into /tmp; state free at start "
          f"{bounded['free_start']}, lowest {first['lowest']}, after {first['free_after']}")
    assert home_wrote <= 64 * MiB and tmp_wrote <= 64 * MiB


def test_the_state_filesystem_lost_no_more_than_the_job_disk(bounded: dict[str, Any]) -> None:
    first, second = bounded["nights"]
    start = bounded["free_start"]
    # The hog's $HOME on its 64 MiB disk (made again at once after), the innocent's 8 MiB, and
    # the farm's own writes (logs, records, reports, MinIO's objects): well under the 1 GiB tried.
    assert start - first["lowest"] < 160 * MiB, (start, first["lowest"])
    assert start - second["lowest"] < 160 * MiB, (start, second["lowest"])
    # Given back after each night: only what the farm keeps (reports, logs, the database) stays.
    assert start - second["free_after"] < 48 * MiB, (start, second["free_after"])


def test_the_innocent_project_passes_both_nights_on_the_same_slots(bounded: dict[str, Any]) -> None:
    innocent = [run for run in bounded["runs"] if "-innocent-" in run]
    assert len(innocent) == 2, bounded["runs"]
    for run in innocent:
        got = {step: (r.status, r.message) for step, r in bounded["jobs"][run].items()}
        assert got == {"build": ("passed", ""), "test-calm": ("passed", "")}, got
    assert bounded["pids_same"] and bounded["restarts"] == {}


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("disk-short")
    settings = EmbeddedSettings(min_free=320 * MiB)  # type: ignore[arg-type]
    yield nights(base, 640 * MiB, settings, '["slow"]', 2)


def test_a_job_filling_the_state_filesystem_is_ended_below_min_free_and_named(short: dict[str, Any]) -> None:
    first, second = short["nights"]
    hog_run = next(run for run in short["runs"] if "-hog-" in run)
    slow = short["jobs"][hog_run]["test-slow"]
    print(f"state free at start {short['free_start']}, lowest {first['lowest']}, after {first['free_after']}; "
          f"{slow.message}")
    assert slow.status == "failed", (slow.status, slow.message)
    assert "fell below [farm] min_free (320 MiB) while this job ran: it wrote" in slow.message
    # Its log is kept, and says it too, at its end.
    log = short["logs"][(hog_run, "test-slow")]
    assert log.rstrip().endswith("***") and "fell below [farm] min_free" in log.splitlines()[-1], log[-500:]
    # Ended within a second of crossing min_free: the farm kept its room. (What the kernel held
    # in memory of the job's writes once reached the state filesystem only after: it filled.)
    assert first["lowest"] > 160 * MiB, first["lowest"]
    assert first["free_after"] > 400 * MiB


def test_the_farm_works_on_after_a_job_was_ended_for_min_free(short: dict[str, Any]) -> None:
    innocent = [run for run in short["runs"] if "-innocent-" in run]
    assert len(innocent) == 2, short["runs"]
    for run in innocent:
        got = {step: r.status for step, r in short["jobs"][run].items()}
        assert got == {"build": "passed", "test-calm": "passed"}, got
    for night in short["nights"]:
        assert night["p"].returncode == 1, night["p"].stdout[-3000:] + night["p"].stderr[-3000:]
    assert short["pids_same"] and short["restarts"] == {}
