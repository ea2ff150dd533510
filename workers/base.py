"""What every worker role shares: connecting to gearmand and S3, checking payloads before
anything runs (the nightly's signature, unique id, deadline; then the ledger's claim), a heartbeat for
the whole job, the job's dir and log around the kind's own work (an Attempt), and delivering the
result record sealed with this host's own key: into the local spool, then from a thread of its own
to the collector through Gearman (and to S3 when the collector does not answer) while the slot
takes its next job."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import queue
import resource
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from gearfarm.config import Config
from gearfarm.formats import marker
from gearfarm.formats.catalog import Catalog, CatalogError, Target
from gearfarm.formats.job import COLLECT_FUNCTION, Payload, PayloadError, unique_id, verify
from gearfarm.formats.lease import HEARTBEAT_SECONDS, Answer, Lease, beat_every, seal_lease
from gearfarm.formats.lease import answer as lease_answer
from gearfarm.formats.marker import Marker
from gearfarm.formats.result import (
    CASES_CONTENT_TYPE,
    DISPOSITIONS,
    FILES_MAX,
    RecordError,
    ResultRecord,
    file_sum,
    fit,
    pack_file,
    peek_record,
)
from gearfarm.formats.seal import SealError
from gearfarm.formats.words import size_text
from gearfarm.gearman import GearmanError, Job
from gearfarm.hosts import host, jobdisk, process
from gearfarm.hosts.cache import ArchiveCache
from gearfarm.hosts.connection import gearman_client, gearman_worker
from gearfarm.hosts.hostlock import HostLock
from gearfarm.run import snapshot
from gearfarm.run.priority import Durations
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore, StoreError
from gearfarm.step import sandbox

log = logging.getLogger(__name__)
# How long a stopping worker waits for the records it posted to be published.
DRAIN_SECONDS = 10.0
# Records a slot's outbox may have still to publish when the slot takes its next job.
OUTBOX_MAX = 1
# How long the outbox waits for the collector to answer a record before it writes the record's
# S3 copy (which the nightly's reconcile reads) instead; the collector answers in milliseconds.
PUBLISH_WAIT = 5.0
LOG_TAIL_LINES = 40
# How often a running job's slot looks at the state directory's free space ([farm] min_free): a
# job writing at disk speed fills gigabytes between two heartbeats.
SPACE_SECONDS = 1.0


@dataclass
class _Posted:
    """A posted record's two ways out, taken at once (Context.post): its spool file written, and
    its publish. Whichever ends second lets it go: the file goes if the record was published."""

    written: bool = False
    sent: bool | None = None  # None until the outbox tried; then whether the collector took it


class Context:
    """One worker process's connections and identity."""

    def __init__(self, cfg: Config, role: str) -> None:
        self.cfg = cfg
        self.role = role
        self.name = f"{socket.gethostname()}-{role}-{os.getpid()}"
        self.state = cfg.path(cfg.farm.state_dir)
        # Per host and role, not per process: a restarted worker delivers what its
        # predecessor spooled.
        self.spool = self.state / "spool" / f"{socket.gethostname()}-{role}"
        # Job directories, one owner directory per worker process (gearfarm.hosts.process.job_dir).
        self.work = self.state / "work"
        # Where its jobs' own directories go: a disk of their own once serve() opened it.
        self.disk = jobdisk.JobDisk(process.owner_dir(self.work), cfg.farm.job_disk)
        # Verified artifacts this host's test and perf jobs fetched, shared by its workers.
        self.archives = ArchiveCache(self.state / "cache" / "artifacts")
        # The role's own MinIO user: a build may write artifacts, a test may not (s3.keys).
        self.s3 = cfg.s3.for_role(role)
        if role not in cfg.s3.roles:
            log.warning("no [s3.roles.%s] keys in the config: the %s role uses the farm's own S3 keys, which "
                        "allow more than it needs", role, role)
        self.store = ArtifactStore(self.s3)
        self.client = gearman_client(cfg)
        # Checked now: a worker that could not verify payloads or sign results refuses to start.
        self.nightly = cfg.nightly_lookup()
        self.ignored: set[tuple[str, str]] = set()  # markers found forged (key, sha256), each logged once
        self.signer = cfg.host_signer()
        self.host = host.fingerprint()
        # The name the registry knows this host by: the ledger checks a record names its signer.
        self.host["hostname"] = cfg.host_name()
        # Builds and tests share the host; a perf job has it to itself while it measures.
        self.hostlock = HostLock()
        # How long this host's jobs take, for the order its slots take them in next time.
        self.durations = Durations.of_host(self.state)
        self._spool_lock = threading.Lock()
        self._swept = False  # whether this process's flush looked at every owner lock in the spool
        # Records posted and not yet published (post): the flush loop leaves their spool files.
        self._outbox: queue.SimpleQueue[tuple[ResultRecord, bytes, Path]] = queue.SimpleQueue()
        self._posted: dict[Path, _Posted] = {}
        self._posted_lock = threading.Condition()
        # This process's mark on the records it posts (their spool names carry it), held locked
        # for its life: a sibling worker of this host and role leaves them to its outbox, and
        # delivers them once the lock is gone with the process (flush_spool).
        self.owner = f"{os.getpid()}-{secrets.token_hex(3)}"
        self._owner_fd: int | None = None
        threading.Thread(target=self._send_posted, name="outbox", daemon=True).start()
        # A job's files put to S3 beside its log when too large to carry (Attempt.record).
        self.uploads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="uploads")
        # An attempt's claim, asked while the slot prepares the job (Admission).
        self.claims = ThreadPoolExecutor(max_workers=1, thread_name_prefix="claim")
        # A job's heartbeats (Heartbeat), in a thread that outlives the job: a thread started
        # for each job was a millisecond of the job's start on a busy host (Thread.start waits
        # until the new thread runs).
        self.beats = ThreadPoolExecutor(max_workers=2, thread_name_prefix="heartbeat")
        # A job's watch of the state directory's free space (Heartbeat._watch), the same way.
        self.watches = ThreadPoolExecutor(max_workers=2, thread_name_prefix="space")
        # Every this many heartbeats, one signed beat of a job's lease.
        self.lease_beats = beat_every(cfg.farm.lease_timeout)
        # Checked now: a worker that cannot confine its jobs refuses to start.
        self.sandbox = sandbox.for_config(cfg)

    def deliver(self, rec: ResultRecord) -> None:
        """Report a result; never loses it: on failure it waits in the local spool. A record
        whose cases would make it too large for its envelope (gearfarm.formats.result.fit) stores them
        in S3 beside it first, or, on failure, in the spool beside it."""
        self._deliver_sealed(*self._sealed(rec))

    def _sealed(self, rec: ResultRecord) -> tuple[ResultRecord, bytes, bytes | None]:
        """``rec`` fitted to its envelope and sealed (gearfarm.formats.result.fit), said in the log
        before it is kept anywhere: the line is the worker's own account of every record it made,
        which the chaos suite checks the ledger's deliveries against."""
        sealed = fit(rec, self.signer)
        r = sealed[0]
        log.info("SEALED job=%s attempt=%d status=%s reused=%d worker=%s digest=%s", r.job_id, r.attempt, r.status,
                 r.reused_artifact, r.worker, r.digest)
        return sealed

    def _deliver_sealed(self, rec: ResultRecord, body: bytes, blob: bytes | None) -> None:
        try:
            if blob is not None:
                assert rec.cases_key is not None
                self.store.put_bytes(rec.cases_key, blob, CASES_CONTENT_TYPE)
            self._publish(rec, body)
        except Exception as e:  # whatever went wrong, the record must survive: spool it
            if blob is not None:
                self._spool_write(rec, blob, self._spooled_cases(rec))  # first: a spooled record finds them
            path = self._spool_write(rec, body)
            log.warning("result of %s spooled to %s (%s); will deliver when possible", rec.job_id, path, e)

    def post(self, rec: ResultRecord) -> None:
        """Report a result without waiting for it to arrive: sealed, handed to the outbox's
        thread, which publishes it while this slot takes its next job, and written to the spool
        (fsync'd) meanwhile; post returns once it is there. The publish was a third of a slot's
        wait between two jobs (an S3 PUT and a submit), and waiting for the spool's write (a
        new file's fsync, 1.6-1.8 ms on this farm's disks) before the publish was a quarter of
        a record's way to the ledger (docs/speed.md). Nothing is lost by not waiting: a worker
        killed before the publish leaves the record in the spool, and the next worker of this
        host and role delivers it (flush_spool); should S3 or the collector be away, it waits
        there the same. Killed before the spool's write too, it had not completed its Gearman
        job, which gearmand hands to another worker."""
        rec, body, blob = self._sealed(rec)
        path = self.spool / f"{rec.digest[:24]}.{self.owner}.json"
        try:
            if blob is not None:
                # First: the outbox puts a record's cases to S3 from the spool before the record.
                self._spool_write(rec, blob, self._spooled_cases(rec))
            self._own()
        except OSError as e:  # a full or broken disk: then it is delivered now, as it was before
            log.warning("cannot spool the result of %s (%s); delivering it now", rec.job_id, e)
            self._deliver_sealed(rec, body, blob)
            return
        posted = _Posted()
        with self._posted_lock:
            self._posted[path] = posted
            self._outbox.put((rec, body, path))
        try:
            self._spool_write(rec, body, path)
        except OSError as e:
            # Not in the spool: its publish (or, failing that, the error) is the answer.
            log.warning("cannot spool the result of %s (%s); waiting for its publish", rec.job_id, e)
            with self._posted_lock:
                self._posted_lock.wait_for(lambda: posted.sent is not None)
                self._let_go(path, posted)
            if not posted.sent:
                raise
            return
        with self._posted_lock:
            posted.written = True
            if posted.sent is not None:
                self._let_go(path, posted)
            # Not more than OUTBOX_MAX records behind: on a host short of CPU an unbounded outbox
            # falls behind its slot without end (with a record's files in it too, it fell
            # minutes behind at 64 hosts), and the nightly takes jobs whose records wait there
            # for lost.
            self._posted_lock.wait_for(lambda: len(self._posted) <= OUTBOX_MAX)

    def _let_go(self, path: Path, posted: _Posted) -> None:
        """A posted record both written (or not writable) and tried, under _posted_lock: its
        spool file goes if it was published; else it stays for the flush loop."""
        if posted.sent and posted.written:
            path.unlink(missing_ok=True)
        del self._posted[path]
        self._posted_lock.notify_all()

    def close(self) -> None:
        """A stopping worker's last step: its connections go, and its owner lock with them (what
        it spooled is then any sibling's to deliver)."""
        self.claims.shutdown(wait=False, cancel_futures=True)
        self.beats.shutdown(wait=False, cancel_futures=True)
        self.watches.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        if self._owner_fd is not None:
            os.close(self._owner_fd)
            self._owner_fd = None

    def _own(self) -> None:
        """Take this process's owner lock in the spool (once)."""
        if self._owner_fd is None:
            (self.spool / "owners").mkdir(parents=True, exist_ok=True)
            fd = os.open(self.spool / "owners" / self.owner, os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._owner_fd = fd

    def _alive(self, owner: str) -> bool:
        """Whether the worker process that posted under ``owner`` still runs (holds its lock);
        a dead one's lock file goes."""
        if owner == self.owner:
            return True
        at = self.spool / "owners" / owner
        try:
            fd = os.open(at, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        at.unlink(missing_ok=True)
        return False

    def drain(self, timeout: float) -> bool:
        """Wait until every posted record was published or set aside in the spool (a stopping
        worker); False when ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._posted_lock:
                if not self._posted:
                    return True
            time.sleep(0.01)
        return False

    def _send_posted(self) -> None:
        while True:
            rec, body, path = self._outbox.get()
            sent = False
            try:
                self._publish(rec, body)
                sent = True
            except Exception as e:  # it stays in the spool: the flush loop delivers it later
                log.warning("result of %s stays in the spool at %s (%s); will deliver when possible",
                            rec.job_id, path, e)
            finally:
                with self._posted_lock:
                    posted = self._posted[path]
                    posted.sent = sent
                    if posted.written:
                        self._let_go(path, posted)
                    else:
                        self._posted_lock.notify_all()

    def _spooled_cases(self, rec: ResultRecord) -> Path:
        """Where the cases of a spooled record wait (not *.json: flush_spool reads records only)."""
        return self.spool / "cases" / f"{rec.cases_sha256}.json.zst"

    def _spool_write(self, rec: ResultRecord, body: bytes, path: Path | None = None) -> Path:
        """Atomically: a crash mid-write leaves a temp file, never a torn record."""
        path = path or self.spool / f"{rec.digest[:24]}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def _publish(self, rec: ResultRecord, body: bytes) -> None:
        """To the collector, waiting for the ledger's answer; without one (the collector or
        Gearman away, or busier than PUBLISH_WAIT), to S3 as well: the durable copy the nightly
        reconciles from (one key per record). Every record went to S3 before, a request on each
        job's way that, with the job's files', was a third of a job's cost in the farm
        (docs/speed.md, twenty-seventh round); once the ledger answered, the results database
        has it. Without an answer this raises after the copy, which leaves the record in the
        spool, offered again until the ledger answers: the record's digest is in the unique id,
        so gearmand joins a copy it still holds, and the ledger logs one it applied already as a
        duplicate."""
        digest = rec.digest
        if rec.cases_key is not None:
            # A spooled record's cases go first: whoever opens the record reads them at once.
            pending = self._spooled_cases(rec)
            try:
                self.store.put_bytes(rec.cases_key, pending.read_bytes(), CASES_CONTENT_TYPE)
                pending.unlink(missing_ok=True)
            except FileNotFoundError:
                pass  # delivered from here before, or by a sibling worker of this host and role
        try:
            answer = self.client.submit(COLLECT_FUNCTION, body, unique=unique_id(rec.job_id, rec.attempt, digest[:16]),
                                        timeout=PUBLISH_WAIT).decode(errors="replace")
        except (GearmanError, TimeoutError) as e:
            answer = f"no answer ({e})"
        if answer in DISPOSITIONS:
            return
        self.store.put_bytes(keys.result(rec.run_id, rec.target, rec.step, rec.attempt, digest), body,
                             "application/json")
        raise GearmanError(f"the collector did not take the record of {rec.job_id}: {answer[:300]}; "
                           "its copy is in S3, and it stays in the spool until the collector answers")

    def flush_spool(self) -> None:
        with self._spool_lock:
            if not self.spool.is_dir():
                return
            for path in sorted(self.spool.glob("*.json")):
                with self._posted_lock:
                    if path in self._posted:
                        continue  # the outbox has it
                owner = path.name.split(".")[1] if path.name.count(".") == 2 else ""
                if owner and owner != self.owner and self._alive(owner):
                    continue  # a sibling worker's outbox has it
                try:
                    body = path.read_bytes()
                except FileNotFoundError:
                    continue  # a sibling worker of this host and role delivered it
                try:
                    rec = peek_record(body)
                except RecordError as e:
                    # A file that cannot be read never blocks the others: set aside, said once.
                    bad = self.spool / "unreadable"
                    bad.mkdir(exist_ok=True)
                    os.replace(path, bad / path.name)
                    log.error("spool file %s cannot be delivered (%s); moved to %s", path.name, e, bad)
                    continue
                try:
                    self._publish(rec, body)
                except (StoreError, GearmanError, OSError):
                    break  # still away; try again on the next round
                path.unlink(missing_ok=True)
                log.info("delivered spooled result %s", path.name)
            if not self._swept:
                # A gone worker's lock file goes: those of the spool's files' owners above, the
                # rest once in each process's life. At every flush, every slot of a lab on one
                # state directory (bench/scale.py's 128) asked every other's lock every 5 s: in
                # a profile of 64 hosts x 1,000 jobs, about as much of the slots' CPU as the
                # handling of their jobs.
                for at in self.spool.glob("owners/*"):
                    self._alive(at.name)
                self._swept = True

    def short_of_space(self) -> str:
        """Why this host must take no job now ("" when it may): its state directory's filesystem
        has less free than [farm] min_free."""
        free, floor = jobdisk.fs_free(self.state, self.work), self.cfg.farm.min_free
        if free >= floor:
            return ""
        return (f"the disk holding the farm's state ({self.state}) has {size_text(free)} free, below "
                f"[farm] min_free ({size_text(floor)})")

    def record(self, p: Payload, status: str, **fields: object) -> ResultRecord:
        return ResultRecord(job_id=p.job_id, run_id=p.run_id, target=p.target, kind=p.kind, step=p.step,
                            name=p.name, rev=p.rev, status=status, attempt=p.attempt, worker=self.name,
                            host=self.host, submitted_at=p.submitted_at, **fields)  # type: ignore[arg-type]

    def admit(self, p: Payload, job: Job, stop: threading.Event) -> str:
        """Why this genuine payload must not run ("" once it may and its attempt is this
        worker's). What may run is the ledger's answer to the claim: it refuses a job of a run
        reported and closed and one the nightly recorded cancelled, and answers "done" to an
        attempt that ran already (a copy submitted again, or handed on after its worker
        delivered and died). The worker asks S3 nothing before a job: three looks for the
        nightly's markers and a LIST of the attempt's results were most of a slot's wait
        between two jobs and of MinIO's work (docs/speed.md). A cancel the ledger did not know
        yet is found by the heartbeat's look at the markers, within a beat."""
        if job.unique != p.unique:
            return f"it arrived under unique id {job.unique!r}, its payload says {p.unique!r}"
        if time.time() > p.deadline:
            return f"its run's deadline passed at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(p.deadline))}"
        return self.claim(p, stop)

    @functools.cached_property
    def quick_store(self) -> ArtifactStore:
        """For looks that must not wait out an outage: the heartbeat's check for a cancel (its
        thread is the job's lease; five minutes of S3 retries would cost the job its lease).
        Made on first use: a boto3 client is tens of milliseconds of a worker's start."""
        return ArtifactStore(self.s3, retry_for=0.0, attempts=1)

    def _lease(self, p: Payload, beat: int) -> bytes:
        return seal_lease(Lease(job_id=p.job_id, attempt=p.attempt, host=self.host["hostname"], worker=self.name,
                                beat=beat), self.signer)

    def claim(self, p: Payload, stop: threading.Event) -> str:
        """Claim the attempt from the ledger before running it (gearfarm.formats.lease): "" once granted,
        else why not (it ran already, it is not ours to run, or the run ended first). While
        another live worker holds it, or the collector does not answer, it asks again."""
        data = self._lease(p, 0)
        # One pending claim per attempt and worker: asking again while it waits joins it.
        unique = "claim-" + hashlib.sha256(f"{p.unique}|{self.name}".encode()).hexdigest()[:40]
        delay = 1.0
        while True:
            try:
                word, why = lease_answer(self.client.submit(COLLECT_FUNCTION, data, unique=unique, timeout=30,
                                                            priority="high"))
            except (GearmanError, TimeoutError) as e:
                word, why = "held", f"the collector did not answer ({e})"
            if word == "granted":
                return ""
            if word != "held":
                return why
            if time.time() > p.deadline or stop.is_set():
                return f"its lease could not be had before the run's deadline: {why}"
            log.info("job %s attempt %d waits for its lease: %s", p.job_id, p.attempt, why)
            stop.wait(delay)
            delay = min(delay * 2, 10.0)

    def renew(self, p: Payload, beat: int) -> tuple[Answer, str] | None:
        """A signed heartbeat of the held lease: what tells the nightly the job is alive
        (WORK_STATUS can be sent by whatever holds the Gearman job), and the ledger's answer,
        which says `cancelled` once the nightly recorded the job or its run cancelled and
        `refused` once the attempt is no longer this worker's (its run closed, its lease taken
        over), with the ledger's reason; None when
        no answer came within a heartbeat (the collector away or behind). One waits per attempt
        (its unique id): a beat sent while the last one waits joins it."""
        unique = "beat-" + hashlib.sha256(f"{p.unique}|{self.name}".encode()).hexdigest()[:40]
        try:
            return lease_answer(self.client.submit(COLLECT_FUNCTION, self._lease(p, beat), unique=unique,
                                                   timeout=HEARTBEAT_SECONDS, priority="high"))
        except (GearmanError, TimeoutError) as e:
            log.warning("no answer to the heartbeat of %s: %s", p.job_id, e)
            return None

    def cancelled(self, p: Payload) -> bool:
        """Whether a person cancelled the job or its run, by the nightly's signed marker in S3:
        asked only at a beat the ledger did not answer (Heartbeat), since the ledger's answer
        says it otherwise, without waiting out an outage (quick_store), as one LIST of the run's
        markers, which on a night nobody cancels is empty. Only a marker listed at the job's or
        the run's key is read and its seal checked."""
        mine = {m.key: m for m in (Marker("cancel", p.run_id, p.target, p.step), Marker("cancel", p.run_id))}
        listed = [k for k in self.quick_store.list(keys.cancels(p.run_id)) if k in mine]
        return any(self.marked(self.quick_store, mine[k], p) for k in listed)

    def marked(self, store: ArtifactStore, at: Marker, p: Payload) -> bool:
        """Whether the nightly's marker ``at`` is in S3, sealed by the nightly for this run or
        job (gearfarm.formats.marker). Any other object at its key is ignored, said once in the log."""
        try:
            data = store.get_bytes(at.key)
        except ClientError:
            return False  # no such marker (a refusal is a StoreError)
        try:
            m = marker.read(data, self.nightly, at)
        except SealError as e:
            seen = (at.key, hashlib.sha256(data).hexdigest())
            if seen not in self.ignored:
                self.ignored.add(seen)
                log.warning("IGNORED %s marker %s for job %s: %s", at.kind, at.key, p.job_id, e)
            return False
        if m.kind == "cancel":
            log.info("job %s: %s cancelled by %s", p.job_id, "the job" if m.step else "its run", m.who)
        return True


# One job's life, top to bottom: handle_job (the payload accepted, the attempt claimed, under
# heartbeats) → perform_job (what escapes the work becomes the record) → run_step (the kind's
# own work, in its job dir under the host lock) → handle_result (the record delivered). A kind's
# module holds only its work: build.handle, test.handle, perf.handle.

Work = Callable[["Attempt"], ResultRecord]


class Refused(Exception):
    """The attempt is not this worker's to run (its claim's answer): the job is dropped, with no
    record."""


class Admission:
    """An attempt's claim (Context.admit), asked in a thread of its own while the slot prepares
    the job: its catalog, its job dir, its artifact fetched, verified and unpacked, none of which
    runs anything of the project's or writes anything the farm reads. Nothing of the job starts,
    goes to S3 or is recorded before the ledger granted it: ``settle`` waits for the answer
    (Attempt.start before the first command, Attempt.record and refuse before the log's PUT and
    the record, handle_job before delivering), and raises Refused when it was not granted. The
    claim's round trip (gearmand, the collector's transaction, back) and the preparation came one
    after the other, a third of a slot's time between two jobs (docs/speed.md). A claim that
    waits (another worker holds the attempt, or the collector is away) holds the host's shared
    lock meanwhile, as the job it waits to run would."""

    def __init__(self, ctx: Context, p: Payload, job: Job, beat: Heartbeat, t0: float) -> None:
        self.ctx, self.p, self.job, self.beat, self.t0 = ctx, p, job, beat, t0
        # From the job handed over to its claim answered (the farm's own), while the job is prepared.
        self.seconds = 0.0
        self._answer = ctx.claims.submit(self._ask)

    def _ask(self) -> str:
        why = self.ctx.admit(self.p, self.job, self.beat.stop)
        self.seconds = time.monotonic() - self.t0
        if not why:
            self.beat.leased.set()
            log.info("job %s: %s %s at %s, attempt %d", self.job.handle, self.p.function, self.p.step,
                     self.p.rev[:12], self.p.attempt)
        return why

    def settle(self) -> None:
        """Wait for the claim's answer; Refused unless it was granted (an error in asking it is
        raised here, as it was where the claim was asked)."""
        why = self._answer.result()
        if why:
            raise Refused(why)


class Attempt:
    """What a kind's work is given: the payload, its catalog and target, a fresh job dir whose log
    is begun, the timings so far; the moment its commands may start (``start``, once its claim was
    granted), and the two ways a step ends (``record``, ``refuse``)."""

    def __init__(self, ctx: Context, p: Payload, cat: Catalog, target: Target, tmpd: Path, started: float,
                 admission: Admission, disk: Path | None = None) -> None:
        self.ctx, self.p, self.cat, self.target, self.tmpd, self.started = ctx, p, cat, target, tmpd, started
        # The job's own directories (its tree, scratch, $HOME) go on its disk; ``tmpd`` keeps the
        # worker's files of the job (its log, archives), which a full job disk cannot fail.
        self.disk = disk or tmpd
        self.admission = admission
        self.timings: dict[str, float] = {"queue_wait": max(0.0, started - p.submitted_at)}
        self.log_path = tmpd / f"{ctx.role}.log"
        self.log_path.write_text(f"gearfarm {p.step} of {p.project} for {p.target} at {p.rev} on {ctx.name}\n")

    def settle(self) -> None:
        """Wait for the claim's answer (Admission.settle): for work that must not start before it
        but is not a command, such as a benchmark taking the host to itself."""
        self.admission.settle()

    def start(self) -> None:
        """Before the job's first command: its claim granted (else Refused), then one line per start,
        which is what the chaos suite counts."""
        self.admission.settle()
        log.info("COMMAND START job=%s attempt=%d worker=%s", self.p.job_id, self.p.attempt, self.ctx.name)

    def note(self, text: str) -> None:
        with self.log_path.open("a") as f:
            f.write(text + "\n")

    def scratch(self) -> Path:
        """The job's scratch dir, made when asked: a build that reuses a stored artifact has none."""
        scratch = self.disk / "scratch"
        scratch.mkdir()
        return scratch

    def record(self, status: str, message: str = "", files: dict[str, tuple[Path, str]] | None = None,
               **fields: object) -> ResultRecord:
        """The record of work that ran, naming its log and ``files`` (JOB_FILES name: path and
        content type, such as a suite's junit.xml) by their sha256 and size, which every reader
        checks; one that is not `passed` carries the log's tail, which is what a person reads
        first. A build's or test's files travel in the record while they fit (FILES_MAX, the log
        first), and the ledger keeps them with it: they are durable when the record is, and no
        request to S3 is on the job's way, which with those of each record's copy was a third of
        a job's cost in the farm (docs/speed.md, twenty-seventh round). Larger ones, and a
        benchmark's (its record carries samples and curves), go to S3 before the record, at once,
        at keys named by their sha256 (keys.job_file), put-if-absent: a stored file is never
        replaced, and the same file put again is already there. Not before the claim was
        granted."""
        self.admission.settle()
        limit = self.limit_reached() if status != "passed" else ""
        if limit:
            self.note(f"*** {limit} ***")
            message = f"{limit}; {message}" if message else limit
        carried, puts, sums, named = {}, [], {}, {}
        room = 0 if self.p.kind == "perf" else FILES_MAX
        for name, (path, kind) in {"log.txt": (self.log_path, "text/plain; charset=utf-8"), **(files or {})}.items():
            sums[name] = file_sum(path)
            named[name] = keys.job_file(self.p.run_id, self.p.target, self.p.step, name, sums[name].sha256)
            # A file many times the room is not read in to learn that it does not fit.
            packed = pack_file(path.read_bytes()) if path.stat().st_size <= 16 * room else ""
            if packed and len(packed) <= room:
                carried[name] = packed
                room -= len(packed)
            else:
                puts.append((named[name], path, kind))
        beside = [self.ctx.uploads.submit(self.ctx.store.put_file_if_absent, *put) for put in puts[1:]]
        if puts:
            self.ctx.store.put_file_if_absent(*puts[0])
        for put in beside:
            put.result()
        tail = "" if status == "passed" else process.log_tail(self.log_path, LOG_TAIL_LINES)
        return self.ctx.record(self.p, status, started_at=self.started, finished_at=time.time(),
                               timings=self.timings, log_key=named["log.txt"], junit_key=named.get("junit.xml"),
                               message=message, log_tail=tail, files=carried, file_sums=sums, **fields)

    def limit_reached(self) -> str:
        """The disk limit a job that failed reached, said as its failure's cause ("" if none): its
        own disk full, or a "No space left on device" in its log (its /tmp, a tmpfs the worker
        cannot look into once the command is over)."""
        if self.ctx.disk.full():
            return self.ctx.disk.limit_note()
        if "No space left on device" in process.log_tail(self.log_path, LOG_TAIL_LINES):
            farm = self.ctx.cfg.farm
            return (f"a filesystem of the job's was full (\"No space left on device\" in its log): its /tmp holds "
                    f"at most {size_text(farm.job_tmp_size)} ([farm] job_tmp_size), its $HOME and tree "
                    f"{size_text(farm.job_disk)} ([farm] job_disk)")
        return ""

    def stopped(self, flag: process.CancelFlag) -> ResultRecord:
        """The record of work whose command was stopped (``flag`` says why), with its log: a
        person's cancel is `cancelled`; a job still running at its run's deadline is
        `timed_out`, the project's own (it held its slot past the night's end, whatever its
        catalog's timeout). A job that is no longer this worker's (its run closed, its lease
        another's) is dropped with no record (Refused): the run has its answer already."""
        if flag.kind == "refused":
            raise Refused(flag.reason)
        if flag.kind == "limit":  # one of the farm's limits, reached: the job's own failure
            self.note(f"*** {flag.reason} ***")
            return self.record("failed", flag.reason)
        if flag.kind == "deadline":
            return self.record("timed_out", f"{self.p.step} {flag.reason}: it held its slot past the end of the "
                               "night, and was stopped with everything it started")
        return self.record("cancelled", f"cancelled while running{f' ({flag.reason})' if flag.reason else ''}")

    def refuse(self, message: str, **fields: object) -> ResultRecord:
        """An `infra` record naming no log, for work that must not run or go on (a host without
        the tools, an artifact that does not verify): the farm's failure, not the project's."""
        self.admission.settle()
        return self.ctx.record(self.p, "infra", message=message, started_at=self.started, finished_at=time.time(),
                               **fields)


def handle_job(ctx: Context, work: Work, job: Job) -> bytes:
    """One Gearman job, start to end. Completed (never WORK_FAIL) unless its payload is refused:
    dropped when it must not run here, else with the record it delivered. The job's dir goes and
    the host lock is released once its record is posted (``tail``), not before: the record's way
    to the ledger was the removal of the job's dir longer (docs/speed.md)."""
    t0 = time.monotonic()
    p = accept(ctx, job)
    short = _wait_for_space(ctx, p)
    if short:
        # Completed with no record and no claim: the nightly submits it again once gearmand no
        # longer holds it ([farm] lost_grace), for a host with room to take.
        log.warning("DROPPED job %s (%s): %s; this host takes no job until there is room", job.handle, p.job_id,
                    short)
        return f"dropped: {short}".encode()
    with Heartbeat(ctx, job, p) as beat, _Tail(job) as tail:
        admission = Admission(ctx, p, job, beat, t0)
        try:
            rec = perform_job(ctx, p, job, work, beat.cancel, admission, tail)
            admission.settle()  # also for a record made before any command (a refusal, the worker's error)
        except Refused as e:
            # Completed, so it leaves the queue; no record: the run has its answer already,
            # or it is not this worker's to give.
            log.warning("DROPPED job %s (%s): %s", job.handle, p.job_id, e)
            return f"dropped: {e}".encode()
        rec.timings["admit"] = round(admission.seconds, 4)
        return handle_result(ctx, p, rec)


def _wait_for_space(ctx: Context, p: Payload) -> str:
    """Before a job: "" once the state directory's filesystem has [farm] min_free free, waiting
    for it a while (less than a lease's life, or the nightly takes the job held for lost); else
    why it has not."""
    short = ctx.short_of_space()
    if not short:
        return ""
    log.warning("job %s waits: %s", p.job_id, short)
    deadline = time.monotonic() + ctx.cfg.farm.lease_timeout / 2
    while short and time.monotonic() < deadline:
        time.sleep(SPACE_SECONDS)
        short = ctx.short_of_space()
    return short


class _Tail(contextlib.ExitStack):
    """What a job holds until its record is posted (its dir, the host lock), let go after. An
    error in letting go is logged: the record is out, and the job must not end in a second one."""

    def __init__(self, job: Job) -> None:
        super().__init__()
        self.job = job

    def __exit__(self, *exc: Any) -> bool:
        try:
            return super().__exit__(*exc)
        except Exception:
            log.exception("job %s: cannot release its dir or host lock", self.job.handle)
            return False


def accept(ctx: Context, job: Job) -> Payload:
    """The job's payload, verified (gearfarm.formats.job.verify) and meant for the function it
    came on; else PayloadError, which fails the Gearman job."""
    try:
        p = verify(job.data, ctx.nightly, ctx.cfg.farm.payload_max_age)
        if p.function != job.function:
            raise PayloadError(f"payload for {p.function} arrived on {job.function}")
    except PayloadError as e:
        # Refused, never executed; the line names the job so an operator can find it.
        log.error("REJECTED job %s on %s: %s", job.handle, job.function, e)
        raise
    return p


class Heartbeat:
    """The lease: the farm sees a live job by its signed beats (gearmand's WORK_STATUS is for
    gearmand's own status), sent once ``leased`` is set and until the ``with`` ends, once the
    record is in the spool (its publish cannot be lost, and the Gearman job ends with it). The
    ledger's answer to each signed beat says whether the job was cancelled, and sets ``cancel``:
    the job's commands stop within a signed beat of the nightly recording it (10 s by default).
    Only a beat the ledger did not answer looks in S3 for the nightly's marker instead: a LIST
    at every heartbeat of every running job was half of a slot's own work on a long job, and
    of MinIO's (docs/speed.md).

    It also sets ``cancel`` when the job is no longer this worker's to run (the ledger answers a
    beat `refused`: its run was closed; `held` or `done`: another worker took its attempt over),
    and at the run's deadline the payload carries, by this host's clock: nothing of a run
    outlives its deadline, whatever the catalog's timeout and whether or not the collector
    answers (a suite that traps SIGTERM held its slot for good when only a `cancelled` answer
    stopped it)."""

    def __init__(self, ctx: Context, job: Job, p: Payload) -> None:
        self.ctx, self.job, self.p = ctx, job, p
        self.stop, self.leased = threading.Event(), threading.Event()
        self.cancel = process.CancelFlag()

    def __enter__(self) -> Heartbeat:
        self.ctx.beats.submit(self._beat)
        self.ctx.watches.submit(self._watch)
        return self

    def _watch(self) -> None:
        """While the job runs: should the state directory's filesystem fall below [farm] min_free,
        the job that wrote the most there (on this host: jobdisk.JobDisk.writes_most) is
        stopped, and fails naming it; the others go on, and nothing is blamed on them."""
        ctx = self.ctx
        try:
            while not self.stop.wait(SPACE_SECONDS):
                if self.cancel.is_set() or not ctx.short_of_space():
                    continue
                floor = max(16 * jobdisk.MiB, ctx.cfg.farm.min_free // 16)
                if ctx.disk.writes_most(floor):
                    wrote = ctx.disk.written()
                    reason = (f"the disk holding the farm's state fell below [farm] min_free "
                              f"({size_text(ctx.cfg.farm.min_free)}) while this job ran: it wrote "
                              f"{wrote / jobdisk.GiB:.2f} GiB")
                    self._end("limit", reason)
        except Exception:
            log.exception("job %s: its watch of the free space stopped", self.p.job_id)

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.cancel.close()

    def _beat(self) -> None:
        try:
            self._beats()
        except Exception:  # a pool's thread: said here, or the future would keep it unread
            log.exception("job %s: its heartbeats stopped", self.p.job_id)

    def _beats(self) -> None:
        ctx, p, n = self.ctx, self.p, 0
        due = time.monotonic() + HEARTBEAT_SECONDS
        while True:
            wait = due - time.monotonic()
            if not self.cancel.is_set():
                wait = min(wait, p.deadline - time.time())  # woken at the deadline, not a beat after
            if self.stop.wait(max(0.0, wait)):
                return
            if time.time() >= p.deadline and not self.cancel.is_set():
                self._end("deadline", "killed at its run's deadline "
                          f"({time.strftime('%H:%M:%S', time.localtime(p.deadline))}), still running")
            if time.monotonic() < due:
                continue
            due = time.monotonic() + HEARTBEAT_SECONDS
            n += 1
            self.job.status(n, 0)
            if not self.leased.is_set() or n % ctx.lease_beats:
                continue
            said = ctx.renew(p, n)
            due = time.monotonic() + HEARTBEAT_SECONDS  # after its answer, which may take a heartbeat
            if self.cancel.is_set() or self.stop.is_set():
                continue
            try:
                if said is not None and said[0] in ("refused", "held", "done"):
                    # Its run was reported and closed, another worker holds or finished the
                    # attempt: whatever this one did now would be late or rejected.
                    self._end("refused", f"no longer this worker's to run ({said[0]}: {said[1]})")
                elif (said is not None and said[0] == "cancelled") or (said is None and ctx.cancelled(p)):
                    self._end("cancelled", "")
            except StoreError as e:
                log.warning("cannot check whether job %s was cancelled: %s", p.job_id, e)

    def _end(self, kind: str, reason: str) -> None:
        log.warning("job %s (%s)%s: stopping it", self.job.handle, self.p.job_id,
                    f": {reason}" if reason else " was cancelled")
        self.cancel.set(kind, reason)


def perform_job(ctx: Context, p: Payload, job: Job, work: Work, cancel: process.CancelFlag,
                admission: Admission, tail: contextlib.ExitStack) -> ResultRecord:
    """The job's work, its commands stopped once ``cancel`` is set. Whatever escapes it becomes
    the record: `cancelled`, or `infra` (the farm failed, not the product: say so, never lose the
    job); but an attempt whose claim was refused ends here, with none."""
    cpu0, began = _cpu(), time.time()
    token = process.CANCEL.set(cancel)
    # A benchmark's commands measure the host: the job dirs left for later wait for another's.
    tidying = process.TIDY.set(ctx.role != "perf")
    try:
        rec = _under_host_lock(ctx, p, work, admission, tail)
    except Refused:
        raise
    except process.Cancelled as e:
        if cancel.kind == "limit":  # a limit it reached: the job's own failure
            rec = ctx.record(p, "failed", message=cancel.reason, started_at=began, finished_at=time.time())
        else:
            rec = ctx.record(p, "cancelled", message=f"cancelled while running ({e})", started_at=began,
                             finished_at=time.time())
    except Exception as e:
        log.exception("job %s failed inside the worker", job.handle)
        rec = ctx.record(p, "infra", message=f"worker error: {type(e).__name__}: {e}", started_at=began,
                         finished_at=time.time())
    finally:
        process.CANCEL.reset(token)
        process.TIDY.reset(tidying)
    # CPU seconds of the job: its commands (every descendant reaped) and this process's
    # own work for it (packing, checksums). The farm's lower bound counts work in it.
    rec.timings["cpu"] = round(_cpu() - cpu0, 3)
    return rec


def _under_host_lock(ctx: Context, p: Payload, work: Work, admission: Admission,
                     tail: contextlib.ExitStack) -> ResultRecord:
    """Builds and tests run under the host lock held shared (they wait while a benchmark
    measures), until ``tail`` ends; a perf job takes it exclusive itself, only around its
    measurement."""
    if ctx.role == "perf":
        return run_step(ctx, p, work, admission, tail)
    waited = tail.enter_context(ctx.hostlock.shared(f"{ctx.name} {p.job_id}"))
    rec = run_step(ctx, p, work, admission, tail)
    rec.timings["host_wait"] = round(waited, 3)
    return rec


def run_step(ctx: Context, p: Payload, work: Work, admission: Admission,
             tail: contextlib.ExitStack) -> ResultRecord:
    """The kind's work, given the job's catalog and target (checked by the payload's sha256) and
    a job dir that is removed when ``tail`` ends."""
    started = time.time()
    try:
        cat = snapshot.fetch_catalog(ctx.store, p.catalog_sha256, ctx.cfg.farm.max_timeout)
        target = cat.target(p.target)
    except CatalogError as e:
        # Nothing of the project's runs: the catalog is not one this worker runs (unreadable,
        # or beyond this host's limits, which may be stricter than the nightly's).
        return ctx.record(p, "infra", message=f"catalog refused on this worker: {e}", started_at=started,
                          finished_at=time.time())
    # Under the worker's own work dir, so a worker killed mid-job has it swept on restart. A
    # build's or test's goes when the next command starts (process.job_dir's ``later``).
    tmpd = tail.enter_context(process.job_dir(ctx.work, ctx.role, later=ctx.role != "perf"))
    disk = tail.enter_context(ctx.disk.job_dir(ctx.role, later=ctx.role != "perf"))
    attempt = Attempt(ctx, p, cat, target, tmpd, started, admission, disk)
    try:
        return work(attempt)
    except process.Cancelled:
        flag = process.CANCEL.get()
        if flag is None:
            raise
        return attempt.stopped(flag)


def handle_result(ctx: Context, p: Payload, rec: ResultRecord) -> bytes:
    ctx.post(rec)
    # What the slots' order learns from: the job's own work, not its waits for the host,
    # and not a job the farm failed before it ran.
    if rec.status != "infra" and rec.work_seconds is not None:
        ctx.durations.record(p.function, rec.work_seconds, p.step)
    return f"{rec.job_id} {rec.status}".encode()


def _cpu() -> float:
    """User + system CPU of this process and of its reaped descendants. A worker runs one job
    at a time, so the difference over a job is the job's (the heartbeat thread's is noise)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def serve(cfg: Config, functions: list[tuple[str, str, Work]], stop: threading.Event | None = None,
          prefer: Callable[[Mapping[str, int]], str | None] | None = None) -> None:
    """Run a worker slot until SIGTERM/SIGINT (or ``stop``): one job at a time, of the
    (role, function, the kind's work) it serves, preferring them in the order given, or, with
    ``prefer``, as it says before each job (gearfarm.run.priority)."""
    # One context per role, not per function: made for every (role, target) pair, a worker of
    # 100 targets made 200 (S3 and gearmand clients, keys, the host's fingerprint) and took
    # minutes to start on a loaded host.
    ctxs = {role: Context(cfg, role) for role in dict.fromkeys(role for role, _, _ in functions)}
    first = next(iter(ctxs.values()))
    jobdisk.sweep(first.work)
    for gone in process.sweep_work_dirs(first.work):
        log.info("removed %s, left by a worker that died mid-job", gone)
    disk = first.disk.open()
    for ctx in ctxs.values():
        ctx.disk = disk
    stop = stop or threading.Event()
    worker = gearman_worker(cfg, f"{socket.gethostname()}-{'+'.join(ctxs)}-{os.getpid()}", prefer)
    worker.idle = functools.partial(_tidy, first)  # the last job's dir, when no next command came for it
    worker.stop_on_signals(stop)
    for role, fn, h in functions:
        worker.register(fn, functools.partial(handle_job, ctxs[role], h))
    log.info("worker %s serving, in this order: %s", worker.client_id, ", ".join(fn for _, fn, _ in functions))
    flushers = [threading.Thread(target=_flush_loop, args=(ctx, stop), daemon=True) for ctx in ctxs.values()]
    for t in flushers:
        t.start()
    try:
        worker.work(stop)
    finally:
        worker.close()
        for ctx in ctxs.values():
            # The last records posted go out now; what cannot (S3 or gearmand away) is in the
            # spool for the next start.
            if not ctx.drain(DRAIN_SECONDS):
                log.warning("results still being published at stop; they wait in %s", ctx.spool)
            ctx.close()
        disk.close()
        process.release_work_dir(first.work)
        sandbox.release()


def _tidy(ctx: Context) -> None:
    """Remove the job dirs left for later, under the host lock held shared as a job holds it:
    not while a benchmark of this host measures."""
    if process.untidy():
        with ctx.hostlock.shared(f"{ctx.name} tidying"):
            process.tidy()


def _flush_loop(ctx: Context, stop: threading.Event) -> None:
    while not stop.wait(5.0):
        try:
            ctx.flush_spool()
        except Exception:  # keep flushing later; a bad spool file must not stop the worker
            log.exception("spool flush failed")
