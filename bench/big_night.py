"""The report and the dashboard of one big night (issue #38), without running the night: the
history of a synthetic project shaped like bench/scale.py's (targets × (build + suites), each
suite 40 JUnit cases, a few of them failing: some for nights, some new tonight, some now and
then) written straight into a throw-away PostgreSQL, the last night's job files (log, JUnit)
into a real MinIO, then

* the last night's report built as the nightly builds it (scale.build_report: publisher.publish
  on the records the database holds, read before the clock starts, as the nightly has them),
  timed, then its job files' copies to disk;
* `gearfarm web` asked for that night's pages (scale.dashboard): the first look (a fresh
  dashboard makes what it keeps of an ended night) and then the worst of three each.

It isolates what bench/scale.py measures after a night (the same two functions) from the
night's own twenty minutes, so a change to the report or the pages is measured in one. Goals
(issue #38): the report of a 5,000-job night in ≤ 5 s, every page under 200 ms.

    sudo .venv/bin/python bench/big_night.py [--jobs 5000] [--nights 4] [--profile DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from scale import CASES, build_report, dashboard, layout, postgres  # noqa: E402  (its checkout's gearfarm)

from gearfarm.config import Config, DatabaseConfig, FarmConfig, dump  # noqa: E402
from gearfarm.db.results import Case, JobRow, ResultsDB, Run  # noqa: E402
from gearfarm.formats.result import ResultRecord  # noqa: E402
from gearfarm.hosts.minio_server import MinioServer  # noqa: E402
from gearfarm.s3 import keys  # noqa: E402
from gearfarm.s3.store import ArtifactStore  # noqa: E402

PROJECT = "big"
DAY = 86400.0


def night_records(run_id: str, last: bool, rev: str, at: float, targets: list[str], suites: int,
                  rng: random.Random) -> list[ResultRecord]:
    """One night's records: every build passes; a suite fails when one of its cases does: case 0 of
    every 97th suite fails for nights in a row (known), case 1 of every 211th only on the last
    night built here (new), case 2 of every 61st now and then (flaky)."""
    out = []
    for ti, t in enumerate(targets):
        out.append(ResultRecord(
            job_id=f"{run_id}:{t}:build", run_id=run_id, target=t, kind="build", step="build", rev=rev,
            status="passed", worker=f"host{ti % 64}", submitted_at=at, started_at=at + 1, finished_at=at + 3,
            timings={"queue_wait": 0.5, "build": 2.0, "upload": 0.01}, artifact_key=f"builds/{rev}/{t}/a.tar.gz",
            artifact_sha256="0" * 64, log_key=keys.job_file(run_id, t, "build", "log.txt"),
            host={"class": "scale"}))
        for s in range(suites):
            step, k = f"test-s{s:03d}", ti * suites + s
            bad = {0} if k % 97 == 0 else set()
            bad |= {1} if k % 211 == 0 and last else set()
            bad |= {2} if k % 61 == 0 and rng.random() < 0.3 else set()
            cases = [{"classname": f"s{s:03d}", "name": f"case_{c}", "status": "failed" if c in bad else "passed",
                      "time": 0.001, "message": "assertion failed: x == y" if c in bad else ""}
                     for c in range(CASES)]
            start = at + 3 + rng.uniform(0, 60)
            out.append(ResultRecord(
                job_id=f"{run_id}:{t}:{step}", run_id=run_id, target=t, kind="test", step=step, name=f"s{s:03d}",
                rev=rev, status="failed" if bad else "passed", worker=f"host{k % 64}", submitted_at=at + 3,
                started_at=start, finished_at=start + rng.uniform(0.3, 6),
                timings={"queue_wait": 0.2, "download": 0.01, "verify": 0.002, "test": 0.6},
                artifact_key=f"builds/{rev}/{t}/a.tar.gz", artifact_sha256="0" * 64,
                log_key=keys.job_file(run_id, t, step, "log.txt"),
                junit_key=keys.job_file(run_id, t, step, "junit.xml"),
                message="1 of 40 cases failed" if bad else "", log_tail="case failed\n" * 20 if bad else "",
                cases=cases, host={"class": "scale"}))
    return out


def populate(db: ResultsDB, nights: int, targets: list[str], suites: int, seed: int = 38) -> list[str]:
    """``nights`` finished runs, one a day, the last one yesterday; their run ids, oldest first."""
    rng = random.Random(seed)
    start = time.time() - nights * DAY
    run_ids = []
    for i in range(nights):
        rid, at, rev = f"big-{i + 1:03d}", start + i * DAY, f"{rng.getrandbits(160):040x}"
        records = night_records(rid, i == nights - 1, rev, at, targets, suites, rng)
        with db.writing() as conn:
            conn.execute(Run.__table__.insert().values(
                run_id=rid, rev=rev, created_at=at, finished_at=at + 600, expected=[r.job_id for r in records],
                targets=targets, state="finished", notes={"seed": i}, parent_run_id=None,
                reported_at=at + 600, deadline=None, project=PROJECT, catalog_sha256=None))
            conn.execute(JobRow.__table__.insert(), [
                {"job_id": r.job_id, "run_id": rid, "target": r.target, "kind": r.kind, "step": r.step,
                 "status": r.status, "attempt": 1, "worker": r.worker, "started_at": r.started_at,
                 "finished_at": r.finished_at, "record": r.model_dump(mode="json"), "host_id": None, "prio": 1,
                 "digest": r.digest} for r in records])
            conn.execute(Case.__table__.insert(), [
                {"job_id": r.job_id, "run_id": rid, "target": r.target, "suite": r.name, "classname": c.classname,
                 "name": c.name, "status": c.status, "time": c.time, "message": c.message}
                for r in records for c in r.cases])
        run_ids.append(rid)
    return run_ids


def upload_files(store: ArtifactStore, records: list[ResultRecord]) -> None:
    """Each job's log (a few KiB) and JUnit file, as its worker left them."""
    def put(r: ResultRecord) -> None:
        store.put_bytes(r.log_key or "", (f"{r.job_id}: ran\n" * 60).encode(), "text/plain")
        if r.junit_key:
            body = "".join(f'<testcase classname="{c.classname}" name="{c.name}" time="0.001"/>' for c in r.cases)
            store.put_bytes(r.junit_key, f'<testsuite name="{r.name}">{body}</testsuite>'.encode(), "application/xml")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, records))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--per-target", type=int, default=50, help="jobs a target (scale.py's default)")
    ap.add_argument("--nights", type=int, default=4, help="nights in the history, the measured one included")
    ap.add_argument("--profile", type=Path, help="the report's build under cProfile (DIR/report.prof)")
    args = ap.parse_args()
    n_targets, suites = layout(args.jobs, args.per_target)
    targets = [f"linux-s{i:03d}" for i in range(n_targets)]
    with tempfile.TemporaryDirectory(prefix="gf-big-night-") as tmp_name, postgres() as (db_url, _):
        tmp = Path(tmp_name)
        with MinioServer(tmp / "minio") as minio:
            cfg = Config(database=DatabaseConfig(url=db_url), s3=minio.s3_config(),
                         farm=FarmConfig(state_dir=str(tmp / "state")))
            config = tmp / "farm.toml"
            dump(cfg, config)
            db = ResultsDB(db_url)
            t0 = time.perf_counter()
            run_ids = populate(db, args.nights, targets, suites)
            made = time.perf_counter() - t0
            last = run_ids[-1]
            t0 = time.perf_counter()
            upload_files(ArtifactStore(cfg.s3), db.jobs(last))
            uploaded = time.perf_counter() - t0
            db.engine.dispose()
            print(f"# big night: {args.jobs} jobs ({n_targets} targets × (build + {suites} suites of {CASES} cases)), "
                  f"{args.nights} nights of history made in {made:.0f} s, job files put in {uploaded:.0f} s")
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
            took, copies = build_report(config, args.profile, run_id=last)
            print(f"report build s: {took - copies:.2f} (then its job files copied to disk: {copies:.2f} s)")
            before = run_ids[-2] if len(run_ids) > 1 else last
            first: dict[str, float] = {}
            pages = dashboard(config, tmp, (targets[0], "test-s000"), before, run_id=last, first=first)
            print("| page | first look ms | then, worst of 3 ms |\n|---|---|---|")
            for page, ms in pages.items():
                print(f"| {page} | {first[page]:.0f} | {ms:.0f} |")


if __name__ == "__main__":
    main()
