"""The chaos suite (issue: nothing lost, nothing forged). Each case runs real nightlies on a
real farm while something breaks, and prints its counts: trials, runs completed, jobs lost,
duplicate results, forged jobs executed.

Runs in `make test` with a small profile; the full profile (>= 20 worker kills, a 30 s MinIO
outage, 10,000 fuzzed payloads) runs alone with:
    GEARFARM_CHAOS=full .venv/bin/python -m pytest tests/test_chaos.py -s
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import catalog as catalog_mod
from gearfarm import config as config_mod
from gearfarm.farm import EmbeddedFarm
from gearfarm.gearman import admin
from tests.farmkit import ROOT, commit, make_repo

PROFILE = os.environ.get("GEARFARM_CHAOS", "small")
SIZE = {
    "small": {"kill_trials": 2, "kills": 2, "minio_outage": 10.0, "fuzz_worker": 1000},
    "full": {"kill_trials": 5, "kills": 4, "minio_outage": 30.0, "fuzz_worker": 10000},
}[PROFILE]
TARGET = "linux-x86_64"
SUITES = "unit,model"


def report(case: str, trials: int, completed: int, lost: int, duplicates: int, forged: int = 0, **extra: object) -> None:
    more = "".join(f" {k}={v}" for k, v in extra.items())
    print(f"\nCHAOS {case}: trials={trials} runs_completed={completed} jobs_lost={lost} "
          f"duplicate_results={duplicates} forged_executed={forged}{more}")


@pytest.fixture(scope="module")
def chaos_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine with a model suite slow enough (seconds) to be killed in the middle."""
    repo = make_repo(tmp_path_factory.mktemp("chaos") / "repo")
    cat = repo / "jobs" / "catalog.toml"
    cat.write_text(cat.read_text().replace('"--ops", "20000"', '"--ops", "40000"'))
    commit(repo, "slower model suite for chaos")
    return repo


@pytest.fixture
def farm(chaos_repo: Path, tmp_path: Path) -> Iterator[EmbeddedFarm]:
    f = EmbeddedFarm(tmp_path / "state", chaos_repo)
    f.start(catalog_mod.load_at_rev(chaos_repo, "HEAD"), [TARGET])
    cfg = config_mod.load(f.config_path)
    cfg.farm.lease_timeout, cfg.farm.lost_grace = 15.0, 8.0
    config_mod.dump(cfg, f.config_path)
    try:
        yield f
    finally:
        f.stop()


def start_nightly(farm: EmbeddedFarm, run_id: str, suites: str = SUITES) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gearfarm.cli", "nightly", "--config", str(farm.config_path),
                             "--targets", TARGET, "--suites", suites, "--run-id", run_id, "--deadline", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def outcome(farm: EmbeddedFarm, run_id: str, n_expected: int) -> tuple[int, int, dict[str, str]]:
    """(jobs lost, duplicate rows, statuses) of a run from the results database."""
    with sqlite3.connect(farm.state / "results.db") as db:
        rows = db.execute("SELECT job_id, status FROM jobs WHERE run_id = ?", (run_id,)).fetchall()
    statuses = dict(rows)
    lost = n_expected - sum(1 for s in statuses.values() if s == "passed")
    return lost, len(rows) - len(statuses), statuses


def wait_running(farm: EmbeddedFarm, proc: subprocess.Popen[str], timeout: float = 120) -> str | None:
    """The function with a job running right now, once there is one."""
    host, port = farm.cfg.gearman.addresses()[0]  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            for fn, st in admin.status(host, port).items():
                if st.running and fn != "collect":
                    return fn
        except OSError:
            pass
        time.sleep(0.2)
    return None


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


N_JOBS = 1 + len(SUITES.split(","))


def test_worker_killed_mid_job_loses_nothing(farm: EmbeddedFarm) -> None:
    kills = completed = lost = dups = 0
    for trial in range(SIZE["kill_trials"]):
        run_id = f"kill{trial}"
        proc = start_nightly(farm, run_id)
        done = 0
        while done < SIZE["kills"]:
            fn = wait_running(farm, proc)
            if fn is None:
                break
            role = fn.split(":")[0]
            victim = farm.procs[f"{role}-{TARGET}"]
            os.killpg(victim.pid, signal.SIGKILL)  # type: ignore[attr-defined]
            done += 1
            time.sleep(2.5)  # the supervisor restarts it; let it take the job again
        kills += done
        code, out = finish(proc)
        completed += code == 0
        trial_lost, trial_dups, statuses = outcome(farm, run_id, N_JOBS)
        assert trial_lost == 0, (statuses, out[-3000:])
        lost += trial_lost
        dups += trial_dups
    report("worker-kill-9", SIZE["kill_trials"], completed, lost, dups, kills=kills)
    assert kills >= SIZE["kill_trials"] * SIZE["kills"]
    assert completed == SIZE["kill_trials"] and lost == 0 and dups == 0


def test_gearmand_killed_and_restarted_loses_no_job(farm: EmbeddedFarm) -> None:
    proc = start_nightly(farm, "gmd")
    assert wait_running(farm, proc) is not None
    assert farm.gearmand is not None
    farm.gearmand.kill9()
    time.sleep(2)
    farm.gearmand.start()  # same port, same persistent queue
    code, out = finish(proc)
    lost, dups, statuses = outcome(farm, "gmd", N_JOBS)
    report("gearmand-kill-9", 1, int(code == 0), lost, dups)
    assert code == 0 and lost == 0 and dups == 0, (statuses, out[-3000:])


def test_minio_outage_mid_run_loses_no_result(farm: EmbeddedFarm) -> None:
    proc = start_nightly(farm, "s3out")
    assert wait_running(farm, proc) is not None
    assert farm.minio is not None
    farm.minio.stop()
    time.sleep(SIZE["minio_outage"])
    farm.minio.start()  # same port and data
    code, out = finish(proc)
    lost, dups, statuses = outcome(farm, "s3out", N_JOBS)
    report("minio-outage", 1, int(code == 0), lost, dups, outage_s=SIZE["minio_outage"])
    assert code == 0 and lost == 0 and dups == 0, (statuses, out[-3000:])


def test_collector_stopped_mid_run_loses_no_result(farm: EmbeddedFarm) -> None:
    collector = farm.procs["collector"]
    proc = start_nightly(farm, "coll")
    assert wait_running(farm, proc) is not None
    os.killpg(collector.pid, signal.SIGSTOP)  # type: ignore[attr-defined]
    try:
        # The run still ends: the nightly reconciles the database from the records in S3.
        code, out = finish(proc)
    finally:
        os.killpg(collector.pid, signal.SIGCONT)  # type: ignore[attr-defined]
    lost, dups, statuses = outcome(farm, "coll", N_JOBS)
    report("collector-stopped", 1, int(code == 0), lost, dups)
    assert code == 0 and lost == 0 and dups == 0, (statuses, out[-3000:])


def test_hung_suite_is_killed_at_its_timeout_and_the_worker_goes_on(chaos_repo: Path, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    cat = repo / "jobs" / "catalog.toml"
    text = cat.read_text().replace('"--ops", "20000"]\ntimeout = 300', '"--ops", "100000000"]\ntimeout = 3')
    assert text != cat.read_text()
    cat.write_text(text)
    commit(repo, "a model suite that hangs past its timeout")
    f = EmbeddedFarm(tmp_path / "state", repo)
    f.start(catalog_mod.load_at_rev(repo, "HEAD"), [TARGET])
    try:
        proc = start_nightly(f, "hang", "model,unit")
        code, out = finish(proc)
        _, _, statuses = outcome(f, "hang", 3)
        log = (f.state / "runs" / "hang" / "report.json").read_text()
    finally:
        f.stop()
    assert code == 1, out
    assert statuses == {f"hang:{TARGET}:build": "passed", f"hang:{TARGET}:test-model": "timed_out",
                        f"hang:{TARGET}:test-unit": "passed"}
    assert "killed after the catalog timeout of 3s" in log
    leftover = subprocess.run(["pgrep", "-f", "gfe-suite model.*100000000"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "the suite's process group outlived its timeout"
