"""Time that ends (issue #76, case 3), on a real embedded farm (gearmand, MinIO, a worker slot,
the collector) and the real `gearfarm nightly`: a project whose suite ignores SIGTERM and would
sleep for a year under a long catalog timeout, in a night with a short run deadline, beside an
innocent project, on one slot. Within 30 s of the run's deadline every process of the suite is
gone (counted below the farm's own slot process), the suite is the project's `timed_out` with
its log, the innocent job it kept waiting names it, and the next night of the innocent project
passes on the same slot, without a restart.

Before the change the nightly recorded the suite `infra` ("not finished by the run deadline",
the farm's fault), closed the run and sent no cancel; the ledger then answered the job's beats
`refused`, which the worker ignored, and the suite held the slot for good: this test failed
with "the hanging suite outlived its run's deadline"."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gearfarm.config import ProjectConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import ROOT, carried_files, descendants, gearfarm, wait_for
from tests.projects import CATALOG_TINY, _init

SLEEPER = "31536019"
HANG = f"""schema = 2

[build]
argv = ["sh", "-c", "echo built > out.txt"]
outputs = ["out.txt"]
timeout = 60

[suites.hang]
argv = ["sh", "-c", "trap '' TERM INT HUP; setsid sh -c \\"trap '' TERM; sleep {SLEEPER}\\" & sleep {SLEEPER} & \
echo started; while :; do sleep 1; done", "{SLEEPER}"]
format = "tap"
timeout = 3600

[targets.linux-x86_64]
tools = ["sh"]
suites = ["hang"]
"""

INNOCENT = CATALOG_TINY
# The first night's run deadline: room for the farm's nightly to prepare and build both
# projects on one slot on a loaded machine, and for the suite to be running well before it.
DEADLINE = 75


def _hanging(farm: EmbeddedFarm) -> list[int]:
    """The suite's own processes (two shells, two sleeps) below the farm's processes."""
    roots = [p.pid for p in farm.procs.values()]  # type: ignore[attr-defined]
    return [pid for pid, argv in descendants(roots).items()
            if argv and argv[0] in ("sh", "sleep") and SLEEPER in " ".join(argv)]


@pytest.mark.timeout(900)
def test_a_suite_trapping_sigterm_is_gone_within_30s_of_its_runs_deadline_and_its_slot_serves_the_next_night(
        tmp_path: Path) -> None:
    repos = {"hang": tmp_path / "hang", "innocent": tmp_path / "innocent"}
    for name, text in (("hang", HANG), ("innocent", INNOCENT)):
        repos[name].mkdir()
        _init(repos[name], {"jobs/catalog.toml": text})
    (tmp_path / "no-repo").mkdir()
    farm = EmbeddedFarm(tmp_path / "state", tmp_path / "no-repo", slots=1,
                        projects=[ProjectConfig(name=n, repo=str(r)) for n, r in repos.items()])
    night = None
    try:
        cfg = farm.start([catalog_mod.parse(HANG, "hang"), catalog_mod.parse(INNOCENT, "innocent")])
        slot = farm.procs["slot-1"].pid  # type: ignore[attr-defined]
        night = subprocess.Popen(
            [sys.executable, "-m", "gearfarm.cli", "nightly", "--config", str(farm.config_path), "--project",
             "hang,innocent", "--deadline", str(DEADLINE)], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        wait_for("the hanging suite's four processes", lambda: len(_hanging(farm)) == 4, DEADLINE + 60)
        gone = wait_for("the hanging suite gone", lambda: not _hanging(farm) and time.time(), DEADLINE + 120)
        out, _ = night.communicate(timeout=300)
        db = ResultsDB(cfg.database.url)
        runs = {r.project: r for r in db.runs(limit=10)}
        assert set(runs) == {"hang", "innocent"}, (runs, out)
        hang = runs["hang"]
        assert hang.deadline is not None
        late = gone - hang.deadline
        assert late < 30, f"the hanging suite outlived its run's deadline by {late:.0f}s"
        print(f"\nthe hanging suite's last process was gone {late:.1f}s after its run's deadline")

        # The suite is the project's: timed out at the deadline, with its log kept.
        jobs = {r.step: r for r in db.jobs(hang.run_id)}
        assert jobs["build"].status == "passed", jobs["build"]
        suite = jobs["test-hang"]
        assert suite.status == "timed_out" and "run's deadline" in suite.message, (suite.status, suite.message)
        logged = carried_files(cfg.database.url).get(f"{suite.job_id}/log.txt", b"").decode()
        assert "started" in logged and "killed at its run's deadline" in logged, logged
        # What the innocent project had to wait for is named: the job that held the slot.
        for r in db.jobs(runs["innocent"].run_id):
            if r.status == "infra":
                assert suite.job_id in r.message, r.message
            else:
                assert r.status in ("passed", "skipped"), (r.job_id, r.status, r.message)

        # The next night of the innocent project, on the same slot (never restarted): green.
        again = gearfarm("nightly", "--config", str(farm.config_path), "--project", "innocent", timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        last = next(r for r in db.runs(limit=10) if r.project == "innocent")
        assert last.run_id != runs["innocent"].run_id
        assert {r.step: r.status for r in db.jobs(last.run_id)} == {"build": "passed", "test-quick": "passed"}
        assert farm.procs["slot-1"].pid == slot and not farm.restarts  # type: ignore[attr-defined]
        assert not _hanging(farm)
    finally:
        if night is not None and night.poll() is None:
            night.kill()
            night.wait()
        farm.stop()
