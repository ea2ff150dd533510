"""What a job leaves costs only that job (issue #76, cases 1, 2 and 7), on a real embedded farm
(gearmand, MinIO, two worker slots, the collector) running a hostile project and an innocent one
in the same night, twice, on the same slots:

* a suite that makes FIFOs named like the loader's accounts ($LD_DEBUG_OUTPUT.fifo) and as its
  JUnit or TAP results file, and exits 0. Before: the worker's open of the loader's FIFO never
  returned while its heartbeat kept the lease, so the slot was lost until a restart;
* a suite that leaves a 3,000-deep tree in $HOME with directories locked by their modes. Before:
  shutil.rmtree raised RecursionError when the next command started (that job, another
  project's, was `infra`), and at every later start sweep_work_dirs raised ("workers did not
  register");
* suites that write a 400 MiB JUnit file, of 4,100 cases with 100 KiB of output each, and of 7
  million tiny cases. Before: the worker went from 80 MB to 489 MB on the first (ElementTree read
  it whole; 1.34 GB in the issue's file), and it was stored whole.

Then the farm is stopped, a tree such a job would leave when its worker is killed mid-job is put
where it would be, and a farm started again registers its workers and runs a night."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.result import CASES_MAX
from gearfarm.hosts import jobtree
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import gearfarm
from tests.hosts.test_jobtree import deep
from tests.projects import _init

T = "linux-x86_64"
MiB = 1024 * 1024

HOSTILE = """schema = 2

[build]
argv = ["sh", "-c", "echo built > built.txt"]
outputs = ["built.txt", "fifo.sh", "deep.py", "big.py", "tiny.py"]
timeout = 120

[suites.fifo]
description = "FIFOs where the loader's accounts and the JUnit file are read"
argv = ["sh", "{root}/fifo.sh", "{junit}"]
format = "junit"
timeout = 120

[suites.tapfifo]
description = "a FIFO as its TAP results file"
argv = ["sh", "-c", "mkfifo results.tap && exit 0"]
format = "tap"
results = "results.tap"
timeout = 120

[suites.deep]
description = "a 3,000-deep tree in $HOME, and directories locked by their modes"
argv = ["python3", "{root}/deep.py"]
format = "exit-code"
timeout = 300

[suites.bigjunit]
description = "a 400 MiB JUnit file"
argv = ["python3", "{root}/big.py", "{junit}"]
format = "junit"
timeout = 600

[suites.tinyjunit]
description = "a 400 MiB JUnit file of 7 million cases"
argv = ["python3", "{root}/tiny.py", "{junit}"]
format = "junit"
timeout = 600

[targets.linux-x86_64]
tools = ["sh", "python3"]
suites = ["fifo", "tapfifo", "deep", "bigjunit", "tinyjunit"]
"""

FIFO = 'mkfifo "$LD_DEBUG_OUTPUT.fifo" && mkfifo "$1" && exit 0\n'

DEEP = """import os
home = os.environ["HOME"]
fd = os.open(home, os.O_RDONLY)
for _ in range(3000):  # deeper than PATH_MAX can name: made by descriptors
    os.mkdir("d", dir_fd=fd)
    sub = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = sub
os.close(fd)
for name, mode in (("readonly", 0o555), ("no-x", 0o600), ("none", 0o000)):
    os.makedirs(f"{home}/{name}/inner")
    open(f"{home}/{name}/inner/f", "w").close()
    open(f"{home}/{name}/f", "w").close()
    os.chmod(f"{home}/{name}", mode)
print("left a deep tree")
"""

BIG = """import sys
out = "x" * (100 * 1024 - 1) + "\\n"
with open(sys.argv[1], "w") as f:
    f.write('<?xml version="1.0"?>\\n<testsuites><testsuite name="big">\\n')
    for i in range(4100):  # 410 MB
        f.write(f'<testcase classname="big" name="case {i}" time="0.01"><system-out>{out}</system-out></testcase>\\n')
    f.write("</testsuite></testsuites>\\n")
"""

TINY = """import sys
with open(sys.argv[1], "w") as f:
    f.write('<testsuite name="tiny">\\n')
    n = 0
    while f.tell() < 400 * 1024 * 1024:
        f.write("".join(f'<testcase classname="c" name="case {n + i}" time="0.001"/>\\n' for i in range(10000)))
        n += 10000
    f.write("</testsuite>\\n")
"""

INNOCENT = """schema = 2

[build]
argv = ["sh", "-c", "echo built > built.txt"]
outputs = ["built.txt"]
timeout = 120

[suites.unit]
argv = ["sh", "-c", "echo 1..2; echo ok 1 - one; echo ok 2 - two"]
format = "tap"
timeout = 120

[suites.more]
argv = ["sh", "-c", "echo 1..1; echo ok 1 - three"]
format = "tap"
timeout = 120

[targets.linux-x86_64]
tools = ["sh"]
suites = ["unit", "more"]
"""


def _hwm_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


def _night(farm: EmbeddedFarm, projects: str) -> dict[str, Any]:
    t0 = time.monotonic()
    p = gearfarm("nightly", "--config", str(farm.config_path), "--project", projects, "--benchmarks", "none",
                 timeout=600)
    return {"p": p, "seconds": time.monotonic() - t0}


def _leftovers(state: Path) -> list[str]:
    """What the work dirs and the quarantine hold (names, without walking a deep tree): a live
    slot's job disk (its image and mount point, gearfarm/hosts/jobdisk.py) by what is on it."""
    out = []
    for top in (state / "work", state / "quarantine"):
        for owner in sorted(top.iterdir()) if top.is_dir() else []:
            if not owner.is_dir():
                out.append(str(owner))
                continue
            out += [f"{owner}/{j.name}" for j in owner.iterdir() if j.name not in ("disk", "disk.img")]
            disk = owner / "disk"
            out += [f"{disk}/{j.name}" for j in disk.iterdir()] if disk.is_dir() else []
    return out


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("leftovers")
    state = base / "state"
    (base / "no-repo").mkdir()
    repos = {"hostile": base / "hostile", "innocent": base / "innocent"}
    for repo in repos.values():
        repo.mkdir()
    _init(repos["hostile"], {"jobs/catalog.toml": HOSTILE, "fifo.sh": FIFO, "deep.py": DEEP, "big.py": BIG,
                                  "tiny.py": TINY})
    _init(repos["innocent"], {"jobs/catalog.toml": INNOCENT})
    farm = EmbeddedFarm(state, base / "no-repo", slots=2,
                        projects=[ProjectConfig(name=n, repo=str(r)) for n, r in repos.items()])
    got: dict[str, Any] = {"state": state}
    try:
        farm.start([catalog_mod.parse(HOSTILE, "hostile"), catalog_mod.parse(INNOCENT, "innocent")])
        slots = {name: proc.pid for name, proc in farm.procs.items() if name.startswith("slot-")}  # type: ignore[attr-defined]
        got["baseline_kib"] = {name: _hwm_kib(pid) for name, pid in slots.items()}
        got["first"] = _night(farm, "hostile,innocent")
        got["second"] = _night(farm, "hostile,innocent")
        got["hwm_kib"] = {name: _hwm_kib(pid) for name, pid in slots.items()}
        got["same_slots"] = slots == {n: p.pid for n, p in farm.procs.items() if n.startswith("slot-")}  # type: ignore[attr-defined]
        got["restarts"] = dict(farm.restarts)
        # An idle slot removes its last job's dir (process.tidy) after a poll interval.
        deadline = time.monotonic() + 60
        while _leftovers(state) and time.monotonic() < deadline:
            time.sleep(1)
        got["left_after_nights"] = _leftovers(state)
    finally:
        farm.stop()
    # What a worker killed mid-job would leave: its owner dir (a process of an earlier boot) with
    # the deep suite's $HOME in it. The old sweep raised RecursionError at every start.
    dead = state / "work" / "1-1-000000000000" / "testxyz"
    (dead / "scratch").mkdir(parents=True)
    (dead / "test.log").write_text(f"gearfarm test-deep of hostile for {T} at abc on a-killed-worker\n")
    deep(dead / "scratch")
    (dead / "scratch" / "locked").mkdir(mode=0o000)
    try:
        t0 = time.monotonic()
        farm.start([catalog_mod.parse(INNOCENT, "innocent")])
        got["restart_seconds"] = time.monotonic() - t0
        got["third"] = _night(farm, "innocent")
        got["left_after_restart"] = _leftovers(state)
        got["dead_gone"] = not (state / "work" / "1-1-000000000000").exists()
    finally:
        farm.stop()
    cfg = config_mod.load(farm.config_path)
    got["db"] = ResultsDB(cfg.database.url)
    got["logs"] = "\n".join(p.read_text(errors="replace") for p in (state / "logs").glob("slot-*.log*"))
    yield got
    for q in (state / "work", state / "quarantine"):
        jobtree.remove(q)  # pytest's own cleanup is shutil.rmtree


def _runs(state: Path, project: str) -> list[Path]:
    return sorted((d for d in (state / "runs").iterdir()
                   if d.is_dir() and f"-{project}-" in d.name and not d.name.endswith(".rerun")),
                  key=lambda d: d.stat().st_mtime)


def _jobs(got: dict[str, Any], project: str) -> list[dict[str, Any]]:
    """Each night's jobs of ``project``: {step: (status, message)}."""
    return [{r.step: (r.status, r.message or "") for r in got["db"].jobs(run.name)} for run in _runs(got["state"],
                                                                                                     project)]


def test_every_night_ends_and_the_innocent_project_passes_each_time_on_the_same_slots(nights: dict[str, Any]) -> None:
    for night in ("first", "second"):
        p = nights[night]["p"]
        assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]  # the hostile project's failures
    assert nights["third"]["p"].returncode == 0, nights["third"]["p"].stdout[-3000:]
    innocent = _jobs(nights, "innocent")
    assert len(innocent) == 3
    for jobs in innocent:
        assert {s for s, _ in jobs.values()} == {"passed"}, jobs
    assert nights["same_slots"] and nights["restarts"] == {}, "a worker was restarted"
    assert "RecursionError" not in nights["logs"]


def test_a_fifo_as_the_loaders_account_or_results_file_fails_its_suite_naming_it(nights: dict[str, Any]) -> None:
    for jobs in _jobs(nights, "hostile"):
        status, message = jobs["test-fifo"]
        assert status == "failed"
        assert re.search(r"its results file \S+/junit\.xml is a FIFO, not a regular file", message), message
        status, message = jobs["test-tapfifo"]
        assert status == "failed"
        assert re.search(r"its results file \S+/results\.tap is a FIFO, not a regular file", message), message
    for run in _runs(nights["state"], "hostile"):
        log = (run / "logs" / T / "test-fifo" / "log.txt").read_text()
        assert re.search(r"the loader's account \S+/ld\.fifo is a FIFO, not a regular file", log), log[-2000:]


def test_a_deep_tree_with_locked_directories_is_removed_and_the_next_start_sweeps_it(nights: dict[str, Any]) -> None:
    for jobs in _jobs(nights, "hostile"):
        assert jobs["test-deep"][0] == "passed", jobs["test-deep"]
        assert all(s != "infra" for s, _ in jobs.values()), jobs
    assert nights["left_after_nights"] == [], nights["left_after_nights"]
    assert nights["dead_gone"], nights["left_after_restart"]
    assert not any("1-1-000000000000" in p for p in nights["left_after_restart"])


def test_a_400mib_junit_file_is_capped_with_a_note_and_the_worker_stays_small(nights: dict[str, Any]) -> None:
    db = nights["db"]
    for run in _runs(nights["state"], "hostile"):
        rec = next(r for r in db.jobs(run.name) if r.step == "test-bigjunit")
        assert rec.status == "passed", rec.message
        assert "bytes after its first 64 MiB were dropped (results capped at 64 MiB: [farm] result_limit)" in (
            rec.message or ""), rec.message
        # The cases up to the cap: 100 KiB each, so about 650 of the 4,100.
        names = {c.name for c in rec.cases}
        assert 600 <= len(names) < 700 and "case 0" in names and "case 4099" not in names, len(names)
        stored = run / "logs" / T / "test-bigjunit" / "junit.xml"
        assert 64 * MiB < stored.stat().st_size <= 64 * MiB + 4096, stored.stat().st_size
        with stored.open("rb") as f:
            f.seek(-1024, 2)
            assert b"(results capped at 64 MiB: [farm] result_limit)" in f.read()
        log = (run / "logs" / T / "test-bigjunit" / "log.txt").read_text()
        assert "results capped at 64 MiB: [farm] result_limit" in log
        # Of tiny cases, the first CASES_MAX are recorded, the rest within the cap counted in one.
        tiny = next(r for r in db.jobs(run.name) if r.step == "test-tinyjunit")
        assert tiny.status == "passed" and len(tiny.cases) == CASES_MAX + 1, (tiny.status, len(tiny.cases))
        summed = [c for c in tiny.cases if c.name == f"(cases past {CASES_MAX})"]
        assert len(summed) == 1 and re.fullmatch(rf"\d{{6,7}} more cases past the {CASES_MAX} a record keeps one by "
                                                 r"one: \d+ passed", summed[0].message), summed
    peak = max(nights["hwm_kib"].values())
    print(f"worker VmHWM at start {nights['baseline_kib']} KiB, after two nights {nights['hwm_kib']} KiB; nights took "
          f"{nights['first']['seconds']:.0f} s and {nights['second']['seconds']:.0f} s")
    assert peak < 200 * 1024, f"a worker peaked at {peak} KiB ({nights['hwm_kib']})"
