"""Limits per job from the host's kernel (issue #76, case 6): on a real embedded farm of two
slots, one night of three projects: one whose suite is a fork bomb, one whose suite allocates
4 GiB, and an innocent one; then a next night of the innocent one on the same slots.

* the fork bomb stops at the job's process limit ([farm] job_pids_max, here 64) while the test's
  own process keeps forking promptly, and its job fails naming the limit;
* the 4 GiB allocation ends at the memory limit ([farm] job_memory_max, here 256 MiB), and its
  job fails naming "memory limit 256 MiB reached"; no worker dies;
* the innocent project's jobs pass, that night and the next;
* the two slots run their jobs as two uids, seen from the host's /proc, and a second farm
  started beside the first runs its jobs as a third;
* no job cgroup is left after the night, and none at all after the farm stops.

The bomb limits itself too (ulimit -u), so that the code before this change, which had no
process limit, could run it without taking the machine (it ran until its timeout)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.config import EmbeddedSettings, ProjectConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.result import ResultRecord
from gearfarm.hosts import cgroup
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import commit, gearfarm
from tests.projects import _init

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job cgroups and uids need a root worker")

MARKER = "gf-limits-probe"
T = "linux-x86_64"
MiB = 1024 * 1024

CATALOG = """schema = 2

[build]
argv = ["sh", "-c", "echo built > built.txt"]
outputs = ["built.txt"]
timeout = 120

[suites.work]
description = "what the project's suite does"
argv = ["sh", "-c", "SCRIPT", "MARKER-PROJECT"]
format = "exit-code"
timeout = 120

[targets.linux-x86_64]
tools = ["sh"]
suites = ["work"]
"""
# A fork bomb: every function call starts two more in the background, for ever; bounded here
# by its own ulimit only so that a farm without a process limit survives it.
BOMB = "ulimit -u 1500; b() {{ b | b & }}; b; sleep 8; echo survived"
# 4 GiB, touched: the kernel must give every page.
HOG = "python3 -c 'b = bytearray(4 << 30); print(len(b))'"
# Innocent: holds its slot a while (the test sees its uid), then passes.
INNOCENT = "sleep 4; echo fine"


def catalog(script: str, project: str) -> str:
    return CATALOG.replace("SCRIPT", script).replace("MARKER", MARKER).replace("PROJECT", project)


@dataclass
class Night:
    farm: EmbeddedFarm
    first: subprocess.CompletedProcess[str] | None = None
    second: subprocess.CompletedProcess[str] | None = None
    db: ResultsDB | None = None
    # (pid of the slot that ran it, uid) of every probe process seen, by project
    seen: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    # the test's own fork + exec + wait of `true`, while the night ran: the slowest, seconds
    slowest_fork: float = 0.0
    forks: int = 0
    # the most processes of each project's suite seen at once
    most: dict[str, int] = field(default_factory=dict)
    groups_after_night: list[str] = field(default_factory=list)
    groups_after_stop: list[str] = field(default_factory=list)
    other_farm_uids: set[int] = field(default_factory=set)
    restarts: dict[str, int] = field(default_factory=dict)


def _slot_of(pid: int, slots: dict[int, str]) -> str | None:
    """The farm slot ``pid`` descends from (its parent chain, from /proc)."""
    for _ in range(64):
        if pid in slots:
            return slots[pid]
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def _watch(farm: EmbeddedFarm, night: Night, stop: threading.Event) -> None:
    """Which slot runs each probe and as which uid, from the host's /proc; and how quickly the
    test's own process can start one, meanwhile."""
    slots = {p.pid: name for name, p in farm.procs.items() if name.startswith("slot-")}
    while not stop.is_set():
        now: dict[str, int] = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
                probe = next((a.decode() for a in args if a.startswith(MARKER.encode())), None)
                # setpriv carries the job's argv while, still root, it switches to the job's uid.
                if probe is None or os.path.basename(args[0]) == b"setpriv":
                    continue
                with open(f"/proc/{pid}/status") as f:
                    uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
            except (OSError, StopIteration, ValueError):
                continue
            project = probe.removeprefix(MARKER + "-")
            now[project] = now.get(project, 0) + 1
            slot = _slot_of(int(pid), slots)
            if slot is not None:
                night.seen.setdefault(project, set()).add((slot, uid))
        for project, n in now.items():
            night.most[project] = max(night.most.get(project, 0), n)
        t0 = time.monotonic()
        subprocess.run(["true"], check=True, timeout=120)
        night.slowest_fork = max(night.slowest_fork, time.monotonic() - t0)
        night.forks += 1
        time.sleep(0.05)


def _groups() -> list[str]:
    """Every job cgroup (and top) of the farm's under this process's own cgroups."""
    found = []
    for root in _roots():
        if root.is_dir():
            found += [d for d, _, _ in os.walk(root)]
    return found


def _roots() -> list[Path]:
    v1, _ = cgroup._mounts()
    own = cgroup._own()
    return [cgroup._place(v1[c], own[c]) / cgroup.TOP for c in cgroup.CONTROLLERS if c in v1 and c in own]


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Night]:
    base = tmp_path_factory.mktemp("job-limits")
    (base / "no-repo").mkdir()
    scripts = {"bomb": BOMB, "hog": HOG, "innocent": INNOCENT, "other": INNOCENT}
    repos = {}
    for name, script in scripts.items():
        repos[name] = base / name
        repos[name].mkdir()
        _init(repos[name], {"jobs/catalog.toml": catalog(script, name)})
    settings = EmbeddedSettings(job_pids_max=64, job_memory_max=256 * MiB)
    farm = EmbeddedFarm(base / "state", base / "no-repo", slots=2, settings=settings,
                        projects=[ProjectConfig(name=n, repo=str(repos[n])) for n in ("bomb", "hog", "innocent")])
    other = EmbeddedFarm(base / "other-state", base / "no-repo", slots=1, settings=settings,
                         projects=[ProjectConfig(name="other", repo=str(repos["other"]))])
    stop = threading.Event()
    out = Night(farm)
    try:
        farm.start(catalog_mod.parse(catalog(INNOCENT, "innocent"), "innocent"))
        # A second farm on the host, beside the first: its slot takes a uid of its own.
        other.start(catalog_mod.parse(catalog(INNOCENT, "other"), "other"))
        out.db = ResultsDB(config_mod.load(farm.config_path).database.url)
        watcher = threading.Thread(target=_watch, args=(farm, out, stop), daemon=True)
        watcher.start()
        out.first = gearfarm("nightly", "--config", str(farm.config_path), "--project", "bomb,hog,innocent",
                             "--benchmarks", "none", timeout=900)
        out.groups_after_night = _groups()
        commit(repos["innocent"], "the next night")
        out.second = gearfarm("nightly", "--config", str(farm.config_path), "--project", "innocent",
                              "--benchmarks", "none", timeout=600)
        stop.set()
        watcher.join()
        log = (base / "other-state" / "logs" / "slot-1.log").read_text()
        out.other_farm_uids = {int(u) for u in re.findall(r"this slot runs its jobs as uid (\d+)", log)}
        out.restarts = dict(farm.restarts)
    finally:
        stop.set()
        farm.stop()
        other.stop()
    out.groups_after_stop = _groups()
    yield out


def _job(night: Night, project: str, run: int = 0) -> ResultRecord:
    """The suite's job of ``project``'s first (0) or second night."""
    assert night.db is not None
    runs = sorted(night.db.runs(project=project), key=lambda r: r.created_at)
    said = [p.stdout[-2000:] + p.stderr[-2000:] for p in (night.first, night.second) if p is not None]
    assert len(runs) > run, f"no run {run} of {project}: {said}"
    return next(j for j in night.db.jobs(runs[run].run_id) if j.step == "test-work")


def test_a_fork_bomb_stops_at_the_jobs_process_limit_and_names_it(night: Night) -> None:
    job = _job(night, "bomb")
    assert job.finished_at is not None and job.started_at is not None
    print(f"fork bomb: at most {night.most.get('bomb')} of its processes seen at once, its job took "
          f"{job.finished_at - job.started_at:.1f} s; the test's slowest fork+exec+wait of true "
          f"{night.slowest_fork:.3f} s of {night.forks}")
    assert job.status == "failed", (job.status, job.message)
    assert "process limit 64 reached" in job.message
    assert 0 < night.most.get("bomb", 0) <= 64, night.most
    # The kernel's own count of the group's most processes at once, which its log ends with.
    peak = re.search(r"process limit 64 reached \(at most (\d+) processes", job.log_tail)
    assert peak is not None and int(peak.group(1)) <= 64, job.log_tail
    print("fork bomb: the kernel counted at most", peak.group(1), "processes")
    # The host kept answering: the test's own process started `true` promptly all along.
    assert night.forks > 20
    assert night.slowest_fork < 5.0, f"a fork of the test's took {night.slowest_fork:.1f} s"
    # It stopped promptly: its job took seconds, not its timeout.
    assert job.finished_at - job.started_at < 60, job.finished_at - job.started_at


def test_a_4gib_allocation_ends_at_the_memory_limit_and_names_it(night: Night) -> None:
    job = _job(night, "hog")
    assert job.status == "failed", (job.status, job.message)
    print("4 GiB allocation:", job.message, "|", job.log_tail.splitlines()[-1])
    assert "memory limit 256 MiB reached" in job.message
    # The log says it too, with the peak the kernel counted: the limit, not the 4 GiB.
    peak = re.search(r"memory limit 256 MiB reached \(at most .* and ([0-9.]+) MiB of memory\)", job.log_tail)
    assert peak is not None and float(peak.group(1)) <= 256, job.log_tail
    assert night.restarts == {}, "a worker died"


def test_the_innocent_project_passes_that_night_and_the_next(night: Night) -> None:
    assert night.second is not None
    assert night.second.returncode == 0, night.second.stdout[-3000:] + night.second.stderr[-3000:]
    for run in (0, 1):
        job = _job(night, "innocent", run)
        assert job.status == "passed", (run, job.status, job.message)


def test_each_slot_runs_its_jobs_as_a_uid_of_its_own_and_farms_do_not_share_one(night: Night) -> None:
    cfg = config_mod.load(night.farm.config_path)
    first, count = cfg.farm.job_uid, cfg.farm.job_uids
    by_slot: dict[str, set[int]] = {}
    for pairs in night.seen.values():
        for slot, uid in pairs:
            by_slot.setdefault(slot, set()).add(uid)
    assert set(by_slot) == {"slot-1", "slot-2"}, night.seen
    assert all(len(uids) == 1 for uids in by_slot.values()), by_slot
    uids = {u for us in by_slot.values() for u in us}
    assert len(uids) == 2 and all(first <= u < first + count for u in uids), by_slot
    assert len(night.other_farm_uids) == 1 and not night.other_farm_uids & uids, (night.other_farm_uids, uids)


def test_no_job_cgroup_is_left_after_the_jobs_or_the_farm(night: Night) -> None:
    # After the night: each live worker's own directory, and no job's group in it.
    leaves = [g for g in night.groups_after_night if re.search(r"/\d+-\d+-[0-9a-f]+/\d+$", g)]
    assert leaves == [], leaves
    assert night.groups_after_stop == [], night.groups_after_stop
