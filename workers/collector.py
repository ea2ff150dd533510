"""The collector: takes sealed result records from the `collect` Gearman function and offers
them to the run ledger (and workers' signed claims and heartbeats of job attempts, which the
ledger keeps as leases: gearfarm.formats.lease), which verifies the seal against the registry of host keys and the job,
applies its rules and logs every outcome (rejections included, counted on `gearfarm status`).
While the results database is away (a PostgreSQL restart) it holds the job and retries, so no record is dropped: if the
collector dies meanwhile, gearmand hands the job to the next one. A record that keeps its cases
in S3 (too many for the record) has them read with the collector role's S3 keys, which may read
the runs' files; while S3 does not answer, the record is held the same way."""

from __future__ import annotations

import json
import logging
import threading
import time

from sqlalchemy.exc import SQLAlchemyError

from gearfarm.config import Config
from gearfarm.db.results import ResultsDB
from gearfarm.formats.job import COLLECT_FUNCTION
from gearfarm.formats.lease import MAX_LEASE
from gearfarm.formats.result import CaseStore
from gearfarm.gearman import Job
from gearfarm.hosts.connection import gearman_worker
from gearfarm.run.ledger import Ledger
from gearfarm.s3.store import ArtifactStore, StoreError

log = logging.getLogger(__name__)


def make_handler(ledger: Ledger, store: CaseStore | None = None):  # noqa: ANN201 - the handler
    def handle(job: Job) -> bytes:
        delay = 0.5
        lease = is_lease(job.data)
        while True:
            try:
                if lease:
                    word, why = ledger.lease(job.data)
                    return f"{word} {why}".encode()
                outcome, rec = ledger.accept(job.data, "collect", store)
                break
            except SQLAlchemyError as e:
                # Never WORK_FAIL a record (gearmand would drop it): hold it until the database
                # answers; if this process is stopped meanwhile, gearmand requeues the job.
                log.warning("results database unavailable (%s); retrying in %.1fs", str(e).splitlines()[0], delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except StoreError as e:
                log.warning("cannot read a record's cases from S3 (%s); retrying in %.1fs", e, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        if rec is not None:
            log.info("%s %s: %s (attempt %d)", outcome, rec.job_id, rec.status, rec.attempt)
        return outcome.encode()

    return handle


def is_lease(data: bytes) -> bool:
    """Whether a `collect` job is a worker's claim or heartbeat (gearfarm.formats.lease) rather than a
    result record: both are signed envelopes, told apart by their purpose (which the signature
    covers, so a purpose changed on the way fails verification either way)."""
    if len(data) > MAX_LEASE:
        return False
    try:
        env = json.loads(data)
    except ValueError:
        return False
    return isinstance(env, dict) and env.get("purpose") == "lease"


def serve(cfg: Config, stop: threading.Event | None = None) -> None:
    """Serve `collect` with ``[farm] collector_threads`` Gearman workers, one thread each, that
    share the ledger (and its database pool): gearmand hands each connection its own job, so a
    record waits for the database while the next one is verified. A crash of the process loses
    nothing: gearmand requeues whatever each connection held."""
    n = cfg.farm.collector_threads
    db = ResultsDB(cfg.database.url, connections=n, pre_ping=False)
    # A connection a thread, all open now: a database whose connection limit cannot take them
    # says so at the start, not on the first night whose records overlap.
    db.open_pool("[farm] collector_threads")
    stop = stop or threading.Event()
    if "collector" not in cfg.s3.roles:
        log.warning("no [s3.roles.collector] keys in the config: the collector reads records' cases with the "
                    "farm's own S3 keys, which allow more than it needs")
    store = ArtifactStore(cfg.s3.for_role("collector"))
    handler = make_handler(Ledger(db), store)
    workers = [gearman_worker(cfg, "collector" if i == 0 else f"collector-{i + 1}") for i in range(n)]
    for w in workers:
        w.register(COLLECT_FUNCTION, handler)
    workers[0].stop_on_signals(stop)
    log.info("collector storing into %s with %d thread(s)", db.engine.url.render_as_string(hide_password=True), n)
    threads = [threading.Thread(target=w.work, args=(stop,), name=f"collector-{i + 1}", daemon=True)
               for i, w in enumerate(workers[1:], 1)]
    for t in threads:
        t.start()
    try:
        workers[0].work(stop)
    finally:
        stop.set()
        for w in workers[1:]:
            w.wake()
        for t in threads:
            t.join(60)
