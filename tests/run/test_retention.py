"""Retention by value (issue #16, gearfarm/run/retention.py) on a real MinIO and a results database
of 60 nights, one a day: `gearfarm store prune` keeps exactly what the policy says (the last
good and first bad builds of every regression, every revision a bisection judged, tagged
revisions, each target's last good build, the runs that first showed a regression, and what is
younger than the age limit) and deletes the rest, in S3 and the runs' folders on the nightly
host's disk alike; `gearfarm store usage` says why each is kept; pruning refuses an empty
results database."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.config import Config
from gearfarm.db import triage
from gearfarm.db.results import ResultsDB
from gearfarm.formats.job import JobId
from gearfarm.formats.result import CaseResult, ResultRecord, pack_file
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.run.ledger import Ledger
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore
from tests.farmkit import GIT, carried_files, commit, gearfarm

DAY = 86400.0
NIGHTS = 60
TARGET = "linux-x86_64"
# Nights whose tests fail (a known failure from night 50 on: the last good build is night 49's).
FAILING_FROM = 50


def _repo(dest: Path) -> list[str]:
    dest.mkdir()
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    revs = []
    for i in range(1, NIGHTS + 1):
        (dest / "n.txt").write_text(f"{i}\n")
        revs.append(commit(dest, f"night {i}"))
    subprocess.run(GIT + ["tag", "-a", "v1.0", "-m", "release 1.0", revs[9]], cwd=dest, check=True)  # annotated
    subprocess.run(GIT + ["tag", "v1.1", revs[24]], cwd=dest, check=True)  # lightweight
    return revs


# Nights a person started from the dashboard (gearfarm/web/selfservice.py).
WEB_STARTED = (5, 20, 57)


def _night(db: ResultsDB, ledger: Ledger, store: ArtifactStore, state_runs: Path, i: int, rev: str,
           at: float) -> None:
    run_id = f"night-{i}"
    build, test = JobId(run_id, TARGET, "build"), JobId(run_id, TARGET, "test-unit")
    db.create_run(run_id, rev, [TARGET], [str(build), str(test)], created_at=at, project="calc")
    art = f"artifacts/{rev}/{TARGET}/tc0123456789abcd"
    failing = i >= FAILING_FROM or i == 20
    ledger.apply(ResultRecord(job_id=str(build), run_id=run_id, target=TARGET, kind="build", step="build", rev=rev,
                              status="passed", started_at=at, finished_at=at + 5,
                              artifact_key=f"{art}/artifact.tar.zst", artifact_sha256="0" * 64), "collect")
    ledger.apply(ResultRecord(job_id=str(test), run_id=run_id, target=TARGET, kind="test", step="test-unit",
                              name="unit", rev=rev, status="failed" if failing else "passed", started_at=at + 5,
                              finished_at=at + 9, cases=[CaseResult(name="limits", status="failed" if failing
                                                                    else "passed")],
                              # Its log carried in the record: kept in the results database.
                              files={"log.txt": pack_file(f"{run_id} ran\n".encode())}), "collect")
    db.finish_run(run_id, "finished")
    for key, size in ((f"{art}/artifact.tar.zst", 3000), (f"{art}/manifest.json", 200),
                      (f"sources/{rev}/source.tar.zst", 1000), (f"sources/{rev}/manifest.json", 100),
                      (f"runs/{run_id}/{TARGET}/build/log.txt", 400), (f"runs/{run_id}/report.html", 500),
                      # A cancel marker lives outside runs/ (no worker role may write it): pruned with its run.
                      (keys.cancel(run_id, TARGET, "test-unit"), 50)):
        store.put_bytes(key, b"x" * size)
    # The publisher's copy on the nightly host's disk, written the morning after.
    local = state_runs / run_id
    (local / TARGET / "build").mkdir(parents=True)
    for name, size in ((f"{TARGET}/build/log.txt", 400), ("report.html", 500), ("report.eml", 300)):
        (local / name).write_bytes(b"x" * size)
    if i in WEB_STARTED:
        # Started from the dashboard: its nightly's output, kept with the run (and rotated once).
        for log in (state_runs.parent / "web" / f"{run_id}.log", state_runs.parent / "web" / f"{run_id}.log.1"):
            log.parent.mkdir(exist_ok=True)
            log.write_bytes(b"x" * 100)
            os.utime(log, (at + 60, at + 60))


@pytest.fixture(scope="module")
def store60(minio: MinioServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], float]:
    base = tmp_path_factory.mktemp("retention")
    revs = _repo(base / "calc")
    cfg = Config.model_validate({
        "projects": [{"name": "calc", "repo": str(base / "calc")}],
        "s3": minio.s3_config().model_dump(), "database": {"url": f"sqlite:///{base / 'results.db'}"},
        "farm": {"state_dir": str(base / "state"), "reference_nights": 0}})
    config_mod.dump(cfg, base / "farm.toml")
    db, store = ResultsDB(cfg.database.url), ArtifactStore(cfg.s3, retry_for=10)
    store.ensure_bucket()
    ledger = Ledger(db)
    now = time.time()
    for i in range(1, NIGHTS + 1):
        # Night i started (61 - i) days ago, less an hour: night 56 is 4.96 days old.
        _night(db, ledger, store, base / "state" / "runs", i, revs[i - 1], now - (NIGHTS + 1 - i) * DAY + 3600)
    store.put_bytes("catalogs/" + "c" * 64 + ".toml", b"schema = 2\n")
    # Night 3's S3 files went in an earlier prune that left the disk alone; folders no run in the
    # database knows: one untouched for 9 days, one written an hour ago.
    store.delete([k for k, _, _ in store.objects() if k.startswith("runs/night-3/")])
    for name, age in (("stray-old", 9 * DAY), ("stray-new", 3600.0)):
        (base / "state" / "runs" / name).mkdir()
        (base / "state" / "runs" / name / "report.txt").write_text("x")
        for p in (base / "state" / "runs" / name / "report.txt", base / "state" / "runs" / name):
            os.utime(p, (now - age, now - age))
    # A new failure on night 20 (last good: night 19's), and a performance change found with
    # last good night 37 and first bad night 40, bisected: 38 good, 39 the culprit.
    night20 = db.get_run("night-20")
    night40 = db.get_run("night-40")
    assert night20 is not None and night40 is not None
    triage.record(db, night20, [triage.Detected("failure", TARGET, "unit/limits", revs[19], None, "night-20", {})])
    triage.record(db, night40, [triage.Detected("performance", TARGET, "spin/ops_per_sec", revs[39], revs[36],
                                                "night-40", {"benchmark": "spin", "metric": "ops_per_sec"})])
    b = db.create_bisection("calc", TARGET, "perf", {"benchmark": "spin", "metric": "ops_per_sec"}, revs[36],
                            revs[39], "night-40")
    db.update_bisection(b.id, state="found", culprit_rev=revs[38],
                        probes=[{"rev": revs[k], "verdict": v} for k, v in ((36, "good"), (39, "bad"), (37, "good"),
                                                                            (38, "bad"))])
    return base / "farm.toml", revs, now


def _prefixes(store: ArtifactStore) -> set[str]:
    return {"/".join(k.split("/")[:2]) for k, _, _ in store.objects()}


def _folders(config: Path) -> set[str]:
    return {d.name for d in (config.parent / "state" / "runs").iterdir()}


def test_pruning_60_nights_keeps_exactly_what_the_policy_says(store60: tuple[Path, list[str], float]) -> None:
    config, revs, _ = store60
    cfg = config_mod.load(config)
    store = ArtifactStore(cfg.s3, retry_for=10)
    before = _prefixes(store)
    assert len([p for p in before if p.startswith("artifacts/")]) == NIGHTS
    assert len(_folders(config)) == NIGHTS + 2
    usage = gearfarm("store", "usage", "--config", str(config), "--days", "5")
    assert usage.returncode == 0, usage.stderr
    for why in ("tagged v1.0", "tagged v1.1", "judged by bisect-1 (bad)", "culprit of bisect-1",
                "last good of regression #1", "first bad of regression #2",
                f"last good build of calc on {TARGET} (the next baseline)", "first showed regression #1"):
        assert why in usage.stdout, f"{why!r} not in:\n{usage.stdout}"
    p = gearfarm("store", "prune", "--config", str(config), "--days", "5")
    assert p.returncode == 0, p.stdout + p.stderr
    # Kept revisions (1-based nights): tags 10 and 25; the failure's last good 19 and first
    # bad 20; the performance change's 37 and 40 and the bisection's 38 and 39; the last good
    # build, 49 (50 on fail); and 56-60, younger than 5 days.
    nights = {10, 25, 19, 20, 37, 38, 39, 40, 49, *range(56, NIGHTS + 1)}
    want = ({f"artifacts/{revs[n - 1]}" for n in nights} | {f"sources/{revs[n - 1]}" for n in nights}
            | {f"{top}/night-{n}" for n in (20, 40, *range(56, NIGHTS + 1)) for top in ("runs", "cancels")}
            | {"catalogs/" + "c" * 64 + ".toml"})
    after = _prefixes(store)
    assert after == want, f"kept but should not be: {sorted(after - want)}; lost: {sorted(want - after)}"
    # On disk: the same runs' folders, and the stray folder younger than the limit.
    folders = _folders(config)
    want_folders = {f"night-{n}" for n in (20, 40, *range(56, NIGHTS + 1))} | {"stray-new"}
    assert folders == want_folders, f"kept: {sorted(folders - want_folders)}; lost: {sorted(want_folders - folders)}"
    assert (config.parent / "state" / "runs" / "night-20" / "report.eml").is_file()
    # The dashboard's output of the nightlies it started goes with their runs: night 5's is
    # pruned, night 20's (it first showed a regression) and night 57's (young) stay.
    web = {f.name for f in (config.parent / "state" / "web").iterdir()}
    assert web == {f"night-{n}.log{x}" for n in (20, 57) for x in ("", ".1")}, web
    # The logs the records carried go with their runs too; the records (the history) stay.
    carried = carried_files(cfg.database.url)
    assert carried == {f"night-{n}:{TARGET}:test-unit/log.txt": f"night-{n} ran\n".encode()
                       for n in (20, 40, *range(56, NIGHTS + 1))}, sorted(carried)
    assert len(ResultsDB(cfg.database.url).jobs("night-5")) == 2
    # Every S3 prefix that went, and night 3's and the old stray's folders, whose S3 files were
    # already gone: one entry each.
    # (A run's cancel markers are part of its entry.)
    gone = {x for x in before - after if not x.startswith("cancels/")}
    assert f"pruned {len(gone) + 2} entries" in p.stdout, p.stdout
    assert f"and {NIGHTS + 2 - len(folders)} run folders on disk" in p.stdout, p.stdout
    # A second prune finds nothing more to do, and says nothing: from cron, no mail.
    again = gearfarm("store", "prune", "--config", str(config), "--days", "5")
    assert (again.returncode, again.stdout, again.stderr) == (0, "", ""), again
    assert _prefixes(store) == after and _folders(config) == folders


def test_pruning_refuses_a_results_database_with_no_runs(store60: tuple[Path, list[str], float],
                                                         tmp_path: Path) -> None:
    config, _, _ = store60
    cfg = config_mod.load(config)
    cfg.database.url = f"sqlite:///{tmp_path / 'empty.db'}"
    config_mod.dump(cfg, tmp_path / "farm.toml")
    store = ArtifactStore(cfg.s3, retry_for=10)
    before, folders = _prefixes(store), _folders(config)
    p = gearfarm("store", "prune", "--config", str(tmp_path / "farm.toml"), "--days", "1")
    assert p.returncode == 2 and "has no runs" in p.stderr and "[database] url" in p.stderr, p.stdout + p.stderr
    assert _prefixes(store) == before and _folders(config) == folders
