"""What every worker role shares: connecting to gearmand and S3, checking payloads before
anything runs, a heartbeat while a job runs, and delivering the result record (to S3 first,
the durable copy, then to the collector through Gearman, spooling locally when that fails)."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable

from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore, StoreError

from gearfarm import host
from gearfarm.config import Config
from gearfarm.gearman import Client, GearmanError, Job, Worker
from gearfarm.job import COLLECT_FUNCTION, Payload, PayloadError, unique_id, verify
from gearfarm.result import ResultRecord
from gearfarm.tls import client_context

log = logging.getLogger("gearfarm.worker")
HEARTBEAT_SECONDS = 5.0


def ssl_context(cfg: Config) -> ssl.SSLContext | None:
    """TLS to the job servers (stunnel in front of gearmand) when the config names a CA."""
    if not cfg.gearman.tls_ca:
        return None
    return client_context(cfg.path(cfg.gearman.tls_ca))


def gearman_client(cfg: Config) -> Client:
    return Client(cfg.gearman.addresses(), ssl_context=ssl_context(cfg),
                  server_hostname=cfg.gearman.tls_server_name)


class Context:
    """One worker process's connections and identity."""

    def __init__(self, cfg: Config, role: str) -> None:
        self.cfg = cfg
        self.role = role
        self.name = f"{socket.gethostname()}-{role}-{os.getpid()}"
        self.repo = cfg.path(cfg.farm.repo)
        self.state = cfg.path(cfg.farm.state_dir)
        # Per host and role, not per process: a restarted worker delivers what its
        # predecessor spooled.
        self.spool = self.state / "spool" / f"{socket.gethostname()}-{role}"
        self.store = ArtifactStore(cfg.s3)
        self.client = gearman_client(cfg)
        self.host = host.fingerprint()
        self._spool_lock = threading.Lock()

    def deliver(self, rec: ResultRecord) -> None:
        """Report a result; never loses it: on failure it waits in the local spool."""
        body = rec.model_dump_json().encode()
        try:
            self._publish(rec, body)
        except Exception as e:  # whatever went wrong, the record must survive: spool it
            self.spool.mkdir(parents=True, exist_ok=True)
            path = self.spool / f"{hashlib.sha256(rec.job_id.encode()).hexdigest()[:16]}-{rec.attempt}.json"
            path.write_bytes(body)
            log.warning("result of %s spooled to %s (%s); will deliver when possible", rec.job_id, path, e)

    def _publish(self, rec: ResultRecord, body: bytes) -> None:
        """S3 first (the durable copy the nightly reconciles from), then the collector. The
        body's digest is in the unique id: a changed record is a new delivery, the very same
        record sent twice (a spool replay) is deduplicated by gearmand while queued."""
        self.store.put_bytes(keys.result(rec.run_id, rec.target, rec.step), body, "application/json")
        salt = hashlib.sha256(body).hexdigest()
        self.client.submit_background(COLLECT_FUNCTION, body, unique=unique_id(rec.job_id, rec.attempt, salt))

    def flush_spool(self) -> None:
        with self._spool_lock:
            if not self.spool.is_dir():
                return
            for path in sorted(self.spool.glob("*.json")):
                try:
                    body = path.read_bytes()
                    self._publish(ResultRecord.model_validate_json(body), body)
                except FileNotFoundError:
                    continue  # a sibling worker of this host and role delivered it
                except (StoreError, GearmanError, OSError):
                    return
                path.unlink(missing_ok=True)
                log.info("delivered spooled result %s", path.name)

    def record(self, p: Payload, status: str, **fields: object) -> ResultRecord:
        return ResultRecord(job_id=p.job_id, run_id=p.run_id, target=p.target, kind=p.kind, step=p.step,
                            name=p.name, rev=p.rev, status=status, attempt=p.attempt, worker=self.name,
                            host=self.host, submitted_at=p.submitted_at, **fields)  # type: ignore[arg-type]


RoleHandler = Callable[[Context, Payload, Job], ResultRecord]


def _handler(ctx: Context, role_handler: RoleHandler) -> Callable[[Job], bytes]:
    def handle(job: Job) -> bytes:
        try:
            p = verify(job.data, ctx.cfg.farm.secrets, ctx.cfg.farm.payload_max_age)
            if p.function != job.function:
                raise PayloadError(f"payload for {p.function} arrived on {job.function}")
        except PayloadError as e:
            # Refused, never executed; the line names the job so an operator can find it.
            log.error("REJECTED job %s on %s: %s", job.handle, job.function, e)
            raise
        log.info("job %s: %s %s at %s", job.handle, p.function, p.step, p.rev[:12])
        stop = threading.Event()

        def beat() -> None:
            # The lease: gearmand sees WORK_STATUS, the farm sees a live job.
            n = 0
            while not stop.wait(HEARTBEAT_SECONDS):
                n += 1
                job.status(n, 0)

        hb = threading.Thread(target=beat, daemon=True)
        hb.start()
        try:
            rec = role_handler(ctx, p, job)
        except Exception as e:  # the farm failed, not the product: say so, never lose the job
            log.exception("job %s failed inside the worker", job.handle)
            rec = ctx.record(p, "infra", message=f"worker error: {type(e).__name__}: {e}",
                             started_at=time.time(), finished_at=time.time())
        finally:
            stop.set()
        ctx.deliver(rec)
        return rec.model_dump_json().encode()

    return handle


def serve(cfg: Config, role: str, functions: dict[str, RoleHandler], stop: threading.Event | None = None) -> None:
    """Run a worker until SIGTERM/SIGINT (or ``stop``)."""
    ctx = Context(cfg, role)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    worker = Worker(cfg.gearman.addresses(), client_id=ctx.name, ssl_context=ssl_context(cfg),
                    server_hostname=cfg.gearman.tls_server_name)
    for fn, h in functions.items():
        worker.register(fn, _handler(ctx, h))
    log.info("worker %s serving %s", ctx.name, ", ".join(sorted(functions)))
    flusher = threading.Thread(target=_flush_loop, args=(ctx, stop), daemon=True)
    flusher.start()
    try:
        worker.work(stop)
    finally:
        worker.close()
        ctx.client.close()


def _flush_loop(ctx: Context, stop: threading.Event) -> None:
    while not stop.wait(5.0):
        try:
            ctx.flush_spool()
        except Exception:  # keep flushing later; a bad spool file must not stop the worker
            log.exception("spool flush failed")
