"""How fast the dashboard answers with a farm's worth of history: a results database of 1,000
runs × 50 jobs (10 targets × build, unit suite, three benchmarks; 20 test cases a suite) and
100 performance series (10 targets × 10 metrics) measured every night, each night 5 A/B pairs
(15 samples), plus 200 regressions with their triage; then `gearfarm web` on loopback, every
page and its JSON fetched over HTTP, each several times. Prints the median and the worst per
page (the goal: every page under 200 ms on this 2-core machine).

    .venv/bin/python bench/web_speed.py [--runs 1000] [--repeat 7] [--keep DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gearfarm.config import Config, DatabaseConfig, FarmConfig, S3Config, WebConfig, dump  # noqa: E402
from gearfarm.db.results import Case, CatalogRow, JobRow, Regression, ResultsDB, Run, SampleRow  # noqa: E402
from gearfarm.formats import catalog as catalog_mod  # noqa: E402
from gearfarm.formats.result import ResultRecord  # noqa: E402
from gearfarm.hosts import process  # noqa: E402
from gearfarm.hosts.net import free_port  # noqa: E402
from gearfarm.report import joblog, publisher  # noqa: E402

TARGETS = [f"linux-t{i:02d}" for i in range(10)]
BENCHMARKS = {"iibench-betree": ["insert_rate", "insert_rate_last10pct", "insert_rate_cpu", "file_bytes"],
              "oltp": ["tps", "p99_ms_t4", "p95_ms_t4"],
              "compress": ["ratio_standard", "ratio_aggressive", "load_rate_standard"]}
CASES = [f"case_{i:02d}" for i in range(20)]
PAIRS = 5
HOST_CLASS = "bench-class"


def populate(db: ResultsDB, runs: int, seed: int = 1) -> list[str]:
    """The history, written with bulk inserts (minutes through the ledger, seconds this way)."""
    rng = random.Random(seed)
    text = (ROOT / "jobs" / "catalog.toml").read_text()
    sha = catalog_mod.digest(text)
    start = time.time() - runs * 86400
    run_ids = []
    with db.writing() as conn:
        conn.execute(db.insert(CatalogRow).values(sha256=sha, text=text, created_at=start))
        for n in range(runs):
            rid = f"night-{n:04d}"
            run_ids.append(rid)
            at = start + n * 86400
            rev = f"{rng.getrandbits(160):040x}"
            steps = ["build", "test-unit", *(f"perf-{b}" for b in BENCHMARKS)]
            expected = [f"{rid}:{t}:{s}" for t in TARGETS for s in steps]
            conn.execute(Run.__table__.insert().values(
                run_id=rid, rev=rev, created_at=at, finished_at=at + 3000, expected=expected, targets=TARGETS,
                state="finished", notes={}, parent_run_id=None, reported_at=at + 3000, deadline=None,
                project="engine", catalog_sha256=sha))
            jobs, cases, samples = [], [], []
            for t in TARGETS:
                for s in steps:
                    kind = s.split("-", 1)[0]
                    jid = f"{rid}:{t}:{s}"
                    # A test that breaks for a stretch of nights now and then, and one flaky test.
                    broken = {c for c in CASES[:3] if (n // 40 + CASES.index(c)) % 9 == 0}
                    if rng.random() < 0.1:
                        broken.add(CASES[5])
                    rec_cases = ([{"classname": "unit", "name": c, "status": "failed" if c in broken else "passed",
                                   "time": 0.01, "message": "boom" if c in broken else ""} for c in CASES]
                                 if s == "test-unit" else [])
                    status = "failed" if broken and s == "test-unit" else "passed"
                    rec_samples = []
                    if kind == "perf":
                        bench = s.split("-", 1)[1]
                        for m in BENCHMARKS[bench]:
                            level = 1000.0 * (1.05 if n > runs * 0.8 and m == "tps" else 1.0)
                            for k in range(PAIRS):
                                new, base = level * rng.gauss(1, 0.02), 1000.0 * rng.gauss(1, 0.02)
                                rec_samples += [{"benchmark": bench, "metric": m, "value": new, "repetition": k,
                                                 "variant": "new"},
                                                {"benchmark": bench, "metric": m, "value": base, "repetition": k,
                                                 "variant": "baseline"},
                                                {"benchmark": bench, "metric": m, "value": new / base,
                                                 "repetition": k, "variant": "ratio"}]
                    rec = ResultRecord(
                        job_id=jid, run_id=rid, target=t, kind=kind, step=s, name=None if kind == "build" else
                        s.split("-", 1)[1], rev=rev, status=status, worker=f"host-{TARGETS.index(t) % 3}",
                        submitted_at=at, started_at=at + 10, finished_at=at + 10 + rng.uniform(20, 300),
                        timings={"queue_wait": 1.0, "build" if kind == "build" else "test": 20.0},
                        log_key=f"runs/{rid}/{t}/{s}/log.txt", cases=rec_cases, samples=rec_samples,
                        log_tail="last lines\n" * 5 if status == "failed" else "",
                        baseline_rev=rev if kind == "perf" else None, host={"class": HOST_CLASS})
                    jobs.append({"job_id": jid, "run_id": rid, "target": t, "kind": kind, "step": s, "status": status,
                                 "attempt": 1, "worker": rec.worker, "started_at": rec.started_at,
                                 "finished_at": rec.finished_at, "record": rec.model_dump(mode="json"),
                                 "host_id": None, "prio": 1, "digest": rec.digest})
                    cases += [{"job_id": jid, "run_id": rid, "target": t, "suite": "unit", "classname": "unit",
                               "name": c["name"], "status": c["status"], "time": 0.01, "message": c["message"]}
                              for c in rec_cases]
                    samples += [{"job_id": jid, "run_id": rid, "rev": rev, "target": t, "host_class": HOST_CLASS,
                                 "benchmark": x["benchmark"], "metric": x["metric"], "variant": x["variant"],
                                 "repetition": x["repetition"], "value": x["value"]} for x in rec_samples]
            conn.execute(JobRow.__table__.insert(), jobs)
            conn.execute(Case.__table__.insert(), cases)
            conn.execute(SampleRow.__table__.insert(), samples)
        regs = []
        for i in range(200):
            n = rng.randrange(runs)
            regs.append({"kind": "performance" if i % 2 else "failure", "project": "engine",
                         "target": rng.choice(TARGETS), "subject": f"unit/case_{i:03d}" if i % 2 == 0 else
                         f"oltp/tps@{HOST_CLASS}", "first_bad_run": run_ids[n], "first_bad_rev": f"{i:040x}",
                         "last_good_rev": None, "detected_at": start + n * 86400,
                         "detail": {"benchmark": "oltp", "metric": "tps", "direction": "regression", "change": -0.05,
                                    "ci_low": -0.07, "ci_high": -0.03},
                         "state": rng.choice(["untriaged", "investigating", "fixed"]), "state_by": "",
                         "state_note": "", "state_at": None})
        conn.execute(Regression.__table__.insert(), regs)
    return run_ids


def fetch(conn: http.client.HTTPConnection, path: str) -> tuple[int, float, int]:
    t0 = time.perf_counter()
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    return resp.status, (time.perf_counter() - t0) * 1000, len(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--keep", type=Path, help="Build the database here (and reuse it when it is there).")
    args = ap.parse_args()
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="gf-web-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    db_path = tmp / "results.db"
    fresh = not db_path.exists()
    db = ResultsDB(f"sqlite:///{db_path}")
    t0 = time.perf_counter()
    run_ids = populate(db, args.runs) if fresh else [r.run_id for r in reversed(db.runs(args.runs))]
    made = time.perf_counter() - t0
    db.engine.dispose()
    port = free_port()
    cfg = Config(database=DatabaseConfig(url=f"sqlite:///{db_path}"),
                 s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"),  # nothing listens: no store
                 farm=FarmConfig(state_dir=str(tmp / "state")), web=WebConfig())
    config = tmp / "farm.toml"
    dump(cfg, config)
    proc = process.spawn([sys.executable, "-m", "gearfarm.cli", "web", "--config", str(config), "--listen",
                          f"127.0.0.1:{port}"], tmp / "web.log", cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                fetch(conn, "/healthz")
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("the dashboard did not start: " + (tmp / "web.log").read_text()[-2000:])
                time.sleep(0.2)
        last, middle = run_ids[-1], run_ids[len(run_ids) // 2]
        if fresh:  # what publishing each run's report stores (its verdicts), for the two runs shown
            db = ResultsDB(f"sqlite:///{db_path}")
            for rid in (last, middle):
                run = db.get_run(rid)
                assert run is not None
                publisher.classify(db, run, db.jobs(rid))
            db.engine.dispose()
            # A long unit log on disk (the store is down here), for the step page: 5,000 lines.
            log = cfg.runs_dir() / last / joblog.relative(TARGETS[0], "test-unit")
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("".join(f"\x1b[32m[{i:05d}]\x1b[0m unit case_{i % 20:02d} step {i}: ok\n"
                                   for i in range(5000)))
        series = urlencode({"project": "engine", "target": TARGETS[0], "host_class": HOST_CLASS, "benchmark": "oltp",
                            "metric": "tps"})
        pages = ["/", "/runs", f"/run/{last}", f"/run/{middle}", "/test?name=unit/case_01", "/perf",
                 f"/perf/series?{series}", f"/perf/series?{series}&nights=365", f"/compare?a={middle}&b={last}",
                 f"/compare?a={last}&b={last}", "/compare", "/regressions", "/regression/7", "/tests",
                 "/tests?q=case_0", "/hosts", "/live", "/feed.atom"]
        pages += ["/api" + (p if p != "/" else "/status") for p in pages if not p.startswith("/feed")]
        pages += [f"/run/{last}/step/{TARGETS[0]}/test-unit", "/api/"]
        print(f"# gearfarm web speed, {time.strftime('%Y-%m-%d %H:%M')}, database {db_path.stat().st_size / 2**20:.0f} "
              f"MiB ({args.runs} runs x 50 jobs, 100 series; " + (f"made in {made:.0f} s" if fresh else "reused")
              + f"), each page {args.repeat} times after one untimed fetch\n")
        print("| page | status | KiB | median ms | worst ms |")
        print("|---|---|---|---|---|")
        worst_all = 0.0
        for path in pages:
            status, _, size = fetch(conn, path)  # first: caches (git log, null tables) warm
            times = []
            for _ in range(args.repeat):
                status, ms, size = fetch(conn, path)
                times.append(ms)
            worst_all = max(worst_all, max(times))
            print(f"| `{path[:70]}` | {status} | {size / 1024:.0f} | {statistics.median(times):.0f} | "
                  f"{max(times):.0f} |")
        print(f"\nslowest answer of any page: {worst_all:.0f} ms (goal: under 200 ms)")
        print(json.dumps({"worst_ms": round(worst_all, 1)}))
    finally:
        process.stop(proc, timeout=10)


if __name__ == "__main__":
    main()
