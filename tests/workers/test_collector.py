"""The collector process (gearfarm.workers.collector) through real gearmand and a real
PostgreSQL: while one record waits for the database, the others' claims and records are still
taken, and nothing waiting is lost."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from gearfarm import config as config_mod
from gearfarm.config import Config, DatabaseConfig, FarmConfig, GearmanConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats.job import JobId
from gearfarm.formats.lease import Lease, seal_lease
from gearfarm.formats.result import CaseResult, ResultRecord, seal_record
from gearfarm.gearman import Client
from gearfarm.hosts import process
from gearfarm.hosts.gearmand import Gearmand
from tests.farmkit import ROOT, keyed, wait_for
from tests.pg import pg_server, pg_url  # noqa: F401 - fixtures

T = "linux-x86_64"


def test_a_record_waiting_for_the_database_holds_up_no_other_claim_or_record(
        tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    """A 5,000-job night on 64 hosts waited on one collector taking one record at a time
    (docs/speed.md, "At scale"): each worker's claim queued behind every record. Here run
    "slow"'s row is locked, as closing a run locks it, so its record waits inside the collector;
    meanwhile another run's claim is answered and its record applied, and once the lock goes the
    waiting record is applied too: every offer is in the deliveries table, once. (With
    collector_threads = 1 the other claim times out.) The farm's default config does this."""
    with Gearmand(tmp_path / "gm") as gm:
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]),
                     database=DatabaseConfig(url=pg_url),
                     farm=FarmConfig(repo=str(ROOT), state_dir=str(tmp_path), **keyed(tmp_path, pg_url)))  # type: ignore[arg-type]
        config_mod.dump(cfg, tmp_path / "f.toml")
        db = ResultsDB(pg_url)
        slow, fast = JobId("slow", T, "test-unit"), JobId("fast", T, "test-unit")
        for jid in (slow, fast):
            db.create_run(jid.run_id, "a" * 40, [T], [str(jid)])
            db.set_live(jid.run_id, {str(jid): ("queued", 1)})
        signer, host = cfg.host_signer(), cfg.host_name()

        def claim(jid: JobId) -> bytes:
            return seal_lease(Lease(job_id=str(jid), attempt=1, host=host, worker="w", beat=0), signer)

        def record(jid: JobId) -> bytes:
            return seal_record(ResultRecord(
                job_id=str(jid), run_id=jid.run_id, target=T, kind="test", step="test-unit", name="unit",
                rev="a" * 40, status="passed", attempt=1, worker="w", started_at=1.0, finished_at=2.0,
                host={"hostname": host}, cases=[CaseResult(name="c", status="passed")]), signer)

        u = make_url(pg_url)
        collector = process.spawn([sys.executable, "-m", "gearfarm.cli", "collector", "--config",
                                   str(tmp_path / "f.toml")], tmp_path / "collector.log", cwd=ROOT)
        try:
            with Client([gm.address]) as c, psycopg.connect(host=u.host, port=u.port, user=u.username,
                                                            dbname=u.database) as lock:
                assert c.submit("collect", claim(slow), unique="c-slow", timeout=60) == b"granted "
                lock.execute("SELECT 1 FROM runs WHERE run_id = 'slow' FOR UPDATE")
                c.submit_background("collect", record(slow), unique="r-slow")
                wait_for("the slow record to wait on the run's lock", lambda: lock.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'").fetchone()[0] > 0)  # type: ignore[index]
                t0 = time.monotonic()
                assert c.submit("collect", claim(fast), unique="c-fast", timeout=20) == b"granted "
                c.submit_background("collect", record(fast), unique="r-fast")
                wait_for("the fast record", lambda: [d.outcome for d in db.deliveries("fast")] == ["applied"], 20)
                took = time.monotonic() - t0
                assert db.deliveries("slow") == []  # still waiting for the lock, not dropped
                lock.rollback()
                wait_for("the slow record", lambda: [d.outcome for d in db.deliveries("slow")] == ["applied"], 30)
        finally:
            process.stop(collector)
    assert {r.job_id: r.status for r in db.jobs("slow") + db.jobs("fast")} == {str(slow): "passed",
                                                                              str(fast): "passed"}
    print(f"\nwith a record waiting on the database, another run's claim and record went through in {took:.2f}s")
