"""The host lock (gearfarm/hosts/hostlock.py) between real processes: a benchmark waits for running
builds and tests, new ones wait for the benchmark (it is not starved by a stream of them), a
killed holder frees the host, and the benchmark counts who else is running from what is
actually registered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gearfarm.hosts.host import Activity
from gearfarm.hosts.hostlock import HostLock

ROOT = Path(__file__).resolve().parents[2]  # the repository: the holders import gearfarm from it

HOLDER = """
import sys, time
from pathlib import Path
from gearfarm.hosts.hostlock import HostLock
mode, what, hold, log = sys.argv[1], sys.argv[2], float(sys.argv[3]), Path(sys.argv[4])
lock = HostLock(Path(sys.argv[5]))
with (lock.shared if mode == "shared" else lock.exclusive)(what) as waited:
    with log.open("a") as f:
        f.write(f"{what} start {time.time():.3f}\\n")
    time.sleep(hold)
    with log.open("a") as f:
        f.write(f"{what} end {time.time():.3f}\\n")
"""


def spawn(tmp_path: Path, mode: str, what: str, hold: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", HOLDER, mode, what, str(hold), str(tmp_path / "log"),
                             str(tmp_path / "lock")], cwd=ROOT)


def events(tmp_path: Path) -> dict[str, float]:
    out = {}
    for line in (tmp_path / "log").read_text().splitlines():
        what, ev, t = line.split()
        out[f"{what} {ev}"] = float(t)
    return out


def wait_for(pred, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    end = time.time() + timeout
    while not pred():
        assert time.time() < end, "timed out"
        time.sleep(0.02)


def started(tmp_path: Path, what: str) -> bool:
    log = tmp_path / "log"
    return log.exists() and f"{what} start" in log.read_text()


def test_a_benchmark_waits_for_running_builds_and_new_builds_wait_for_it(tmp_path: Path) -> None:
    build = spawn(tmp_path, "shared", "build1", 1.5)
    wait_for(lambda: started(tmp_path, "build1"))
    perf = spawn(tmp_path, "exclusive", "perf", 1.0)
    time.sleep(0.3)  # the benchmark is now waiting at the lock, holding the gate
    test = spawn(tmp_path, "shared", "test1", 0.2)
    for p in (build, perf, test):
        assert p.wait(30) == 0
    ev = events(tmp_path)
    # The benchmark started only when the running build had ended ...
    assert ev["perf start"] >= ev["build1 end"]
    # ... and the test that came while it waited ran after it, not beside it.
    assert ev["test1 start"] >= ev["perf end"]


def test_builds_and_tests_share_the_host_with_each_other(tmp_path: Path) -> None:
    a = spawn(tmp_path, "shared", "a", 1.0)
    b = spawn(tmp_path, "shared", "b", 1.0)
    assert a.wait(30) == 0 and b.wait(30) == 0
    ev = events(tmp_path)
    assert ev["b start"] < ev["a end"] and ev["a start"] < ev["b end"]


def test_a_killed_holder_frees_the_host_and_is_not_counted(tmp_path: Path) -> None:
    lock = HostLock(tmp_path / "lock")
    build = spawn(tmp_path, "shared", "killed-build", 60)
    wait_for(lambda: started(tmp_path, "killed-build"))
    assert lock.others() == ["killed-build"]
    os.kill(build.pid, signal.SIGKILL)
    build.wait()
    t0 = time.monotonic()
    with lock.exclusive("perf") as waited:
        assert lock.others() == []
    assert waited < 5 and time.monotonic() - t0 < 5


def test_activity_counts_the_farm_jobs_running_while_it_measures(tmp_path: Path) -> None:
    lock = HostLock(tmp_path / "lock")
    with Activity(lock.others, interval=0.1) as quiet:
        time.sleep(0.3)
    assert quiet.summary["other_jobs_max"] == 0
    other = spawn(tmp_path, "shared", "busy-test", 60)
    try:
        wait_for(lambda: started(tmp_path, "busy-test"))
        with Activity(lock.others, interval=0.1) as busy:
            time.sleep(0.3)
    finally:
        other.kill()
        other.wait()
    assert busy.summary["other_jobs_max"] == 1
    for key in ("load_max", "seconds", "samples"):
        assert busy.summary[key] >= 0
    if Path("/proc/stat").exists():
        assert "other_cpu_cores" in busy.summary


@pytest.mark.parametrize("mode", ["shared", "exclusive"])
def test_the_lock_directory_is_usable_by_every_user(tmp_path: Path, mode: str) -> None:
    lock = HostLock(tmp_path / "lock")
    with getattr(lock, mode)("x"):
        pass
    assert (tmp_path / "lock" / "gate").stat().st_mode & 0o666 == 0o666


HOLDER_PATIENT = HOLDER.replace("lock.exclusive)(what)", "lock.exclusive)(what, *map(float, sys.argv[6:]))")


def test_a_patient_benchmark_lets_builds_go_first_then_takes_the_host(tmp_path: Path) -> None:
    """With patience, builds and tests that arrive while the benchmark waits run beside the
    running ones (no core idles); the benchmark starts once none runs, and runs alone."""
    def spawn_patient(what: str, hold: float, patience: float) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", HOLDER_PATIENT, "exclusive", what, str(hold),
                                 str(tmp_path / "log"), str(tmp_path / "lock"), str(patience)],
                                cwd=ROOT)

    build = spawn(tmp_path, "shared", "build1", 1.0)
    wait_for(lambda: started(tmp_path, "build1"))
    perf = spawn_patient("perf", 0.5, 30.0)
    time.sleep(0.3)  # the benchmark is waiting, patiently
    test = spawn(tmp_path, "shared", "test1", 1.2)
    for p in (build, perf, test):
        assert p.wait(30) == 0
    ev = events(tmp_path)
    assert ev["test1 start"] < ev["build1 end"], "the test should have run beside the build"
    assert ev["perf start"] >= max(ev["build1 end"], ev["test1 end"]), "the benchmark must run alone"


def test_patience_runs_out_and_the_benchmark_goes_before_new_work(tmp_path: Path) -> None:
    """A stream of builds cannot starve a patient benchmark: once its patience is spent, new
    builds wait for it as without patience."""
    build = spawn(tmp_path, "shared", "build1", 1.5)
    wait_for(lambda: started(tmp_path, "build1"))
    perf = subprocess.Popen([sys.executable, "-c", HOLDER_PATIENT, "exclusive", "perf", "0.5",
                             str(tmp_path / "log"), str(tmp_path / "lock"), "0.5"], cwd=ROOT)
    time.sleep(0.9)  # patience spent: the benchmark now holds the gate
    test = spawn(tmp_path, "shared", "test1", 0.2)
    for p in (build, perf, test):
        assert p.wait(30) == 0
    ev = events(tmp_path)
    assert ev["perf start"] >= ev["build1 end"]
    assert ev["test1 start"] >= ev["perf end"]
