"""The collector: the one writer of the results database. It takes result records from the
`collect` Gearman function and upserts them, one row per job id."""

from __future__ import annotations

import logging
import signal
import threading

from gearfarm.workers.base import ssl_context
from pydantic import ValidationError

from gearfarm.config import Config
from gearfarm.gearman import Job, Worker
from gearfarm.job import COLLECT_FUNCTION
from gearfarm.result import ResultRecord
from gearfarm.store import ResultsDB

log = logging.getLogger("gearfarm.collector")


def make_handler(db: ResultsDB):  # noqa: ANN201 - returns the gearman handler
    def handle(job: Job) -> bytes:
        try:
            rec = ResultRecord.model_validate_json(job.data)
        except ValidationError as e:
            log.error("REJECTED result record %s: %s", job.handle, e.errors()[0])
            raise
        changed = db.upsert(rec, host_class=rec.host.get("class", ""))
        log.info("%s %s: %s", "stored" if changed else "duplicate", rec.job_id, rec.status)
        return b"ok"

    return handle


def serve(cfg: Config, stop: threading.Event | None = None) -> None:
    db = ResultsDB(cfg.database.url)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    worker = Worker(cfg.gearman.addresses(), client_id="collector", ssl_context=ssl_context(cfg),
                    server_hostname=cfg.gearman.tls_server_name)
    worker.register(COLLECT_FUNCTION, make_handler(db))
    log.info("collector storing into %s", db.engine.url.render_as_string(hide_password=True))
    try:
        worker.work(stop)
    finally:
        worker.close()
