"""The order a worker slot takes queued jobs in: longest remaining path first, from what this
host measured, with emulated suites counted slow until measured."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from gearfarm.catalog import Target
from gearfarm.priority import Durations, order

TARGETS = {
    "linux-x86_64": Target(name="linux-x86_64", suites=["unit", "model"]),
    "linux-aarch64": Target(name="linux-aarch64", runner=["qemu-aarch64"], suites=["unit", "model"]),
    "windows-x86_64": Target(name="windows-x86_64", runner=["wine"], suites=["unit"]),
}
PAIRS = [(r, t) for r in ("build", "test") for t in TARGETS]


def test_unmeasured_emulated_targets_go_first() -> None:
    got = order(PAIRS, TARGETS, {})
    # aarch64: a build then two emulated suites; Windows: one; the native target last.
    assert got[:2] == [("build", "linux-aarch64"), ("build", "windows-x86_64")]
    assert got.index(("test", "linux-aarch64")) < got.index(("test", "linux-x86_64"))
    assert got[-1] == ("test", "linux-x86_64")


def test_measured_durations_decide() -> None:
    # This host found the native suites slow (say, a big integration suite) and qemu quick.
    seen = {"build:linux-x86_64": 5.0, "test:linux-x86_64": 40.0, "build:linux-aarch64": 5.0,
            "test:linux-aarch64": 2.0, "build:windows-x86_64": 5.0, "test:windows-x86_64": 2.0}
    got = order(PAIRS, TARGETS, seen)
    assert got[:2] == [("build", "linux-x86_64"), ("test", "linux-x86_64")]


def _record(path: str, seconds: float) -> None:
    for _ in range(20):
        Durations(Path(path)).record("test:linux-x86_64", seconds)


def test_durations_are_a_running_average_shared_by_the_slots(tmp_path: Path) -> None:
    d = Durations(tmp_path / "durations" / "host.json")
    assert d.load() == {}
    d.record("build:linux-x86_64", 10.0)
    d.record("build:linux-x86_64", 20.0)
    assert d.load() == {"build:linux-x86_64": 15.0}
    # Several slot processes write at once: the file stays whole and holds both functions.
    procs = [multiprocessing.Process(target=_record, args=(str(d.path), s)) for s in (1.0, 3.0)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    got = d.load()
    assert set(got) == {"build:linux-x86_64", "test:linux-x86_64"}
    assert 1.0 <= got["test:linux-x86_64"] <= 3.0


def test_an_unreadable_file_means_unmeasured_and_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text("{ torn")
    d = Durations(path)
    assert d.load() == {}
    d.record("test:windows-x86_64", 7.5)
    assert d.load() == {"test:windows-x86_64": 7.5}
