"""The order a worker slot takes queued jobs in: longest remaining path first, from what this
host measured (per function and per suite), with emulated suites counted slow until measured; a
build queues its target's suites longest first, and a real one-slot farm runs them so."""

from __future__ import annotations

import multiprocessing
import subprocess
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import Target
from gearfarm.run import priority
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.run.priority import Durations, Preference, longest_first, order
from tests.farmkit import GIT, commit, gearfarm

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
    # A job's step is averaged beside its function, in the same write.
    d.record("build:linux-x86_64", 30.0, "build")
    assert d.load() == {"build:linux-x86_64": 22.5, "build:linux-x86_64/build": 30.0}
    # Several slot processes write at once: the file stays whole and holds both functions.
    procs = [multiprocessing.Process(target=_record, args=(str(d.path), s)) for s in (1.0, 3.0)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    got = d.load()
    assert set(got) == {"build:linux-x86_64", "build:linux-x86_64/build", "test:linux-x86_64"}
    assert 1.0 <= got["test:linux-x86_64"] <= 3.0


def test_an_unreadable_file_means_unmeasured_and_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text("{ torn")
    d = Durations(path)
    assert d.load() == {}
    d.record("test:windows-x86_64", 7.5)
    assert d.load() == {"test:windows-x86_64": 7.5}


def test_a_targets_suites_are_queued_longest_first() -> None:
    d = {"test:w/test-model": 12.0, "test:w/test-unit": 1.7}
    assert longest_first(["test-unit", "test-model", "test-recovery"], "test:w", d) == \
        ["test-model", "test-unit", "test-recovery"]
    assert longest_first(["test-unit", "test-model"], "test:w", {}) == ["test-unit", "test-model"]


def test_a_measured_long_suite_puts_its_target_first() -> None:
    # Two suites each; aarch64's average is the larger, but Windows holds the longest suite.
    seen = {"build:linux-aarch64": 2.8, "build:windows-x86_64": 2.0, "build:linux-x86_64": 1.7,
            "test:linux-aarch64/test-unit": 1.2, "test:linux-aarch64/test-model": 8.1,
            "test:windows-x86_64/test-unit": 1.7, "test:linux-x86_64/test-model": 3.4}
    targets = {**TARGETS, "windows-x86_64": Target(name="windows-x86_64", runner=["wine"], suites=["unit", "model"])}
    seen["test:windows-x86_64/test-model"] = 12.3
    got = order(PAIRS, targets, seen)
    assert got[:3] == [("build", "windows-x86_64"), ("test", "windows-x86_64"), ("build", "linux-aarch64")]


def test_a_slot_takes_next_from_the_queue_whose_next_suite_is_longest() -> None:
    """Every slot has the same static order (Windows first here); before each job it takes from
    the function whose next job is longest, as the counts waiting say."""
    targets = {"linux-x86_64": Target(name="linux-x86_64", suites=["unit", "model", "recovery"]),
               "windows-x86_64": Target(name="windows-x86_64", runner=["wine"], suites=["unit", "model"])}
    seen = {"build:linux-x86_64": 2.0, "build:windows-x86_64": 3.0,
            "test:linux-x86_64/test-unit": 1.0, "test:linux-x86_64/test-model": 9.0,
            "test:linux-x86_64/test-recovery": 4.0,
            "test:windows-x86_64/test-unit": 2.0, "test:windows-x86_64/test-model": 12.0}
    pairs = [(r, t) for r in ("build", "test") for t in targets]
    prefer = Preference(pairs, targets, seen)
    assert order(pairs, targets, seen)[:2] == [("build", "windows-x86_64"), ("test", "windows-x86_64")]
    lin, win = "test:linux-x86_64", "test:windows-x86_64"
    # All of both queued: Windows' model (12 s) goes first.
    assert prefer({lin: 3, win: 2}) == win
    # One Windows suite left (its unit, 2 s): Linux's model (9 s) is longer.
    assert prefer({lin: 3, win: 1}) == lin
    # Linux down to its unit (1 s): Windows' unit.
    assert prefer({lin: 1, win: 1}) == win
    # A build holds up its suites: it goes before a 9 s suite (3 + 12 s path).
    assert prefer({lin: 3, "build:windows-x86_64": 1}) == "build:windows-x86_64"
    # More waiting than the target has suites (two projects): its longest is next.
    assert prefer({lin: 7, win: 1}) == lin
    # Nothing waiting, or only functions the slot does not serve: the registered order stands.
    assert prefer({lin: 0, win: 0}) is None and prefer({"test:other": 4}) is None


def test_a_running_slot_learns_the_durations_its_host_records(tmp_path: Path) -> None:
    """A slot runs for weeks: what its host measures tonight orders its choices, not only what
    it knew at its start (re-read every REFRESH seconds)."""
    targets = {t: Target(name=t, suites=["unit", "model"]) for t in ("linux-x86_64", "linux-riscv64")}
    durations = Durations(tmp_path / "host.json")
    prefer = Preference([("test", t) for t in targets], targets, durations)
    waiting = {"test:linux-x86_64": 1, "test:linux-riscv64": 1}
    first = prefer(waiting)
    other = next(fn for fn in waiting if fn != first)
    durations.record(other, 30.0, "test-unit")
    durations.record(other, 40.0, "test-model")
    assert prefer(waiting) == first  # not re-read yet
    prefer.loaded -= Preference.REFRESH
    assert prefer(waiting) == other


def test_a_slot_works_out_each_targets_suites_once_when_it_reads_its_hosts_durations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every slot of the lab re-reads its host's durations and works out its estimates for every
    function it serves (two a target); at 100 targets of 49 suites each target's suites were
    worked out four times (the order, then the estimates), 13 ms of CPU a slot each time."""
    targets = {f"linux-s{i:03d}": Target(name=f"linux-s{i:03d}", suites=[f"s{j}" for j in range(49)])
               for i in range(100)}
    durations = Durations(tmp_path / "host.json")
    worked: list[str] = []
    real = priority.suites
    monkeypatch.setattr(priority, "suites", lambda d, ts, t: worked.append(t) or real(d, ts, t))
    prefer = Preference([(r, t) for t in targets for r in ("build", "test")], targets, durations)
    assert sorted(worked) == sorted(targets)
    worked.clear()
    prefer.loaded -= Preference.REFRESH
    prefer({"test:linux-s000": 3})
    assert sorted(worked) == sorted(targets)


QUICK_SLOW = r"""#include <stdio.h>
#include <string.h>
#include <time.h>
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "slow")) {
        struct timespec t = { 1, 500000000 };
        nanosleep(&t, NULL);
    }
    printf("1..1\nok 1 - %s\n", argc > 1 ? argv[1] : "none");
    return 0;
}
"""
QUICK_SLOW_CATALOG = """schema = 2

[build]
argv = ["make", "CC={cc}"]
outputs = ["t_s"]
timeout = 120

[suites.quick]
argv = ["{root}/t_s", "quick"]
format = "tap"
timeout = 60

[suites.slow]
argv = ["{root}/t_s", "slow"]
format = "tap"
timeout = 60

[targets.linux-x86_64]
tools = ["gcc", "make"]
vars = { cc = "gcc" }
suites = ["quick", "slow"]
"""


def test_the_slot_runs_the_suite_it_measured_longest_first_the_next_night(tmp_path: Path) -> None:
    """One slot, a quick suite listed before a slow one: the first night runs them in the
    catalog's order; the build worker then knows the slow one takes longer, and the second
    night queues (so runs) it first."""
    repo = tmp_path / "qs"
    (repo / ".gearfarm").mkdir(parents=True)
    (repo / ".gearfarm" / "catalog.toml").write_text(QUICK_SLOW_CATALOG)
    (repo / "Makefile").write_text("CC ?= cc\nt_s: t_s.c\n\t$(CC) -std=c11 -D_POSIX_C_SOURCE=200809L "
                                   "-Wall -Wextra -Werror -o $@ t_s.c\n")
    (repo / "t_s.c").write_text(QUICK_SLOW)
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=repo, check=True)
    rev = commit(repo, "quick and slow")
    f = EmbeddedFarm(tmp_path / "state", repo, slots=1,
                     projects=[ProjectConfig(name="qs", repo=str(repo), catalog=".gearfarm/catalog.toml")])
    f.start([catalog_mod.parse(QUICK_SLOW_CATALOG, "qs")], ["linux-x86_64"])
    try:
        first = {}
        for run_id in ("n1", "n2"):
            p = gearfarm("nightly", "--config", str(f.config_path), "--project", "qs", "--rev", rev,
                         "--benchmarks", "none", "--run-id", run_id, timeout=300)
            assert p.returncode == 0, p.stdout + p.stderr
            jobs = {r.step: r for r in ResultsDB(config_mod.load(f.config_path).database.url).jobs(run_id)}
            assert jobs["test-slow"].status == jobs["test-quick"].status == "passed"
            first[run_id] = min(("test-quick", "test-slow"), key=lambda s: jobs[s].started_at or 0)
    finally:
        f.stop()
    assert first == {"n1": "test-quick", "n2": "test-slow"}
