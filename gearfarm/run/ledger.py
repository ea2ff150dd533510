"""The run ledger: the one owner of a job's state. Every path that records a result — the
collector, reconcile from S3, the nightly's no-worker and deadline expiry, re-runs — goes
through ``Ledger.apply``, and the rules below decide, never the order of arrival.

Precedence (a record replaces the stored one only if it ranks higher; ranks are totally
ordered, so the final state is the same whatever order records arrive in):

| rule | rank component                                   | example                                      |
|------|--------------------------------------------------|----------------------------------------------|
| 1    | product result (passed, failed, timed_out) over   | a test that passed stays passed when the     |
|      | farm-made (skipped, no_worker, infra)             | deadline's `infra` comes after it            |
| 2    | then the newer attempt                            | attempt 1 arriving after attempt 2 is        |
|      |                                                   | superseded                                   |
| 3    | then the earlier finish, then the record's digest | the same attempt run twice (gearmand replayed|
|      | (tie-breaks, so the order is total)               | it after a restart): the first to finish     |

And around the ranking:

| rule | what                                                                                   |
|------|----------------------------------------------------------------------------------------|
| 4    | the same record again (same digest) changes nothing: `duplicate`                        |
| 5    | after the run's report was made (`runs.reported_at`), a record changes no row: it is    |
|      | stored as `late` and `gearfarm report RUN` shows it so; the report and mail stay as sent|
| 6    | a record whose job the run does not expect, or whose run is unknown, is `rejected`      |
| 7    | a build that ends other than passed ends its target's test and perf jobs: `skipped`     |
|      | with the reason, in the same transaction (so no run waits for a job that cannot start)  |
| 8    | a worker's record is `rejected` unless its attempt was submitted (the nightly records   |
|      | each attempt before it submits it) and its host holds the attempt's lease               |
|      | (gearfarm.formats.lease: the first registered host to claim it)                                 |
| 9    | a worker's record saying `skipped` or `no_worker` is `rejected`: only the farm decides  |
|      | those (rule 7, the nightly's expiry)                                                    |

Signed records are checked by ``accept``: a worker seals its record with its host's own key,
and the record is `rejected` (logged, never with a key) unless its signature verifies against a
key of the registry (gearfarm.db.registry) that is not revoked, is registered for the record's role
(build, test, perf) and target, and belongs to the host the record names; unless the attempt is
one the farm submitted (rule 8); and unless its status is one a worker reports (rule 9).
A record that keeps its cases in S3 (a suite too large for the record's envelope) has them
loaded and checked there against the sha256 and count it was sealed with
(gearfarm.formats.result.load_cases); a copy that does not match rejects the record. Every record
offered, whatever its outcome, is written to the deliveries table, which is what `gearfarm
status` and the chaos suite count from.

The write is the database's own upsert (INSERT ... ON CONFLICT DO UPDATE ... WHERE new rank >
old rank) under a shared lock on the run's row, which closing the run takes exclusively, so
on PostgreSQL concurrent writers neither lose nor duplicate a row, and no result slips between
the report's snapshot and the run's close.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import (
    Float,
    Insert,
    Integer,
    Select,
    String,
    bindparam,
    cast,
    delete,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DataError
from sqlalchemy.sql.elements import ColumnElement

from gearfarm.db.registry import Registry
from gearfarm.db.results import Case, DeliveryRow, JobRow, LateResult, LeaseRow, LiveJob, ResultsDB, Run, SampleRow
from gearfarm.formats.job import JobId
from gearfarm.formats.lease import TAKEOVER, Answer, Lease, LeaseError, open_lease
from gearfarm.formats.result import (
    PRODUCT,
    CaseStore,
    Disposition,
    RecordError,
    ResultRecord,
    load_cases,
    open_record,
)

log = logging.getLogger(__name__)
_NAME_MAX = Case.__table__.c.name.type.length
_CLASSNAME_MAX = Case.__table__.c.classname.type.length
# A case's own columns, as the ledger writes them (the job's are the same for all of a record's).
_CASE_COLUMNS = ("classname", "name", "status", "time", "message")
# The parameters of a record's cases as one JSON array of rows (_cases_from_json), and of a
# record applied in one statement (_Sql._at_once): the job's columns, the run's facts, the
# cases, the delivery.
_CASE_KEYS = ("p_job", "p_run", "target", "suite", "c_rows")
# A claim's, in one statement (_Sql._claim_at_once): the facts' keys, then the lease's columns.
_CLAIM_KEYS = ("p_run", "p_job", "p_attempt", "job_id", "attempt", "run_id", "claimed_at", "beats", "done", "kid",
               "host", "worker", "beat_at")
_AT_ONCE_KEYS = (*(c.name for c in JobRow.__table__.c), *_CASE_KEYS, "p_attempt", "p_host", "at", "source")
Channel = Literal["collect", "reconcile", "nightly", "rule"]
# Runs whose expected jobs a ledger keeps in memory (the newest used).
EXPECTED_RUNS = 16


@dataclass(frozen=True)
class Rank:
    prio: int
    attempt: int
    finished: float
    digest: str


def rank(rec: ResultRecord) -> Rank:
    # Negated: of two runs of the same attempt, the first to finish is the result (a replay
    # by gearmand after a restart, which may only have reused the artifact, does not replace it).
    return Rank(1 if rec.status in PRODUCT else 0, rec.attempt, -(rec.finished_at or 0.0), rec.digest)


class _Sql:
    """The ledger's statements on the hot path (every claim, beat and record), made once per
    ledger with bound parameters. Made at each use (the ORM's insert of 14 values, a dozen
    clauses), they cost a record more than the database did: 19 ms a record and 7 ms a claim on
    an idle PostgreSQL, which became the collector's lag and each job's wait for its claim
    (docs/speed.md). A run's row, the attempt the farm submitted and the attempt's holder are
    one read."""

    def __init__(self, db: ResultsDB) -> None:
        jobs, leases, cases, samples = JobRow.__table__, LeaseRow.__table__, Case.__table__, SampleRow.__table__
        submitted = select(LiveJob.attempt).where(LiveJob.job_id == bindparam("p_job")).scalar_subquery()
        lease_key = (leases.c.job_id == bindparam("p_job")) & (leases.c.attempt == bindparam("p_attempt"))
        holder = select(leases.c.host).where(lease_key).scalar_subquery()
        # The run's row held shared (closing the run takes it exclusively: no record slips
        # between the report's snapshot and the close), on PostgreSQL; SQLite's writer is alone.
        facts = select(Run.reported_at, submitted.label("submitted"), holder.label("holder")) \
            .where(Run.run_id == bindparam("p_run"))
        self.pg = pg = db.engine.dialect.name == "postgresql"
        row = select(jobs.c.status, jobs.c.attempt).where(jobs.c.job_id == bindparam("p_job"))
        self.facts_shared = facts.with_for_update(read=True, of=Run) if pg else \
            facts.add_columns(row.with_only_columns(jobs.c.attempt).scalar_subquery().label("recorded"))
        # A claim also asks the job's row: a job the nightly recorded cancelled is not run.
        self.claim_facts = facts.add_columns(row.with_only_columns(jobs.c.status).scalar_subquery().label("status"),
                                             row.with_only_columns(jobs.c.attempt).scalar_subquery()
                                             .label("recorded"))
        self.lease_new = db.compiled(
            db.insert(leases).on_conflict_do_nothing(index_elements=["job_id", "attempt"]).returning(leases.c.job_id),
            ("job_id", "attempt", "run_id", "claimed_at", "beats", "done", "kid", "host", "worker", "beat_at"))
        self.lease_row = select(leases).where(lease_key)
        self.lease_beat = update(leases).where(lease_key).values(
            beats=leases.c.beats + 1, kid=bindparam("p_kid"), host=bindparam("p_host"),
            worker=bindparam("p_worker"), beat_at=bindparam("p_at"))
        self.lease_done = update(leases).where(lease_key).values(done=True)
        ins = db.insert(jobs)
        zero = literal_column("0.0")
        new_rank = tuple_(ins.excluded.prio, ins.excluded.attempt, -func.coalesce(ins.excluded.finished_at, zero),
                          ins.excluded.digest)
        old_rank = tuple_(jobs.c.prio, jobs.c.attempt, -func.coalesce(jobs.c.finished_at, zero), jobs.c.digest)
        self.job_upsert = db.compiled(ins.on_conflict_do_update(
            index_elements=["job_id"], set_={c.name: ins.excluded[c.name] for c in jobs.c if c.name != "job_id"},
            where=new_rank > old_rank).returning(jobs.c.job_id, literal_column("xmax = 0" if pg else "NULL")
                                                 .label("fresh")), [c.name for c in jobs.c])
        self.job_kept = select(jobs.c.digest, jobs.c.attempt, jobs.c.status).where(jobs.c.job_id == bindparam("p_job"))
        self.cases_gone = delete(cases).where(cases.c.job_id == bindparam("p_job"))
        self.samples_gone = delete(samples).where(samples.c.job_id == bindparam("p_job"))
        self.cases_new, self.samples_new = cases.insert(), samples.insert()
        # A record's cases in one statement on PostgreSQL, as one JSON parameter: as one row
        # each (the driver's executemany, pipelined) a 40-case suite took 1.3 ms of a record's
        # 4 on an idle server, and the collector's Python dumped every row's parameters; as one
        # array per column, psycopg's array dumper (Python, a regular expression per item) was
        # still two fifths of the collector's CPU for a record, where json.dumps is C.
        self.cases_unnest = db.compiled(_cases_from_json(), _CASE_KEYS) if pg else None
        self.logged = DeliveryRow.__table__.insert()
        self.at_once = db.compiled(self._at_once(db, facts, lease_key), _AT_ONCE_KEYS) if pg else None
        self.claim_at_once = db.compiled(self._claim_at_once(db, self.claim_facts), _CLAIM_KEYS) if pg else None

    @staticmethod
    def _claim_at_once(db: ResultsDB, claim_facts: Select) -> Select:
        """A claim in one statement (Ledger._lease): the run's and the job's facts, and the lease
        inserted if they let it be granted (rule 8's attempt submitted, the run not reported, the
        job not recorded cancelled) and nobody holds it; with the facts, whether it was. Two
        statements, each its own round trip and the collector's Python, were most of a claim's
        time in the collector, and a job's start waits for its claim."""
        leases = LeaseRow.__table__
        got = claim_facts.cte("facts")
        attempt = bindparam("attempt", type_=Integer)
        may = select(got.c.submitted).where(
            got.c.reported_at.is_(None), got.c.submitted >= attempt,
            or_(func.coalesce(got.c.status, literal_column("''")) != literal_column("'cancelled'"),
                got.c.recorded < attempt))
        names = list(_CLAIM_KEYS[3:])
        new = db.insert(leases).from_select(names, select(*(bindparam(n, type_=leases.c[n].type) for n in names))
                                            .where(exists(may))) \
            .on_conflict_do_nothing(index_elements=["job_id", "attempt"]).returning(leases.c.job_id).cte("new")
        return select(got.c.reported_at, got.c.submitted, got.c.status, got.c.recorded,
                      exists(select(new)).label("granted"))

    @staticmethod
    def _at_once(db: ResultsDB, facts: Select, lease_key: ColumnElement[bool]) -> Select:
        """A job's first record applied in one statement (Ledger._apply_at_once): rules 5 and 8
        the condition of every write in it; the lease marked done, then the job's row inserted
        unless it has one, then, if it was, the record's cases and its `applied` delivery.
        PostgreSQL runs the statements of a WITH in no fixed order but as they are read, so each
        reads the one before it: the locks are taken in the transaction's order (the run's row
        shared, the lease, the job), and a record going this way and one going the long way
        cannot deadlock (tests/run/test_ledger.py). Only a first record: the statement's
        statements share one snapshot, so a replacement's delete of the cases it replaces would
        miss those of a record committed meanwhile, which the transaction's next statement sees."""
        jobs, leases = JobRow.__table__, LeaseRow.__table__
        got = facts.with_for_update(read=True, of=Run).cte("facts")
        ok = select(got.c.submitted).where(got.c.reported_at.is_(None), got.c.submitted >= bindparam("p_attempt"),
                                           got.c.holder == bindparam("p_host")).cte("ok")
        done = update(leases).where(lease_key, exists(select(ok))).values(done=literal_column("true")) \
            .returning(leases.c.job_id).cte("done")
        names = [c.name for c in jobs.c]
        first = db.insert(jobs).from_select(names, select(*(bindparam(n, type_=jobs.c[n].type) for n in names))
                                            .where(exists(select(done)))) \
            .on_conflict_do_nothing(index_elements=["job_id"]).returning(jobs.c.job_id).cte("first")
        new = _cases_from_json(exists(select(first))).cte("new_cases")
        deliveries = DeliveryRow.__table__
        logged = insert(deliveries).from_select(
            ["at", "source", "outcome", "job_id", "run_id", "attempt", "status", "digest", "reason"],
            select(bindparam("at", type_=Float), bindparam("source", type_=String), literal_column("'applied'"),
                   bindparam("p_job"), bindparam("p_run"), bindparam("p_attempt"), bindparam("status"),
                   bindparam("digest"), literal_column("''")).where(exists(select(first)))).cte("logged")
        return select(exists(select(first)).label("applied")).add_cte(new, logged)


def _cases_from_json(where: ColumnElement[bool] | None = None) -> Insert:
    """A record's cases from one JSON array of rows of strings (``_case_json``), in their order."""
    cases = Case.__table__
    got = func.json_array_elements(cast(bindparam("c_rows", type_=String), JSON)) \
        .table_valued("value", with_ordinality="n").render_derived(name="c")
    # Each field a JSON string, read back as text and cast to its column's type (the time too:
    # "nan" and "inf" are floats to PostgreSQL, and no JSON number).
    fields = [cast(got.c.value.op("->>")(literal_column(str(i))), cases.c[c].type)
              for i, c in enumerate(_CASE_COLUMNS)]
    rows = select(bindparam("p_job", type_=String), bindparam("p_run", type_=String),
                  bindparam("target", type_=String), bindparam("suite", type_=String), *fields).order_by(got.c.n)
    return insert(cases).from_select(["job_id", "run_id", "target", "suite", *_CASE_COLUMNS],
                                     rows if where is None else rows.where(where))


class Ledger:
    def __init__(self, db: ResultsDB) -> None:
        self.db = db
        self.sql = _Sql(db)
        self.registry = Registry(db)
        # Run id -> the jobs it expects, in the plan's order. Fixed when the run is recorded
        # (ResultsDB.create_run never changes it), so it is read once per run: read with every
        # record and every lease, as it was, a 5,000-job run's list (~200 KB of JSON) made each
        # record cost more the larger the night.
        self._expected: OrderedDict[str, tuple[tuple[str, ...], frozenset[str]]] = OrderedDict()
        # The collector's threads share one ledger (gearfarm.workers.collector).
        self._expected_lock = threading.Lock()

    # ------------------------------------------------------------------ entry points

    def accept(self, data: bytes, source: Channel,
               store: CaseStore | None = None) -> tuple[Disposition, ResultRecord | None]:
        """A sealed record from a worker (through the collector or from S3). ``store`` reads the
        cases of a record that keeps them in S3; StoreError (nothing recorded) when it cannot
        now: offer the record again later."""
        try:
            rec, kid = open_record(data, self.registry.public_key)
        except RecordError as e:
            self.reject(source, str(e))
            return "rejected", None
        why = self.registry.authorize(kid, rec.kind, rec.target, rec.host.get("hostname", "")) or _worker_status(rec)
        if why:
            self.reject(source, why, rec)
            return "rejected", None
        try:
            rec = load_cases(rec, store)
        except RecordError as e:
            self.reject(source, str(e), rec)
            return "rejected", None
        try:
            if self._apply_at_once(rec, source):
                return "applied", rec
            with self.db.writing() as conn:
                return self._apply(conn, rec, source, worker=True), rec
        except DataError as e:
            self.reject(source, _unstorable(e), rec)
            return "rejected", None

    def lease(self, data: bytes) -> tuple[Answer, str]:
        """A worker's signed claim of an attempt (beat 0) or heartbeat (beat n): ``granted`` (run
        it; beats renewed), ``held`` (another live worker holds it: try again later), ``done``
        (it delivered its record already: drop the copy), ``cancelled`` (the nightly recorded the
        job cancelled: do not start it, or stop it) or ``refused`` (never: forged, not
        registered for it, not submitted, its run reported and closed), with the reason. The
        ledger is who a worker asks whether a job may run and whether a running one goes on: a
        job of a closed run or one the nightly recorded cancelled is dropped or stopped here,
        without a look of the worker's own in S3."""
        try:
            lease, kid = open_lease(data, self.registry.public_key)
            jid = JobId.parse(lease.job_id)
        except (LeaseError, ValueError) as e:
            return self._refuse_lease(str(e))
        why = self.registry.authorize(kid, jid.kind, jid.target, lease.host)
        if why:
            return self._refuse_lease(f"{lease.job_id} attempt {lease.attempt}: {why}")
        try:
            return self._lease(lease, kid, jid)
        except DataError as e:
            return self._refuse_lease(f"{lease.job_id} attempt {lease.attempt}: {_unstorable(e)}")

    def _lease(self, lease: Lease, kid: str, jid: JobId) -> tuple[Answer, str]:
        now = time.time()
        sql, key = self.sql, {"p_job": lease.job_id, "p_attempt": lease.attempt}
        mine = dict(kid=kid, host=lease.host, worker=lease.worker, beat_at=now)
        # A first claim (or a beat of an attempt nobody holds) takes it with its first beat.
        new = dict(job_id=lease.job_id, attempt=lease.attempt, run_id=jid.run_id, claimed_at=now, beats=1,
                   done=False, **mine)
        # Each statement its own (ResultsDB.committing): the facts' read locks nothing, and the
        # lease's insert is the database's own upsert, which two claims cannot both win.
        with self.db.committing() as conn:
            expected = lease.job_id in self._expects(conn, jid.run_id)[1]
            tried = sql.claim_at_once is not None and expected
            if tried:  # on PostgreSQL a claim of an expected job: the facts and the insert at once
                run = conn.execute(sql.claim_at_once, {"p_run": jid.run_id, **key, **new}).first()
                if run is not None and run.granted:
                    return "granted", ""
            else:
                run = conn.execute(sql.claim_facts, {"p_run": jid.run_id, **key}).first()
            if run is not None and run.status == "cancelled" and run.recorded >= lease.attempt:
                # Before the run's close: a cancel often ends the run, and its running job
                # learns it from this answer (workers/base.py Heartbeat).
                return "cancelled", "it was cancelled"
            if run is not None and run.reported_at is not None:
                # Not an error: a job left in a queue after its run's report (gearmand keeps its
                # queue across restarts) is dropped by the worker that finds it.
                return "refused", f"run {jid.run_id} was reported and closed"
            if run is None or not expected:
                return self._refuse_lease(f"{lease.job_id}: " + ("its run is unknown" if run is None else
                                          "its run expects no such job"))
            if lease.attempt > (run.submitted or 0):
                return self._refuse_lease(f"attempt {lease.attempt} of {lease.job_id} was never submitted")
            if not tried and conn.execute(sql.lease_new, new).first():
                return "granted", ""
            held = conn.execute(sql.lease_row, key).one()
            if held.done:
                return "done", f"attempt {lease.attempt} of {lease.job_id} ran already (on {held.host})"
            if held.worker != lease.worker:
                if lease.beat or now - held.beat_at < TAKEOVER:
                    return "held", f"held by {held.worker} on {held.host}, last beat {now - held.beat_at:.0f}s ago"
                log.warning("lease of %s attempt %d taken over by %s from %s (no beat for %.0fs)", lease.job_id,
                            lease.attempt, lease.worker, held.worker, now - held.beat_at)
            conn.execute(sql.lease_beat, dict(p_kid=kid, p_host=lease.host, p_worker=lease.worker, p_at=now, **key))
        return "granted", ""

    def _refuse_lease(self, why: str) -> tuple[Answer, str]:
        log.error("REFUSED lease: %s", why)
        return "refused", why

    def apply(self, rec: ResultRecord, source: Channel) -> Disposition:
        with self.db.writing() as conn:
            return self._apply(conn, rec, source)

    def reject(self, source: Channel, reason: str, rec: ResultRecord | None = None) -> None:
        log.error("REJECTED result record (%s): %s", source, reason)
        with self.db.writing() as conn:
            self._log(conn, source, "rejected", rec, reason)

    def close(self, run_id: str) -> float:
        """Mark the run reported; from now on its results are late. Waits (on PostgreSQL) for
        every apply in flight on this run, which holds the run's row shared."""
        now = time.time()
        with self.db.writing() as conn:
            conn.execute(update(Run).where(Run.run_id == run_id, Run.reported_at.is_(None)).values(reported_at=now))
            got = conn.execute(select(Run.reported_at).where(Run.run_id == run_id)).scalar()
        return float(got or now)

    # ------------------------------------------------------------------ the rules

    def _apply(self, conn: Connection, rec: ResultRecord, source: Channel, worker: bool = False) -> Disposition:
        why = _inconsistent(rec)
        if why:
            log.error("REJECTED result record for %s (%s): %s", rec.job_id, source, why)
            self._log(conn, source, "rejected", rec, why)
            return "rejected"
        sql = self.sql
        row = conn.execute(sql.facts_shared, {"p_run": rec.run_id, "p_job": rec.job_id, "p_attempt": rec.attempt}) \
            .first()
        expected = self._expects(conn, rec.run_id) if row is not None else ((), frozenset())
        if row is None or rec.job_id not in expected[1]:
            why = f"run {rec.run_id!r} is unknown" if row is None else f"run {rec.run_id} expects no job {rec.job_id}"
            log.error("REJECTED result record for %s (%s): %s", rec.job_id, source, why)
            self._log(conn, source, "rejected", rec, why)
            return "rejected"
        if worker:
            why = self._not_leased(conn, rec, row.submitted or 0, row.holder)
            if why:
                log.error("REJECTED result record for %s (%s): %s", rec.job_id, source, why)
                self._log(conn, source, "rejected", rec, why)
                return "rejected"
        data = rec.model_dump(mode="json")
        r = rank(rec)
        if row.reported_at is not None:
            seen = select(DeliveryRow.id).where(DeliveryRow.job_id == rec.job_id, DeliveryRow.digest == r.digest,
                                             DeliveryRow.outcome.in_(("applied", "superseded", "duplicate")))
            if conn.execute(seen.limit(1)).first():
                # Rule 4 before rule 5: the ledger ranked this very record before the report
                # (a spool or queue replay); it is no news.
                self._log(conn, source, "duplicate", rec, "")
                return "duplicate"
            stmt = self.db.insert(LateResult).values(job_id=rec.job_id, run_id=rec.run_id, attempt=rec.attempt,
                                                     status=rec.status, digest=r.digest, record=data,
                                                     arrived_at=time.time())
            new = conn.execute(stmt.on_conflict_do_nothing(index_elements=["job_id", "digest"])
                               .returning(LateResult.id)).first()
            outcome: Disposition = "late" if new is not None else "duplicate"
            self._log(conn, source, outcome, rec, "arrived after the run's report")
            return outcome
        upserted = conn.execute(sql.job_upsert, self._job_row(conn, rec, data, r)).first()
        if upserted is None:
            old = conn.execute(sql.job_kept, {"p_job": rec.job_id}).one()
            outcome = "duplicate" if old.digest == r.digest else "superseded"
            reason = "" if outcome == "duplicate" else f"kept attempt {old.attempt} ({old.status})"
            self._log(conn, source, outcome, rec, reason)
            return outcome
        # The cases and samples of the record this one replaced go; a job's first record
        # replaced none (two round trips fewer): on PostgreSQL the upsert says whether it
        # inserted (a row's xmax is 0 until it is updated); SQLite's writers take turns, so the
        # job's row read above is still the truth.
        if not (upserted.fresh if sql.pg else row.recorded is None):
            conn.execute(sql.cases_gone, {"p_job": rec.job_id})
            conn.execute(sql.samples_gone, {"p_job": rec.job_id})
        if rec.cases:
            if sql.cases_unnest is not None:  # a column each
                conn.execute(sql.cases_unnest, _case_json(rec))
            else:
                job = dict(job_id=rec.job_id, run_id=rec.run_id, target=rec.target, suite=rec.name or rec.step)
                conn.execute(sql.cases_new, [job | dict(zip(_CASE_COLUMNS, row, strict=True))
                                             for row in _case_rows(rec)])
        if rec.samples:
            host_class = rec.host.get("class", "")
            conn.execute(sql.samples_new, [
                dict(job_id=rec.job_id, run_id=rec.run_id, rev=rec.rev, target=rec.target, host_class=host_class,
                     benchmark=x.benchmark, metric=x.metric, variant=x.variant, repetition=x.repetition,
                     value=x.value) for x in rec.samples])
        self._log(conn, source, "applied", rec, "")
        if rec.kind == "build" and rec.status != "passed":
            self._end_dependents(conn, rec, list(expected[0]))
        return "applied"

    def _apply_at_once(self, rec: ResultRecord, source: Channel) -> bool:
        """On PostgreSQL, apply a worker's record in one statement outside a transaction
        (_Sql._at_once) when it is its job's first: of a run not yet reported, from its lease's
        holder. That is nearly every record, and it took seven round trips (BEGIN, the facts,
        the lease, the job, the cases, the delivery, COMMIT), most of a record's time in the
        collector. False when it was not applied so: then ``_apply``'s transaction decides, and
        says why, as for any record (it replaces the job's row, or is a duplicate, superseded,
        late, rejected; the lease marked done again changes nothing). Not a build that did not
        pass (rule 7 ends its dependents in the same transaction), nor a record with samples."""
        sql = self.sql
        if sql.at_once is None or rec.samples or (rec.kind == "build" and rec.status != "passed") \
                or _inconsistent(rec):
            return False
        with self.db.committing() as conn:
            if rec.job_id not in self._expects(conn, rec.run_id)[1]:
                return False
            values = self._job_row(conn, rec, rec.model_dump(mode="json"), rank(rec)) | _case_json(rec)
            got = conn.execute(sql.at_once, values | dict(p_attempt=rec.attempt, p_host=rec.host.get("hostname", ""),
                                                          at=time.time(), source=source)).one()
        return bool(got.applied)

    def _job_row(self, conn: Connection, rec: ResultRecord, data: dict[str, object], r: Rank) -> dict[str, object]:
        """The job's row for the record (its host's row made or refreshed first)."""
        host_id = self.db.upsert_host(conn, rec.host) if rec.host else None
        # The files it carries go in a column of their own: the night's records are read often
        # (the dashboard, the report), its logs seldom.
        record = {k: v for k, v in data.items() if k != "files"}
        return dict(job_id=rec.job_id, run_id=rec.run_id, target=rec.target, kind=rec.kind, step=rec.step,
                    status=rec.status, attempt=rec.attempt, worker=rec.worker, started_at=rec.started_at,
                    finished_at=rec.finished_at, record=record, files=rec.files or None, host_id=host_id,
                    prio=r.prio, digest=r.digest)

    def _expects(self, conn: Connection, run_id: str) -> tuple[tuple[str, ...], frozenset[str]]:
        """The jobs run ``run_id`` expects (in order, and as a set), read once (an unknown run:
        none, and not remembered)."""
        with self._expected_lock:
            got = self._expected.get(run_id)
            if got is not None:
                self._expected.move_to_end(run_id)
                return got
        listed = conn.execute(select(Run.expected).where(Run.run_id == run_id)).scalar()
        if listed is None:
            return (), frozenset()
        got = (tuple(listed), frozenset(listed))
        with self._expected_lock:
            self._expected[run_id] = got
            while len(self._expected) > EXPECTED_RUNS:
                self._expected.popitem(last=False)
        return got

    def _not_leased(self, conn: Connection, rec: ResultRecord, submitted: int, held: str | None) -> str:
        """Rule 8: why a worker's record is not the attempt's holder's ("" when it is), given the
        attempt the farm submitted and the host holding this one; marks the lease done, so no
        copy of the attempt runs after it."""
        if rec.attempt > submitted:
            return (f"attempt {rec.attempt} of {rec.job_id} was never submitted (the farm submitted "
                    f"{f'up to attempt {submitted}' if submitted else 'none'})")
        host = rec.host.get("hostname", "")
        if held is None:
            return f"no host claimed attempt {rec.attempt} of {rec.job_id}: {host} never held it"
        if held != host:
            return f"attempt {rec.attempt} of {rec.job_id} is leased to host {held}, not {host}"
        conn.execute(self.sql.lease_done, {"p_job": rec.job_id, "p_attempt": rec.attempt})
        return ""

    def _end_dependents(self, conn: Connection, build: ResultRecord, expected: list[str]) -> None:
        """Rule 7: nothing of this target can start without its build."""
        now = time.time()
        reason = f"skipped: the {build.target} build ended {build.status}"
        if build.message:
            reason += f" ({build.message[:300]})"
        for each in expected:
            jid = JobId.parse(each)
            if jid.target != build.target or jid.kind == "build":
                continue
            dep = ResultRecord(job_id=each, run_id=jid.run_id, target=jid.target, kind=jid.kind, step=jid.step,
                               name=jid.name, rev=build.rev, status="skipped", attempt=1, worker=build.worker,
                               started_at=now, finished_at=now, message=reason)
            self._apply(conn, dep, "rule")

    def _log(self, conn: Connection, source: str, outcome: str, rec: ResultRecord | None, reason: str) -> None:
        conn.execute(self.sql.logged, dict(
            at=time.time(), source=source, outcome=outcome, reason=reason[:2000],
            job_id=rec.job_id if rec else None, run_id=rec.run_id if rec else None,
            attempt=rec.attempt if rec else None, status=rec.status if rec else None,
            digest=rec.digest if rec else None))


def _case_rows(rec: ResultRecord) -> list[tuple[str, str, str, float, str]]:
    """The record's cases as the cases table's columns (_CASE_COLUMNS), cut to the columns'
    sizes: a suite printing a name longer than PostgreSQL's column would fail the insert, which
    the collector takes for an outage and retries forever."""
    return [(c.classname[:_CLASSNAME_MAX], c.name[:_NAME_MAX], c.status, c.time, c.message[:4000])
            for c in rec.cases]


def _case_json(rec: ResultRecord) -> dict[str, object]:
    """The parameters of ``_cases_from_json`` for the record's cases (``_CASE_KEYS``)."""
    rows = [(cls, name, status, repr(t), msg) for cls, name, status, t, msg in _case_rows(rec)]
    return dict(p_job=rec.job_id, p_run=rec.run_id, target=rec.target, suite=rec.name or rec.step,
                c_rows=json.dumps(rows))


def _unstorable(e: DataError) -> str:
    """Why the database refused a record's or a lease's values: the sender's fault, never an
    outage. The collector waits out the database's errors (a restart), and held such a record,
    and one of its threads, for ever (tests/run/test_ledger.py)."""
    said = str(e.orig if e.orig is not None else e).strip().splitlines()
    return "the results database cannot store it: " + (said[0][:300] if said else type(e).__name__)


def _worker_status(rec: ResultRecord) -> str:
    """Rule 9: what a worker may report (it ran the job, or could not, or it was cancelled)."""
    if rec.status in ("skipped", "no_worker"):
        return f"a worker's record says {rec.status}, which only the farm decides"
    return ""


def _inconsistent(rec: ResultRecord) -> str:
    """A record must say the same thing in its job id as in its fields."""
    try:
        jid = JobId.parse(rec.job_id)
    except ValueError as e:
        return str(e)
    if (jid.run_id, jid.target, jid.step, jid.kind, jid.name) != (rec.run_id, rec.target, rec.step, rec.kind,
                                                                  rec.name):
        return f"record fields (run {rec.run_id}, target {rec.target}, step {rec.step}) contradict its job id"
    return ""


def farm_record(jid: JobId, rev: str, status: str, message: str, attempt: int = 1,
                worker: str = "nightly") -> ResultRecord:
    """A status the farm decided for a job (no worker, deadline, cannot resubmit)."""
    now = time.time()
    return ResultRecord(job_id=str(jid), run_id=jid.run_id, target=jid.target, kind=jid.kind, step=jid.step,
                        name=jid.name, rev=rev, status=status, attempt=attempt, worker=worker,  # type: ignore[arg-type]
                        started_at=now, finished_at=now, message=message)

