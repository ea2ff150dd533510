"""The collector process (gearfarm.workers.collector) through real gearmand and a real
PostgreSQL: while records wait for the database, the others' claims and records are still taken,
and nothing waiting is lost."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
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
from tests.farmkit import ROOT, keyed, settled_descriptors, wait_for

T = "linux-x86_64"
WAITING = 8  # records held up at once


def test_records_waiting_for_the_database_hold_up_no_other_claim_or_record(
        tmp_path: Path, pg_url: str) -> None:
    """A 5,000-job night on 64 hosts waited on the collector (docs/speed.md, "At scale"): one
    thread, then four, each spending most of a record waiting on the database, applied 12 records
    a second with 650 queued behind them, and each worker's claim waited its turn. Here eight
    runs' rows are locked, as closing a run locks it, so their eight records wait inside the
    collector; meanwhile another run's claim is answered and its record applied, and once the
    locks go the waiting records are applied too: every offer is in the deliveries table, once.
    (With collector_threads = 4 or fewer the other claim times out.) The farm's default config
    does this. And the collector holds as many connections after the burst as before it: its
    pool is open from its start, so a database's connection limit that is too small for it is
    found then, not on the first busy night (it opened them as records first overlapped)."""
    with Gearmand(tmp_path / "gm") as gm:
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]),
                     database=DatabaseConfig(url=pg_url),
                     farm=FarmConfig(repo=str(ROOT), state_dir=str(tmp_path), **keyed(tmp_path, pg_url)))  # type: ignore[arg-type]
        config_mod.dump(cfg, tmp_path / "f.toml")
        db = ResultsDB(pg_url)
        slow = [JobId(f"slow{i}", T, "test-unit") for i in range(WAITING)]
        fast = JobId("fast", T, "test-unit")
        for jid in [*slow, fast]:
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

        def applied(run_ids: list[str]) -> list[str]:
            return [d.outcome for r in run_ids for d in db.deliveries(r)]

        u = make_url(pg_url)
        collector = process.spawn([sys.executable, "-m", "gearfarm.cli", "collector", "--config",
                                   str(tmp_path / "f.toml")], tmp_path / "collector.log", cwd=ROOT)
        try:
            where = dict(host=u.host, port=u.port, user=u.username, dbname=u.database)
            # The count from a connection of its own: a transaction sees pg_stat_activity as it
            # was at its first look.
            with Client([gm.address]) as c, psycopg.connect(**where) as lock, \
                    psycopg.connect(**where, autocommit=True) as look:
                for jid in slow:
                    assert c.submit("collect", claim(jid), unique=f"c-{jid.run_id}", timeout=60) == b"granted "
                before = settled_descriptors(collector.pid)
                lock.execute("SELECT 1 FROM runs WHERE run_id LIKE 'slow%' FOR UPDATE")
                for jid in slow:
                    c.submit_background("collect", record(jid), unique=f"r-{jid.run_id}")
                wait_for("the slow records to wait on their runs' locks", lambda: look.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'").fetchone()[0] == WAITING, 20)  # type: ignore[index]
                t0 = time.monotonic()
                assert c.submit("collect", claim(fast), unique="c-fast", timeout=20) == b"granted "
                c.submit_background("collect", record(fast), unique="r-fast")
                wait_for("the fast record", lambda: applied(["fast"]) == ["applied"], 20)
                took = time.monotonic() - t0
                assert applied([j.run_id for j in slow]) == []  # still waiting for the locks, not dropped
                lock.rollback()
                wait_for("the slow records", lambda: applied([j.run_id for j in slow]) == ["applied"] * WAITING, 30)
                assert settled_descriptors(collector.pid) == before
        finally:
            process.stop(collector)
    assert {r.job_id: r.status for j in [*slow, fast] for r in db.jobs(j.run_id)} == \
        {str(j): "passed" for j in [*slow, fast]}
    print(f"\nwith {WAITING} records waiting on the database, another run's claim and record went through "
          f"in {took:.2f}s")


def test_an_idle_collector_asks_gearmand_for_records_only_when_woken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of the collector's threads asked every gearmand for a job once a second, woken or
    not: 16 threads and two servers, 32 grabs a second for nothing, most of an idle collector's
    CPU and a third of its grabs in a 500-job night (docs/speed.md). gearmand wakes a sleeping
    thread for each job it queues; the unwoken ask is a net, every IDLE_POLL seconds
    (gearfarm.hosts.connection, as for the worker slots). A claim sent to the idle collector is
    answered at once all the same."""
    from gearfarm.gearman import admin
    from gearfarm.gearman.worker import Worker
    from gearfarm.workers import collector

    grabs: list[float] = []
    real = Worker._grab

    def counted(self: Worker, server: object) -> object:
        grabs.append(time.monotonic())
        return real(self, server)  # type: ignore[arg-type]

    monkeypatch.setattr(Worker, "_grab", counted)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with Gearmand(tmp_path / "gm") as gm:
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]), database=DatabaseConfig(url=url),
                     farm=FarmConfig(repo=str(ROOT), state_dir=str(tmp_path), collector_threads=4,
                                     **keyed(tmp_path, url)))  # type: ignore[arg-type]
        stop = threading.Event()
        serving = threading.Thread(target=collector.serve, args=(cfg, stop), daemon=True)
        serving.start()
        try:
            wait_for("the collector's four threads", lambda: getattr(
                admin.status(*gm.address).get("collect"), "workers", 0) == 4, 30)
            time.sleep(0.5)
            grabs.clear()
            time.sleep(3.0)
            idle = len(grabs)
            jid = JobId("idle", T, "test-unit")
            lease = seal_lease(Lease(job_id=str(jid), attempt=1, host=cfg.host_name(), worker="w", beat=0),
                               cfg.host_signer())
            t0 = time.monotonic()
            with Client([gm.address]) as c:
                answer = c.submit("collect", lease, unique="c-idle", timeout=10)
            took = time.monotonic() - t0
        finally:
            stop.set()
            serving.join(30)
    assert idle <= 4, f"four idle threads asked gearmand for a job {idle} times in 3 s"
    assert answer == b"refused idle:linux-x86_64:test-unit: its run is unknown" and took < 1.0, (answer, took)


def test_a_database_that_cannot_give_the_collector_its_connections_is_named_at_its_start(
        tmp_path: Path, pg_url: str) -> None:
    """The collector keeps a database connection a thread. It opened them as records first
    overlapped, so a server that allowed fewer ran it until the first busy night and then
    refused a thread mid-record, which the collector takes for an outage and retries. It opens
    them all when it starts: a server that cannot give them stops it there, with the fix."""
    u = make_url(pg_url)
    role = f"few_{u.database}"
    with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database, autocommit=True) as su:
        # A role's limit, as a database's: the test's superuser is held to neither.
        su.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 3')  # type: ignore[arg-type]
        su.execute(f'ALTER DATABASE "{u.database}" OWNER TO "{role}"')  # type: ignore[arg-type]
    url = u.set(username=role).render_as_string(hide_password=False)
    with Gearmand(tmp_path / "gm") as gm:
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]), database=DatabaseConfig(url=url),
                     farm=FarmConfig(repo=str(ROOT), state_dir=str(tmp_path), collector_threads=8,
                                     **keyed(tmp_path, url)))  # type: ignore[arg-type]
        config_mod.dump(cfg, tmp_path / "f.toml")
        p = process.spawn([sys.executable, "-m", "gearfarm.cli", "collector", "--config", str(tmp_path / "f.toml")],
                          tmp_path / "collector.log", cwd=ROOT)
        try:
            code: int | None = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            process.stop(p)
    said = (tmp_path / "collector.log").read_text()
    assert code not in (0, None), said
    assert "refused connection 4 of the 8 this process keeps open" in said, said
    assert "too many connections for role" in said and "lower [farm] collector_threads" in said, said
    assert "Traceback" not in said, said
