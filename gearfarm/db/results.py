"""The results database (SQLAlchemy): runs (each of one project, with the job catalog it ran
with), jobs (one row per job id), test cases, benchmark samples, hosts, late results, the
delivery log and the catalogs (content-addressed). SQLite by default; PostgreSQL when the
configured URL says so. The schema is owned by the Alembic migrations in gearfarm/db/migrations,
applied when the database is opened. This module reads (and forgets the job files of expired
runs for gearfarm.run.retention); every change of a job's state is made by gearfarm.run.ledger,
the one owner of the transition rules."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TextClause,
    UniqueConstraint,
    and_,
    bindparam,
    case,
    cast,
    create_engine,
    event,
    func,
    inspect,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, defer, load_only, mapped_column, sessionmaker

from gearfarm.config import DEFAULT_PROJECT
from gearfarm.db import DatabaseUnavailable
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import Catalog, CatalogError
from gearfarm.formats.job import Artifact
from gearfarm.formats.result import TERMINAL, FileSum, ResultRecord, unpack_file

log = logging.getLogger(__name__)

# A failing test case: the partial index ix_cases_failing and every query it serves say it in
# these words (a planner uses a partial index only for a condition that matches its own).
FAILING_SQL = "status IN ('failed', 'error')"
# Values in one IN list: SQLite allows 32,766 parameters a statement, and a long list plans slowly.
IN_CHUNK = 500


class StoredFiles(NamedTuple):
    """A job's files as its row knows them (ResultsDB.job_files): which record they are of
    (attempt, finished), the S3 key it names for each (JOB_FILES name -> key or None), those
    it carried (name -> pack_file's text) and what the record says each is (name -> FileSum:
    none in a record from before files were bound to records)."""

    made: tuple[int, float | None]
    keys: dict[str, str | None]
    carried: dict[str, str]
    sums: dict[str, FileSum] = {}


class Base(DeclarativeBase):
    pass


class CatalogRow(Base):
    """A job catalog's text, once per content: runs name it by its sha256 (gearfarm.formats.catalog.digest)."""

    __tablename__ = "catalogs"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


# A run's state: "running", then "finished" once closed; NOT_RUN for a run whose project could
# not run at all (its revision, catalog or source snapshot), closed at once, its notes' "error"
# saying why (gearfarm.run.nightly.record_not_run).
NOT_RUN = "failed"


class Run(Base):
    __tablename__ = "runs"
    # A project's runs newest first, and the nightly runs (not re-runs or probes) newest first,
    # each stopping at a LIMIT (perf_series, runs_before, runs): migration 0011.
    __table_args__ = (Index("ix_runs_project_created_at", "project", "created_at"),
                      Index("ix_runs_parent_created_at", "parent_run_id", "created_at"))
    run_id: Mapped[str] = mapped_column(String(96), primary_key=True)
    rev: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[float] = mapped_column(Float, index=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Every job id the run must end with, so a missing one is visible, never silent.
    expected: Mapped[list[str]] = mapped_column(JSON)
    targets: Mapped[list[str]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), default="running")
    notes: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # A re-run of a run's new failures is its own run (own job ids, own S3 keys), linked here
    # so history can use its verdicts without counting it as a run of its own.
    parent_run_id: Mapped[str | None] = mapped_column(String(96), nullable=True, index=True)
    # Set when the report is made: a result arriving after it is recorded as late.
    reported_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    # History, perf series and "last good build" only ever compare runs of one project.
    project: Mapped[str] = mapped_column(String(64), default=DEFAULT_PROJECT, server_default=DEFAULT_PROJECT,
                                         index=True)
    # The catalog the run was planned from; the report reads metric directions from it.
    catalog_sha256: Mapped[str | None] = mapped_column(ForeignKey("catalogs.sha256"), nullable=True)


class JobRow(Base):
    __tablename__ = "jobs"
    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"), index=True)
    target: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    step: Mapped[str] = mapped_column(String(80))
    status: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    worker: Mapped[str] = mapped_column(String(200), default="")
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    record: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The job's files the record carried (ResultRecord.files, taken out of ``record`` so that
    # reading a night's records does not read its logs): name -> zstd in base64. None: the
    # record carried none (they are in S3 at its log_key and junit_key, if it has any).
    files: Mapped[dict[str, str] | None] = mapped_column(JSON(none_as_null=True), nullable=True, deferred=True)
    host_id: Mapped[str | None] = mapped_column(ForeignKey("hosts.host_id"), nullable=True)
    # The record's precedence (gearfarm.run.ledger.rank): product results over farm-made ones,
    # then the newer attempt, then the earlier finish, then the digest (a total order).
    prio: Mapped[int] = mapped_column(Integer, default=0)
    digest: Mapped[str] = mapped_column(String(64), default="")


class LateResult(Base):
    """A result that arrived after its run's report: kept and shown, never changing the row
    the report was made from."""

    __tablename__ = "late_results"
    __table_args__ = (UniqueConstraint("job_id", "digest", name="uq_late_result"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(200), index=True)
    run_id: Mapped[str] = mapped_column(String(96), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64))
    record: Mapped[dict[str, Any]] = mapped_column(JSON)
    arrived_at: Mapped[float] = mapped_column(Float)


class DeliveryRow(Base):
    """Every record offered to the ledger and what it did: applied, duplicate, superseded,
    late, or rejected (forged, unknown job, malformed). Chaos tests count from it; status
    shows the rejections."""

    __tablename__ = "deliveries"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    source: Mapped[str] = mapped_column(String(32))
    outcome: Mapped[str] = mapped_column(String(16), index=True)
    job_id: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    run_id: Mapped[str | None] = mapped_column(String(96), nullable=True, index=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")


class Host(Base):
    """A machine as a fingerprint, so results can be traced to the hardware they came from."""

    __tablename__ = "hosts"
    # sha256 of the fingerprint fields: the same machine in the same shape is one row.
    host_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200), default="")
    host_class: Mapped[str] = mapped_column(String(64), default="", index=True)
    cpu_model: Mapped[str] = mapped_column(String(200), default="")
    cores: Mapped[int] = mapped_column(Integer, default=0)
    memory_gib: Mapped[int] = mapped_column(Integer, default=0)
    kernel: Mapped[str] = mapped_column(String(200), default="")
    machine: Mapped[str] = mapped_column(String(64), default="")
    compiler: Mapped[str] = mapped_column(String(300), default="")
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)


class Case(Base):
    __tablename__ = "cases"
    # History reads one test case on one target across runs; a test's page, one case in the
    # newest runs (by name and run id: through the name alone it read every night's).
    # The failing cases of a run, which classifying a night reads for every earlier run of its
    # history (a partial index: a few rows a night where the run's index holds 200,000).
    __table_args__ = (Index("ix_cases_target_suite_name", "target", "suite", "name"),
                      Index("ix_cases_name_run", "name", "run_id"),
                      Index("ix_cases_failing", "run_id", postgresql_where=text(FAILING_SQL),
                            sqlite_where=text(FAILING_SQL)))
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    run_id: Mapped[str] = mapped_column(String(96), index=True)
    target: Mapped[str] = mapped_column(String(64))
    suite: Mapped[str] = mapped_column(String(64))
    classname: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(300), index=True)
    status: Mapped[str] = mapped_column(String(16))
    time: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str] = mapped_column(Text, default="")


class SampleRow(Base):
    __tablename__ = "samples"
    __table_args__ = (Index("ix_samples_series", "target", "benchmark", "metric"),
                      # A series' samples of given runs (perf_series): migration 0011.
                      Index("ix_samples_run_series", "run_id", "target", "benchmark", "metric"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    run_id: Mapped[str] = mapped_column(String(96), index=True)
    rev: Mapped[str] = mapped_column(String(40))
    target: Mapped[str] = mapped_column(String(64))
    host_class: Mapped[str] = mapped_column(String(64))
    benchmark: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    variant: Mapped[str] = mapped_column(String(16))
    repetition: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)


class Annotation(Base):
    """A performance change a user marked as expected (by its first bad revision)."""

    __tablename__ = "perf_annotations"
    __table_args__ = (UniqueConstraint("benchmark", "metric", "target", "rev", name="uq_perf_annotation"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    benchmark: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(64))
    rev: Mapped[str] = mapped_column(String(40))
    note: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)


class Regression(Base):
    """A detected change worth a person's attention: a new failure or a performance change,
    once per (kind, project, target, subject, first bad revision), with its triage state.
    The state lives here, on the server, so every reader sees the same (asv keeps it in one
    browser's local storage)."""

    __tablename__ = "regressions"
    __table_args__ = (UniqueConstraint("kind", "project", "target", "subject", "first_bad_rev",
                                       name="uq_regression"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # failure | performance
    project: Mapped[str] = mapped_column(String(64), index=True)
    target: Mapped[str] = mapped_column(String(64))
    # failure: "suite/test"; performance: "benchmark/metric@host class"
    subject: Mapped[str] = mapped_column(String(400))
    first_bad_run: Mapped[str] = mapped_column(String(96), index=True)
    first_bad_rev: Mapped[str] = mapped_column(String(40))
    last_good_rev: Mapped[str | None] = mapped_column(String(40), nullable=True)
    detected_at: Mapped[float] = mapped_column(Float, index=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="untriaged")
    state_by: Mapped[str] = mapped_column(String(64), default="")
    state_note: Mapped[str] = mapped_column(Text, default="")
    state_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class TriageEvent(Base):
    """Every change of a regression's triage state: who, when, why (the page shows the trail)."""

    __tablename__ = "triage_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    regression_id: Mapped[int] = mapped_column(ForeignKey("regressions.id"), index=True)
    state: Mapped[str] = mapped_column(String(16))
    who: Mapped[str] = mapped_column(String(64))
    note: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[float] = mapped_column(Float)


class WebUser(Base):
    """A person (or a script) allowed to triage, cancel and start runs on the dashboard. Only
    the token's sha256 is kept: the token itself is shown once, when it is made."""

    __tablename__ = "web_users"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)


class WebSession(Base):
    """A browser logged in to the dashboard: the sha256 of the random id its session cookie
    carries (so a copy of the database logs no one in). Logging out or removing the account
    deletes the row, which ends the session even for a copy of the cookie."""

    __tablename__ = "web_sessions"
    id_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(ForeignKey("web_users.name"), index=True)
    created_at: Mapped[float] = mapped_column(Float)


class Cancellation(Base):
    """A person's request to cancel a run (job_id None) or one job: the nightly that owns the
    run records the jobs it stops as cancelled; workers learn of it from the S3 marker."""

    __tablename__ = "cancellations"
    __table_args__ = (UniqueConstraint("run_id", "job_id", name="uq_cancellation"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(96), index=True)
    job_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    who: Mapped[str] = mapped_column(String(64))
    at: Mapped[float] = mapped_column(Float)


class LiveJob(Base):
    """What the nightly last saw of a job not yet finished: waiting (for its build), queued
    (in gearmand, no worker has it) or running, and its attempt. The live page reads it."""

    __tablename__ = "live_jobs"
    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(96), index=True)
    state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    since: Mapped[float] = mapped_column(Float)


class HostKey(Base):
    """A worker host's public key and what it may sign: the registry (gearfarm.db.registry). The
    ledger applies a worker's record only when its signer is here, not revoked, registered for the
    record's role and target, and the record names this host."""

    __tablename__ = "host_keys"
    kid: Mapped[str] = mapped_column(String(16), primary_key=True)
    host: Mapped[str] = mapped_column(String(64), index=True)
    public_key: Mapped[str] = mapped_column(String(64))
    roles: Mapped[list[str]] = mapped_column(JSON)
    # The targets it may serve; ["*"]: every target.
    targets: Mapped[list[str]] = mapped_column(JSON)
    added_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class LeaseRow(Base):
    """Who holds one attempt of a job (gearfarm.formats.lease): the first registered host to claim it,
    its signed beats, and whether the attempt delivered its record."""

    __tablename__ = "leases"
    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    kid: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(64))
    worker: Mapped[str] = mapped_column(String(200))
    run_id: Mapped[str] = mapped_column(String(96), index=True)
    claimed_at: Mapped[float] = mapped_column(Float)
    beat_at: Mapped[float] = mapped_column(Float)
    beats: Mapped[int] = mapped_column(Integer)
    done: Mapped[bool] = mapped_column(Boolean, default=False)


class Bisection(Base):
    """A search for the commit that broke a test or moved a benchmark (gearfarm.bisection.driver):
    one row per failure, the failures of one range bisected as a group (its detail's "group").
    Its probes are runs of their own whose parent_run_id is ``bisect-<group id>``, so nightly
    history, series and last-good-build queries never count them."""

    __tablename__ = "bisections"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project: Mapped[str] = mapped_column(String(64), index=True)
    target: Mapped[str] = mapped_column(String(64))
    # "test" (subject: suite, case) or "perf" (subject: benchmark, metric).
    kind: Mapped[str] = mapped_column(String(16))
    subject: Mapped[dict[str, Any]] = mapped_column(JSON)
    good_rev: Mapped[str] = mapped_column(String(40))
    bad_rev: Mapped[str] = mapped_column(String(40))
    # The nightly run that found the regression; None for one started by hand.
    origin_run_id: Mapped[str | None] = mapped_column(String(96), nullable=True, index=True)
    # running, then gearfarm.bisection.search.State (found, no_culprit, flaky, budget, unbuildable) or error.
    state: Mapped[str] = mapped_column(String(16))
    culprit_rev: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # The evidence: every revision judged, the suspects left, builds and jobs spent, the
    # culprit's author and subject, the confidence, the message.
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    @property
    def group_id(self) -> int:
        """The group it was bisected in (the failures of one range, gearfarm.bisection.failures):
        the id of the group's first row, which its detail names; its own id when alone."""
        return int(((self.detail or {}).get("group") or {}).get("id", self.id))

    @property
    def run_prefix(self) -> str:
        """The parent_run_id of its probe runs: its group's, shared by every failure of the group."""
        return f"bisect-{self.group_id}"


# Seconds between two writes of a known host's last_seen (upsert_host).
HOST_REFRESH = 60.0
# The longest text each of a host's fingerprint fields keeps (its column's), by the fingerprint's names.
_HOST_TEXT: dict[str, int] = {name: Host.__table__.c[column].type.length for name, column in (
    ("hostname", "hostname"), ("cpu", "cpu_model"), ("kernel", "kernel"), ("machine", "machine"),
    ("compiler", "compiler"), ("class", "host_class"))}


class ResultsDB:
    def __init__(self, url: str, connections: int = 5, pre_ping: bool = True) -> None:
        """``connections``: how many the pool keeps (as many threads as write at once: the
        collector's). ``pre_ping``: test a pooled connection before each use, as a PostgreSQL
        restart leaves dead ones; a round trip per transaction that the collector, which retries
        a transaction the database broke off anyway, does without."""
        self.url = url
        sqlite = url.startswith("sqlite")
        # SQLite's busy timeout (pysqlite's `timeout`: lock contention becomes waiting instead of
        # errors) is set as the connection opens, so it already covers the first statement:
        # switching a new file to WAL needs the file to itself, and processes opening a new
        # database at once (the collector, the nightly, the CLI) must wait for the one migrating
        # it, which on a loaded machine takes longer than pysqlite's default 5 s.
        # PostgreSQL's connect_timeout: a results host that is down or unroutable is named within
        # seconds (DatabaseUnavailable below), not after the kernel's TCP timeout of minutes.
        self.engine: Engine = create_engine(url, future=True, pool_pre_ping=pre_ping and not sqlite,
                                            pool_size=connections,
                                            connect_args={"timeout": 30} if sqlite else {"connect_timeout": 3})
        if sqlite:
            # The collector writes while the nightly and CLI read: WAL lets them overlap.
            @event.listens_for(self.engine, "connect")
            def _pragmas(conn: Any, _rec: Any) -> None:
                # pysqlite's own implicit BEGIN is turned off so _begin below decides.
                conn.isolation_level = None
                cur = conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.close()

            @event.listens_for(self.engine, "begin")
            def _begin(conn: Any) -> None:
                # A write transaction that starts as a reader can get SQLITE_BUSY at once when
                # it upgrades (no busy wait); writers take the write lock up front instead.
                immediate = conn.get_execution_options().get("write", False)
                conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        # Host id -> when this process last found its row there (upsert_host).
        self._hosts_there: dict[str, float] = {}
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        self._write_session = sessionmaker(self.engine.execution_options(write=True), expire_on_commit=False)
        try:
            upgrade(self.engine)
        except OperationalError as e:
            if sqlite:
                raise
            reason = str(e.orig).splitlines()[0] if e.orig is not None else str(e)
            raise DatabaseUnavailable(
                f"the results database {self.engine.url.render_as_string(hide_password=True)} does not answer "
                f"({reason}): on the results host, start PostgreSQL (sudo systemctl start postgresql), "
                "or correct [database] url") from None

    def open_pool(self, setting: str | None = None) -> None:
        """Open every connection the pool keeps, now, for a process that lives for months (the
        collector, the dashboard): a pool opens a connection when concurrent users first need one
        and keeps it, so what the process held open (on SQLite two descriptors a connection, the
        file and its WAL) stepped up on the first night its work overlapped, and looked like a
        leak; and a server that could not give them all said so on that night, not at the start.
        ``setting``: the setting that decides how many, named in the error when the server
        refuses one."""
        size: int = self.engine.pool.size()  # type: ignore[attr-defined]
        held: list[Connection] = []
        try:
            for _ in range(size):
                held.append(self.engine.connect())
                # A read opens SQLite's WAL file, which the connection then keeps.
                held[-1].execute(select(Run.run_id).limit(1)).all()
                held[-1].rollback()
        except OperationalError as e:
            reason = str(e.orig).strip().splitlines()[0] if e.orig is not None else str(e)
            allow = ("PostgreSQL's max_connections, or the role's or database's CONNECTION LIMIT"
                     if self.engine.dialect.name == "postgresql" else "the process's open files limit, ulimit -n")
            raise DatabaseUnavailable(
                f"the results database {self.engine.url.render_as_string(hide_password=True)} refused connection "
                f"{len(held) + 1} of the {size} this process keeps open ({reason}): allow more ({allow})"
                + (f", or lower {setting}" if setting else "")) from None
        finally:
            for conn in held:
                conn.close()

    @contextmanager
    def session(self, write: bool = False) -> Iterator[Session]:
        with (self._write_session if write else self._session)() as s, s.begin():
            yield s

    @contextmanager
    def polling(self) -> Iterator[Connection]:
        """A connection for reads that need no transaction (each statement sees the latest
        commits; the nightly's poll): on PostgreSQL in autocommit, so a statement is one round
        trip, where a session's BEGIN and ROLLBACK were two more, five times a second (a
        psycopg setting, made on the client, so the pool's connection is reused as it is)."""
        with self._autocommit.connect() as conn:
            yield conn

    @contextmanager
    def committing(self) -> Iterator[Connection]:
        """A connection whose statements commit one by one, for writes that hold no lock across
        statements (a claim: its read takes none, so a transaction kept nothing from changing
        between its statements either): on PostgreSQL in autocommit, two round trips fewer
        than a transaction; on SQLite a write transaction (``writing``: its writer must take the
        lock first)."""
        if self.engine.dialect.name != "postgresql":
            with self.writing() as conn:
                yield conn
            return
        with self._autocommit.connect() as conn:
            yield conn

    @functools.cached_property
    def _autocommit(self) -> Engine:
        pg = self.engine.dialect.name == "postgresql"
        return self.engine.execution_options(isolation_level="AUTOCOMMIT") if pg else self.engine

    @contextmanager
    def writing(self) -> Iterator[Connection]:
        """One write transaction (on SQLite holding the write lock from its start)."""
        with self.engine.connect().execution_options(write=True) as conn, conn.begin():
            yield conn

    def insert(self, table: Any) -> Any:
        """The dialect's INSERT, which has ON CONFLICT (both PostgreSQL and SQLite do): every
        upsert is the database's own, never read-then-insert, so concurrent writers can
        neither lose nor duplicate a row."""
        if self.engine.dialect.name == "postgresql":
            return pg_insert(table)
        return sqlite_insert(table)

    def compiled(self, stmt: Any, keys: Iterable[str]) -> TextClause:
        """An upsert (``insert``'s, with ON CONFLICT), or a statement holding one, compiled once,
        for parameters ``keys``.
        SQLAlchemy 2.0 never caches the dialects' INSERT ... ON CONFLICT (their Insert has
        ``inherit_cache = False``): executed as made, the ledger's upserts were compiled afresh
        at every claim and record, a millisecond of the collector's Python each. As text with
        its parameters' types, it is compiled once and the types still convert the values (a
        JSON column's dict). Compiled for the plain dialect: the driver's own casts every
        parameter (``:x::VARCHAR``)."""
        dialect = PGDialect(paramstyle="named") if self.engine.dialect.name == "postgresql" \
            else SQLiteDialect(paramstyle="named")
        keys = list(keys)
        # The keys name an INSERT's values; a SELECT's statements (a WITH of several) name
        # their own, which would otherwise become the SET of every UPDATE among them.
        made = stmt.compile(dialect=dialect, column_keys=keys if stmt.is_dml else None)
        stray = set(made.binds) - set(keys)
        if stray:  # a literal in the statement: it would need a value at each execution
            raise ValueError(f"statement has parameters {sorted(stray)} beyond {keys}: write literals as "
                             "literal_column()")
        # PostgreSQL's JSON parameters are cast (`:record::JSON`), which text would read as no
        # parameter; the standard spelling of the same cast it reads.
        sql = re.sub(r"(?<![:\w]):(\w+)::(\w+)", r"CAST(:\1 AS \2)", str(made))
        return text(sql).bindparams(*(bindparam(k, type_=b.type) for k, b in made.binds.items()))

    def create_run(self, run_id: str, rev: str, targets: list[str], expected: list[str],
                   notes: dict[str, Any] | None = None, parent_run_id: str | None = None,
                   created_at: float | None = None, deadline: float | None = None,
                   project: str | None = None, catalog: tuple[str, str] | None = None) -> bool:
        """Record a run; False when it exists already (a resubmission adds nothing).

        ``catalog`` is (sha256, text) of the job catalog the run was planned from; its text is
        stored once per sha256. A re-run (``parent_run_id``) is of its parent's project and
        catalog unless they are given; without a parent, ``project`` defaults to DEFAULT_PROJECT.
        ValueError when the sha256 is not the text's, or a re-run names another project."""
        if catalog is not None and catalog_mod.digest(catalog[1]) != catalog[0]:
            raise ValueError(f"run {run_id}: catalog sha256 {catalog[0]!r} is not the digest of its text")
        now = time.time()
        with self.writing() as conn:
            catalog_sha = catalog[0] if catalog is not None else None
            if parent_run_id is not None:
                parent = conn.execute(select(Run.project, Run.catalog_sha256)
                                      .where(Run.run_id == parent_run_id)).first()
                if parent is not None:
                    if project is not None and project != parent.project:
                        raise ValueError(f"re-run {run_id} of project {project!r} cannot re-run {parent_run_id} "
                                         f"of project {parent.project!r}")
                    project = parent.project
                    catalog_sha = catalog_sha or parent.catalog_sha256
            if catalog is not None:
                conn.execute(self.insert(CatalogRow).values(sha256=catalog[0], text=catalog[1], created_at=now)
                             .on_conflict_do_nothing(index_elements=["sha256"]))
            stmt = self.insert(Run).values(
                run_id=run_id, rev=rev, created_at=now if created_at is None else created_at,
                expected=expected, targets=targets, state="running", notes=notes or {},
                parent_run_id=parent_run_id, deadline=deadline, project=project or DEFAULT_PROJECT,
                catalog_sha256=catalog_sha)
            return conn.execute(stmt.on_conflict_do_nothing(index_elements=["run_id"])
                                .returning(Run.run_id)).first() is not None

    def catalog_text(self, sha256: str) -> str | None:
        with self.session() as s:
            row = s.get(CatalogRow, sha256)
            return row.text if row is not None else None

    def catalog_of(self, run: Run) -> Catalog | None:
        """The job catalog ``run`` was planned from; None (and a warning) when it has none
        stored or it no longer parses (an older run, or a catalog schema this gearfarm drops)."""
        if not run.catalog_sha256:
            log.warning("run %s has no stored job catalog", run.run_id)
            return None
        text = self.catalog_text(run.catalog_sha256)
        if text is None:
            log.warning("run %s names catalog %s, which is not stored", run.run_id, run.catalog_sha256[:12])
            return None
        try:
            return catalog_mod.parse(text, f"catalog {run.catalog_sha256[:12]} of run {run.run_id}")
        except CatalogError as e:
            log.warning("the stored catalog of run %s does not parse: %s", run.run_id, e)
            return None

    def update_notes(self, run_id: str, **notes: Any) -> None:
        """Merge keys into a run's notes (the JSON column is replaced whole, so a change is seen)."""
        with self.session(write=True) as s:
            run = s.get(Run, run_id)
            if run is not None:
                run.notes = {**(run.notes or {}), **notes}

    def add_alarm(self, run_id: str, text: str) -> None:
        """Add to a run's alarms (its notes' ``alarms``): something done to the farm from outside
        that the farm undid, which its report and mail name loudly though the run may pass."""
        with self.session(write=True) as s:
            run = s.get(Run, run_id)
            if run is not None:
                alarms = list((run.notes or {}).get("alarms", []))
                run.notes = {**(run.notes or {}), "alarms": [*alarms, text]}

    def get_run(self, run_id: str) -> Run | None:
        with self.session() as s:
            return s.get(Run, run_id)

    def run_version(self, run_ids: Iterable[str]) -> str:
        """A digest of everything a run's report is made from: the rows of ``run_ids`` (a run
        and its re-runs: state, times, notes with the verdicts; the jobs expected are fixed when
        the run is made, and a new run is a new id) and how many records were offered for them,
        up to which. Every change of a job's row (its record, its cases and samples) is the
        ledger's, logged in deliveries in the same transaction, so the log's count and newest
        entry change whenever a record does. Equal digests, equal reports: the dashboard keeps a
        big night's page made once and makes it again only when this changes (one indexed count,
        where the page reads 5,000 records and 200,000 cases)."""
        versions = self.run_versions(run_ids)
        return hashlib.sha256(json.dumps(sorted(versions.items())).encode()).hexdigest()

    def run_versions(self, run_ids: Iterable[str]) -> dict[str, str]:
        """Run id -> the digest run_version makes of that run alone, for many runs in two queries
        (the dashboard's front page keeps each run's targets' states by it)."""
        ids = sorted(set(run_ids))
        rows: dict[str, list[Any]] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(ids), IN_CHUNK):
                chunk = ids[i:i + IN_CHUNK]
                for row in conn.execute(select(Run.run_id, Run.state, Run.finished_at, Run.reported_at, Run.notes)
                                        .where(Run.run_id.in_(chunk))):
                    rows[row[0]] = list(row)
                for rid, n, last in conn.execute(select(DeliveryRow.run_id, func.count(), func.max(DeliveryRow.id))
                                                 .where(DeliveryRow.run_id.in_(chunk)).group_by(DeliveryRow.run_id)):
                    if rid in rows:
                        rows[rid] += [n, last]
        return {rid: hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest() for rid, row in rows.items()}

    def runs(self, limit: int = 50, reruns: bool = False, project: str | None = None) -> list[Run]:
        """The newest runs first (of every project, or of ``project``); re-runs (children of a
        run) only when asked for."""
        with self.session() as s:
            q = select(Run).order_by(Run.created_at.desc()).limit(limit)
            if not reruns:
                q = q.where(Run.parent_run_id.is_(None))
            if project is not None:
                q = q.where(Run.project == project)
            return list(s.scalars(q))

    def projects(self) -> list[str]:
        """Every project that has a run, by name."""
        with self.session() as s:
            return sorted(s.scalars(select(Run.project).distinct()))

    def reruns_of(self, run_ids: Iterable[str]) -> dict[str, list[str]]:
        """Parent run id -> its re-run ids."""
        ids = list(run_ids)
        if not ids:
            return {}
        with self.session() as s:
            out: dict[str, list[str]] = {}
            for rid, parent in s.execute(select(Run.run_id, Run.parent_run_id).where(Run.parent_run_id.in_(ids))):
                out.setdefault(parent, []).append(rid)
            return out

    def finish_run(self, run_id: str, state: str) -> None:
        with self.session(write=True) as s:
            run = s.get(Run, run_id)
            if run is not None:
                run.state = state
                run.finished_at = time.time()

    def jobs(self, run_id: str, target: str | None = None, cases: bool = True,
             kinds: Iterable[str] | None = None) -> list[ResultRecord]:
        """The run's records (of ``target`` and of ``kinds`` only, when given), by job id; ``cases`` False: without
        their test cases (an empty list), which a 5,000-job night has 200,000 of and which the
        report and the dashboard read from the cases table instead (gearfarm.db.cases)."""
        # Without cases, SQLite drops them itself (json_remove: its JSON is text, decoded here in
        # Python); PostgreSQL's json column would have to become jsonb to lose a key, which took
        # longer than its driver's C decoder takes over the whole record (0.86 s against 0.60 s
        # for 5,000 records of 40 cases), so there they are dropped here.
        drop_here = not cases and self.engine.dialect.name != "sqlite"
        record: Any = (JobRow.record if cases or drop_here
                       else func.json_remove(JobRow.record, "$.cases", type_=JSON))
        q = select(record).where(JobRow.run_id == run_id).order_by(JobRow.job_id)
        if target is not None:
            q = q.where(JobRow.target == target)
        if kinds is not None:
            q = q.where(JobRow.kind.in_(list(kinds)))
        with self.engine.connect() as conn:
            rows = conn.execute(q).scalars()
            if drop_here:
                return [ResultRecord.model_validate({k: v for k, v in r.items() if k != "cases"}) for r in rows]
            return [ResultRecord.model_validate(r) for r in rows]

    def job(self, job_id: str) -> ResultRecord | None:
        """The record a job's row holds now (the one the ledger ranked first), if any."""
        with self.session() as s:
            row = s.get(JobRow, job_id)
            return ResultRecord.model_validate(row.record) if row is not None else None

    def job_files(self, job_ids: Iterable[str]) -> dict[str, StoredFiles]:
        """The files of the records the jobs' rows hold now, without reading the records whole
        (gearfarm.report.joblog)."""
        ids, got = list(job_ids), {}
        cols = (JobRow.job_id, JobRow.attempt, JobRow.finished_at, JobRow.record["log_key"].as_string(),
                JobRow.record["junit_key"].as_string(), JobRow.files, JobRow.record["file_sums"])
        with self.engine.connect() as conn:
            # In slices: a cancelled run ends thousands of jobs in one poll, more than an IN list
            # of an older SQLite takes.
            for at in range(0, len(ids), 500):
                for j, a, f, log, junit, files, sums in conn.execute(
                        select(*cols).where(JobRow.job_id.in_(ids[at:at + 500]))):
                    got[j] = StoredFiles((a, f), {"log.txt": log, "junit.xml": junit}, files or {},
                                         {n: FileSum.model_validate(v) for n, v in (sums or {}).items()})
        return got

    def carried_sizes(self) -> dict[str, int]:
        """{run id: bytes of the job files its records carried}: the part of a run's files the
        results database holds (gearfarm.run.retention prunes it with the rest)."""
        q = (select(JobRow.run_id, func.sum(func.length(cast(JobRow.files, String))))
             .where(JobRow.files.is_not(None)).group_by(JobRow.run_id))
        with self.engine.connect() as conn:
            return {run: int(size or 0) for run, size in conn.execute(q)}

    def drop_carried(self, run_id: str) -> int:
        """Forget the job files run ``run_id``'s records carried (its files expired); how many jobs
        had some. The records stay: they are the history."""
        with self.engine.begin() as conn:
            return conn.execute(update(JobRow).where(JobRow.run_id == run_id, JobRow.files.is_not(None))
                                .values(files=None)).rowcount

    def job_file(self, job_id: str, name: str) -> bytes | None:
        """The file ``name`` that the job's record carried (None: it carried none; it may be in S3)."""
        with self.engine.connect() as conn:
            files = conn.execute(select(JobRow.files).where(JobRow.job_id == job_id)).scalar()
        carried = (files or {}).get(name)
        if carried is None:
            return None
        try:
            return unpack_file(carried)
        except ValueError as e:
            # Checked when the record was applied (it decompresses, within bounds): the row was
            # changed since. Said, and then the file is looked for where else it may be.
            log.error("the %s of %s in the results database cannot be read: %s", name, job_id, e)
            return None

    def job_states(self, run_id: str) -> dict[str, str]:
        """{job id: status} of a run's jobs, without reading their records (polled often)."""
        with self.polling() as conn:
            q = select(JobRow.job_id, JobRow.status).where(JobRow.run_id == run_id)
            return {jid: st for jid, st in conn.execute(q)}

    def job_states_since(self, run_id: str, since: float) -> tuple[dict[str, str], float | None]:
        """{job id: status} of the run's jobs the ledger applied a record to at or after ``since``
        (its deliveries log, written in the transaction that changed the job's row), and the
        latest such time (None: none since): what changed, for a poll that read the rest."""
        # One statement (the deliveries since, each with its job's state now), in autocommit:
        # it was a session's four round trips and the ORM's Python, five times a second.
        q = (select(JobRow.job_id, JobRow.status, DeliveryRow.at)
             .join(JobRow, JobRow.job_id == DeliveryRow.job_id)
             .where(DeliveryRow.at >= since, DeliveryRow.run_id == run_id, DeliveryRow.outcome == "applied"))
        got: dict[str, str] = {}
        latest: float | None = None
        with self.polling() as conn:
            for jid, st, at in conn.execute(q):
                got[jid] = st
                latest = at if latest is None or at > latest else latest
        return got, latest

    def terminal_ids(self, run_id: str) -> set[str]:
        return {jid for jid, st in self.job_states(run_id).items() if st in TERMINAL}

    def cases_of(self, name: str, target: str | None = None, suite: str | None = None,
                 reruns: bool = False, project: str | None = None, recent: int | None = None) -> list[tuple[Case, Run]]:
        """Every result of a test case, oldest run first (a name may be "suite/name"), in every
        project or in ``project``; with ``recent``, only in the newest that many runs. The runs
        come with their identity only (id, revision, project, time), not their JSON columns."""
        if suite is None and "/" in name:
            suite, name = name.split("/", 1)
        with self.session() as s:
            q = (select(Case, Run).join(Run, Run.run_id == Case.run_id)
                 .options(load_only(Run.run_id, Run.rev, Run.created_at, Run.project, Run.parent_run_id))
                 .where(Case.name == name).order_by(Run.created_at, Case.id))
            if recent is not None:
                # The newest runs by id, then their cases by (name, run id): a bound on time
                # instead read the case in every night before dropping the older ones.
                newest = select(Run.run_id).where(Run.parent_run_id.is_(None)).order_by(Run.created_at.desc())
                if project is not None:
                    newest = newest.where(Run.project == project)
                ids = list(s.scalars(newest.limit(recent)))
                if reruns:
                    ids += list(s.scalars(select(Run.run_id).where(Run.parent_run_id.in_(ids))))
                q = q.where(Case.run_id.in_(ids))
            if target is not None:
                q = q.where(Case.target == target)
            if suite is not None:
                q = q.where(Case.suite == suite)
            if project is not None:
                q = q.where(Run.project == project)
            if not reruns:
                q = q.where(Run.parent_run_id.is_(None))
            return list(s.execute(q).tuples())

    def cases_in(self, run_ids: Iterable[str]) -> list[tuple[str, str, str, str, str]]:
        """(run_id, target, suite, name, status) of every case in the given runs."""
        ids = list(run_ids)
        if not ids:
            return []
        with self.session() as s:
            q = select(Case.run_id, Case.target, Case.suite, Case.name, Case.status).where(Case.run_id.in_(ids))
            return [tuple(r) for r in s.execute(q)]  # type: ignore[misc]

    def case_counts(self, run_id: str) -> dict[str, dict[str, int]]:
        """Job id -> {case status: how many} of a run's test cases, counted by the database."""
        with self.session() as s:
            q = select(Case.job_id, Case.status, func.count()).where(Case.run_id == run_id).group_by(
                Case.job_id, Case.status)
            out: dict[str, dict[str, int]] = {}
            for jid, status, n in s.execute(q):
                out.setdefault(jid, {})[status] = n
            return out

    def case_list(self, run_id: str, failing: bool = False) -> list[Any]:
        """A run's test cases (only the failed and errored ones when ``failing``), by job then in
        the order the job reported them: rows with job_id, classname, name, status, time, message."""
        q = select(Case.job_id, Case.classname, Case.name, Case.status, Case.time, Case.message).where(
            Case.run_id == run_id)
        if failing:
            q = q.where(text(FAILING_SQL))
        with self.engine.connect() as conn:  # not a Session: its rows cost twice as much (200,000 of them)
            return list(conn.execute(q.order_by(Case.job_id, Case.id)).all())

    def case_changes(self, run_a: str, run_b: str) -> list[tuple[str, str, str, str | None, str | None]]:
        """(target, suite, name, status in A, status in B) of the test cases whose status differs
        between runs A and B (None: not in that run), joined by the database: reading both runs'
        cases to compare them was 400,000 rows for two 5,000-job nights."""
        def side(run_id: str, name: str) -> Any:
            return select(Case.target, Case.suite, Case.name, Case.status).where(Case.run_id == run_id).subquery(name)

        a, b = side(run_a, "a"), side(run_b, "b")
        same = (a.c.target == b.c.target) & (a.c.suite == b.c.suite) & (a.c.name == b.c.name)
        q = (select(func.coalesce(a.c.target, b.c.target), func.coalesce(a.c.suite, b.c.suite),
                    func.coalesce(a.c.name, b.c.name), a.c.status, b.c.status)
             .select_from(a.join(b, same, full=True)).where(a.c.status.is_distinct_from(b.c.status)))
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(q)]  # type: ignore[misc]

    def failing_in(self, run_ids: Iterable[str]) -> list[tuple[str, str, str, str]]:
        """(run id, target, suite, name) of the failed and errored cases of the given runs (through
        the partial index ix_cases_failing: not one row of the cases that passed)."""
        ids = list(run_ids)
        out: list[tuple[str, str, str, str]] = []
        with self.session() as s:
            for i in range(0, len(ids), IN_CHUNK):
                q = select(Case.run_id, Case.target, Case.suite, Case.name).where(
                    Case.run_id.in_(ids[i:i + IN_CHUNK]), text(FAILING_SQL))
                out += [tuple(r) for r in s.execute(q)]  # type: ignore[misc]
        return out

    def case_statuses(self, run_ids: Iterable[str], keys: Iterable[tuple[str, str, str]]
                      ) -> list[tuple[str, str, str, str, str]]:
        """(run id, target, suite, name, status) of the cases ``keys`` (target, suite, name) in the
        given runs, through the index by (target, suite, name): a few tests' whole history."""
        ids, wanted = list(run_ids), sorted(set(keys))
        out: list[tuple[str, str, str, str, str]] = []
        if not ids:
            return out
        with self.session() as s:
            for i in range(0, len(wanted), IN_CHUNK):
                q = select(Case.run_id, Case.target, Case.suite, Case.name, Case.status).where(
                    tuple_(Case.target, Case.suite, Case.name).in_(wanted[i:i + IN_CHUNK]), Case.run_id.in_(ids))
                out += [tuple(r) for r in s.execute(q)]  # type: ignore[misc]
        return out

    def job_statuses(self, run_ids: Iterable[str], failing: bool = False,
                     steps: Iterable[tuple[str, str]] | None = None) -> list[tuple[str, str, str, str]]:
        """(run id, target, step, status) of the jobs of the given runs: all of them, those that did
        not pass (``failing``), or those of the (target, step) pairs ``steps``."""
        ids = list(run_ids)
        pairs = sorted(set(steps)) if steps is not None else None  # once: an iterator is read once
        out: list[tuple[str, str, str, str]] = []
        with self.session() as s:
            for i in range(0, len(ids), IN_CHUNK):
                q = select(JobRow.run_id, JobRow.target, JobRow.step, JobRow.status).where(
                    JobRow.run_id.in_(ids[i:i + IN_CHUNK]))
                if failing:
                    q = q.where(JobRow.status != "passed")
                if pairs is None:
                    out += [tuple(r) for r in s.execute(q)]  # type: ignore[misc]
                    continue
                for k in range(0, len(pairs), IN_CHUNK):
                    out += [tuple(r) for r in s.execute(  # type: ignore[misc]
                        q.where(tuple_(JobRow.target, JobRow.step).in_(pairs[k:k + IN_CHUNK])))]
        return out

    def job_cells(self, run_ids: Iterable[str]) -> list[tuple[str, str, str, str, float | None, float | None]]:
        """(run_id, target, step, status, started_at, finished_at) of every job recorded in the
        given runs, without their records (the dashboard's status grid reads hundreds)."""
        ids = list(run_ids)
        if not ids:
            return []
        q = select(JobRow.run_id, JobRow.target, JobRow.step, JobRow.status, JobRow.started_at, JobRow.finished_at
                   ).where(JobRow.run_id.in_(ids))
        with self.engine.connect() as conn:  # not a Session: its rows cost twice as much (50,000 a page)
            return [tuple(r) for r in conn.execute(q).all()]  # type: ignore[misc]

    def run_times(self, run_ids: Iterable[str]) -> dict[str, float]:
        """Run id -> when it started."""
        ids = list(run_ids)
        if not ids:
            return {}
        with self.session() as s:
            return dict(s.execute(select(Run.run_id, Run.created_at).where(Run.run_id.in_(ids))).tuples().all())

    def series_keys(self, run_ids: Iterable[str]) -> list[tuple[str, str, str, str, str]]:
        """(project, target, host class, benchmark, metric) of every series the given runs measured."""
        ids = list(run_ids)
        if not ids:
            return []
        with self.session() as s:
            q = (select(Run.project, SampleRow.target, SampleRow.host_class, SampleRow.benchmark, SampleRow.metric)
                 .join(Run, Run.run_id == SampleRow.run_id)
                 .where(SampleRow.run_id.in_(ids), SampleRow.variant == "new").distinct())
            return sorted(tuple(r) for r in s.execute(q))  # type: ignore[misc]

    def new_values(self, run_ids: Iterable[str]) -> list[tuple[str, str, str, str, str, float]]:
        """(run id, target, host class, benchmark, metric, value) of tonight's builds' samples in
        the given runs: the performance index's latest values and sparklines."""
        ids = list(run_ids)
        if not ids:
            return []
        with self.session() as s:
            q = (select(SampleRow.run_id, SampleRow.target, SampleRow.host_class, SampleRow.benchmark,
                        SampleRow.metric, SampleRow.value)
                 .where(SampleRow.run_id.in_(ids), SampleRow.variant == "new"))
            return [tuple(r) for r in s.execute(q)]  # type: ignore[misc]

    def request_cancel(self, run_id: str, job_id: str | None, who: str) -> bool:
        """Record a cancel request; False when the same one was made already."""
        with self.writing() as conn:
            if job_id is None:
                # NULL never equals NULL in a unique constraint: look first, under the write lock.
                exists = conn.execute(select(Cancellation.id).where(Cancellation.run_id == run_id,
                                                                    Cancellation.job_id.is_(None))).first()
                if exists is not None:
                    return False
            stmt = self.insert(Cancellation).values(run_id=run_id, job_id=job_id, who=who, at=time.time())
            return conn.execute(stmt.on_conflict_do_nothing(index_elements=["run_id", "job_id"])
                                .returning(Cancellation.id)).first() is not None

    def cancellations(self, run_id: str) -> list[Cancellation]:
        with self.session() as s:
            return list(s.scalars(select(Cancellation).where(Cancellation.run_id == run_id)
                                  .order_by(Cancellation.id)))

    def set_live(self, run_id: str, states: dict[str, tuple[str, int]]) -> None:
        """{job id: (state, attempt)} of jobs whose state changed, as the nightly sees them now."""
        if not states:
            return
        now = time.time()
        with self.writing() as conn:
            conn.execute(self._live_upsert, [dict(job_id=jid, run_id=run_id, state=state, attempt=attempt, since=now)
                                             for jid, (state, attempt) in states.items()])

    @functools.cached_property
    def _live_upsert(self) -> TextClause:
        """Made once, run for all of a change's jobs at once: made per job, a 5,000-job night's
        nightly spent 150 of its 520 s compiling and sending one upsert a job (docs/speed.md)."""
        ins = self.insert(LiveJob.__table__)
        # Never lower: the row's attempt is the highest the farm submitted, which the ledger
        # checks a worker's record against (a nightly started again counts from 1).
        highest = case((LiveJob.attempt > ins.excluded.attempt, LiveJob.attempt), else_=ins.excluded.attempt)
        return self.compiled(ins.on_conflict_do_update(index_elements=["job_id"], set_={
            "state": ins.excluded.state, "attempt": highest, "since": ins.excluded.since}),
            ("job_id", "run_id", "state", "attempt", "since"))

    def leases(self, run_id: str) -> dict[tuple[str, int], tuple[str, int]]:
        """{(job id, attempt): (holder's host, signed beats so far)} of a run's held leases (an
        attempt that delivered its record holds none): as many as jobs run, not as the run has."""
        with self.polling() as conn:
            q = (select(LeaseRow.job_id, LeaseRow.attempt, LeaseRow.host, LeaseRow.beats)
                 .where(LeaseRow.run_id == run_id, LeaseRow.done.is_(False)))
            return {(j, a): (h, b) for j, a, h, b in conn.execute(q)}

    def holders(self, before: float, since: float) -> list[tuple[str, str, float]]:
        """(job id, holder's host, claimed at) of the jobs of every run that held a worker slot
        from before ``before`` until ``since`` or later: claimed before it, and still held (a
        signed beat since ``since``) or recorded as finished since. What a job that never started
        by its run's deadline waited behind, though those jobs may have ended since (another
        run's, stopped at its own deadline a moment earlier)."""
        with self.polling() as conn:
            ended = select(JobRow.finished_at).where(JobRow.job_id == LeaseRow.job_id,
                                                     JobRow.attempt == LeaseRow.attempt).scalar_subquery()
            q = (select(LeaseRow.job_id, LeaseRow.host, LeaseRow.claimed_at)
                 .where(LeaseRow.claimed_at < before,
                        or_(and_(LeaseRow.done.is_(False), LeaseRow.beat_at >= since), ended >= since)))
            return [(j, h, c) for j, h, c in conn.execute(q)]

    def live(self, run_ids: Iterable[str]) -> dict[str, LiveJob]:
        ids = list(run_ids)
        if not ids:
            return {}
        with self.session() as s:
            return {j.job_id: j for j in s.scalars(select(LiveJob).where(LiveJob.run_id.in_(ids)))}

    def create_bisection(self, project: str, target: str, kind: str, subject: dict[str, Any], good_rev: str,
                         bad_rev: str, origin_run_id: str | None = None) -> Bisection:
        with self.session(write=True) as s:
            b = Bisection(project=project, target=target, kind=kind, subject=subject, good_rev=good_rev,
                          bad_rev=bad_rev, origin_run_id=origin_run_id, state="running", detail={},
                          created_at=time.time())
            s.add(b)
            s.flush()
            s.expunge(b)
            return b

    def get_bisection(self, bid: int) -> Bisection:
        with self.session() as s:
            b = s.get(Bisection, bid)
            if b is None:
                raise KeyError(f"no bisection {bid}")
            return b

    def update_bisection(self, bid: int, state: str | None = None, culprit_rev: str | None = None,
                         **detail: Any) -> None:
        """Merge keys into its detail; a state other than running ends it."""
        with self.session(write=True) as s:
            b = s.get(Bisection, bid)
            if b is None:
                raise KeyError(f"no bisection {bid}")
            b.detail = {**(b.detail or {}), **detail}
            if state is not None:
                b.state = state
                if state != "running":
                    b.finished_at = time.time()
            if culprit_rev is not None:
                b.culprit_rev = culprit_rev

    def bisections(self, origin_run_ids: Iterable[str] | None = None, project: str | None = None,
                   limit: int = 100) -> list[Bisection]:
        """Newest first: of the given nightly runs, or of a project, or all."""
        with self.session() as s:
            q = select(Bisection).order_by(Bisection.id.desc()).limit(limit)
            if origin_run_ids is not None:
                q = q.where(Bisection.origin_run_id.in_(list(origin_run_ids)))
            if project is not None:
                q = q.where(Bisection.project == project)
            return list(s.scalars(q))

    def revisions_last_used(self) -> dict[str, float]:
        """Each revision's newest run of any kind (nightly, re-run, bisection probe), by start."""
        with self.session() as s:
            return {rev: at for rev, at in s.execute(select(Run.rev, func.max(Run.created_at)).group_by(Run.rev))}

    def run_ages(self) -> dict[str, tuple[float, str]]:
        """Every run id -> (created_at, state)."""
        with self.session() as s:
            return {rid: (at, state) for rid, at, state in s.execute(select(Run.run_id, Run.created_at, Run.state))}

    def running_runs(self, limit: int = 20) -> list[Run]:
        """Runs not finished yet (re-runs included), newest first."""
        with self.session() as s:
            return list(s.scalars(select(Run).where(Run.state == "running").order_by(Run.created_at.desc())
                                  .limit(limit)))

    def latest_run_at(self, rev_prefix: str) -> Run | None:
        """The newest run (not a re-run) of a revision given by its first hex digits."""
        with self.session() as s:
            return s.scalars(select(Run).where(Run.rev.startswith(rev_prefix, autoescape=True),
                                               Run.parent_run_id.is_(None))
                             .order_by(Run.created_at.desc()).limit(1)).first()

    def runs_before(self, created_at: float, project: str, target: str | None = None,
                    limit: int = 50) -> list[Run]:
        """Runs (not re-runs) of ``project`` older than ``created_at`` that planned ``target``,
        newest first, without their expected jobs and notes (a big night's are hundreds of KB of
        JSON, and a report asks for a few dozen runs per target)."""
        with self.session() as s:
            q = (select(Run).where(Run.created_at < created_at, Run.parent_run_id.is_(None), Run.project == project)
                 .options(defer(Run.expected, raiseload=True), defer(Run.notes, raiseload=True))
                 .order_by(Run.created_at.desc()))
            if target is None:
                return list(s.scalars(q.limit(limit)))
            # targets is a JSON list; filtering it portably in SQL is not worth it for a few
            # hundred rows, so filter here and read in pages until ``limit`` are found.
            out: list[Run] = []
            for run in s.scalars(q.execution_options(yield_per=200)):
                if target in (run.targets or []):
                    out.append(run)
                    if len(out) >= limit:
                        break
            return out

    def runs_before_each(self, created_at: float, project: str, targets: Iterable[str],
                         limit: int = 50) -> dict[str, list[Run]]:
        """``runs_before`` for each of ``targets`` in one reading (a night of 100 targets asked
        100 times, each reading the same runs)."""
        out: dict[str, list[Run]] = {t: [] for t in targets}
        hungry = set(out)
        with self.session() as s:
            q = (select(Run).where(Run.created_at < created_at, Run.parent_run_id.is_(None), Run.project == project)
                 .options(defer(Run.expected, raiseload=True), defer(Run.notes, raiseload=True))
                 .order_by(Run.created_at.desc()))
            for run in s.scalars(q.execution_options(yield_per=200)):
                for t in hungry.intersection(run.targets or []):
                    out[t].append(run)
                    if len(out[t]) >= limit:
                        hungry.discard(t)
                if not hungry:
                    break
        return out

    def last_good_build(self, project: str, target: str, exclude_rev: str) -> ResultRecord | None:
        """The newest passed build of ``project`` for ``target`` at another revision whose tests
        all passed: the baseline a perf job runs against tonight's build."""
        for run in self.runs_before(time.time(), project, target, limit=60):
            if run.rev == exclude_rev:
                continue
            recs = self.jobs(run.run_id, target)
            build = next((r for r in recs if r.step == "build"), None)
            if (build is not None and build.status == "passed" and build.artifact_key and build.artifact_sha256
                    and all(r.status == "passed" for r in recs if r.kind == "test")):
                return build
        return None

    def signed_builds(self, project: str, rev: str, target: str, limit: int = 16) -> list[ResultRecord]:
        """Passed builds of ``project`` at ``rev`` for ``target`` that name their artifact and its
        manifest by sha256 (records the ledger applied, so signed by a registered build host),
        newest first, one per artifact key: the builds a build job may reuse."""
        with self.session() as s:
            q = (select(JobRow.record).join(Run, Run.run_id == JobRow.run_id)
                 .where(Run.project == project, Run.rev == rev, JobRow.target == target, JobRow.step == "build",
                        JobRow.status == "passed").order_by(JobRow.finished_at.desc()))
            out: dict[str, ResultRecord] = {}
            for (data,) in s.execute(q.limit(200)):
                r = ResultRecord.model_validate(data)
                if r.artifact_key and r.artifact_sha256 and r.manifest_sha256 and r.artifact_key not in out:
                    out[r.artifact_key] = r
                    if len(out) >= limit:
                        break
            return list(out.values())

    def step_seconds(self, project: str, target: str, before: float) -> dict[str, float]:
        """{step: seconds of its own work} of ``target``'s jobs in ``project``'s newest run created
        before ``before`` that has finished jobs of it: which of its suites to queue first tonight
        (gearfarm.run.priority)."""
        for run in self.runs_before(before, project, target, limit=5):
            got = {r.step: w for r in self.jobs(run.run_id, target)
                   if r.status in ("passed", "failed") and (w := r.work_seconds) is not None}
            if got:
                return got
        return {}

    def reference_build(self, project: str, target: str, nights: int) -> Artifact | None:
        """The reference build ``target``'s perf jobs keep measuring against (the perf jobs' third
        side, docs/performance.md): the one the newest nights used, while fewer than ``nights``
        nights have used it and its build is on record; None when it is time to pin a new one (the
        nightly then pins tonight's baseline) or ``nights`` is 0. A night that measured nothing
        (its build failed) neither uses nor ends a reference."""
        if nights <= 0:
            return None
        rev, used = None, 0
        for run in self.runs_before(time.time(), project, target, limit=2 * nights + 10):
            refs = {r.reference_rev for r in self.jobs(run.run_id, target) if r.kind == "perf" and r.reference_rev}
            if not refs:
                continue
            if rev is None:
                rev = sorted(refs)[0]
            if rev not in refs:
                break
            used += 1
            if used >= nights:
                return None
        if rev is None:
            return None
        for run in self.runs_before(time.time(), project, target, limit=400):
            if run.rev != rev:
                continue
            build = next((r for r in self.jobs(run.run_id, target) if r.step == "build"), None)
            if build is not None and build.status == "passed" and build.artifact_key and build.artifact_sha256:
                return Artifact(build.artifact_key, build.artifact_sha256, rev)
        return None

    def annotate(self, benchmark: str, metric: str, target: str, rev: str, note: str) -> bool:
        """Mark a change as expected; False when it was marked already."""
        with self.session(write=True) as s:
            q = select(Annotation).where(Annotation.benchmark == benchmark, Annotation.metric == metric,
                                         Annotation.target == target, Annotation.rev == rev)
            if s.scalars(q).first() is not None:
                return False
            s.add(Annotation(benchmark=benchmark, metric=metric, target=target, rev=rev, note=note,
                             created_at=time.time()))
            return True

    def expected_changes(self) -> dict[tuple[str, str, str], set[str]]:
        """(benchmark, metric, target) -> revisions whose changes are expected."""
        out: dict[tuple[str, str, str], set[str]] = {}
        with self.session() as s:
            for a in s.scalars(select(Annotation)):
                out.setdefault((a.benchmark, a.metric, a.target), set()).add(a.rev)
        return out

    def perf_series(self, project: str, target: str, host_class: str, benchmark: str, metric: str, upto: float,
                    window: int) -> list[tuple[str, str, dict[str, list[float]]]]:
        """[(run id, rev, {variant: values})] oldest first for the last ``window`` runs of
        ``project`` up to ``upto`` that measured this metric on this host class (re-runs
        excluded; two projects' benchmarks of one name are two series). Variants:
        new (tonight's build), baseline (the last good build), ratio (new/baseline per pair)."""
        series = (SampleRow.target == target, SampleRow.host_class == host_class, SampleRow.benchmark == benchmark,
                  SampleRow.metric == metric)
        with self.session() as s:
            # The window's runs first, newest first with a LIMIT, then only their samples: the
            # run and compare pages ask this for every series they show, and reading the whole
            # history to keep its tail made them grow with every night (4.7 s at 1,000 runs).
            last = list(s.scalars(
                select(Run.run_id)
                .where(Run.project == project, Run.created_at <= upto, Run.parent_run_id.is_(None),
                       select(SampleRow.run_id).where(SampleRow.run_id == Run.run_id, *series).exists())
                .order_by(Run.created_at.desc()).limit(window)))
            q = (select(Run.run_id, Run.rev, SampleRow.variant, SampleRow.value)
                 .join(Run, Run.run_id == SampleRow.run_id)
                 .where(SampleRow.run_id.in_(last), *series)
                 .order_by(Run.created_at, SampleRow.repetition))
            by_run: dict[str, tuple[str, dict[str, list[float]]]] = {}
            for run_id, rev, variant, value in s.execute(q):
                by_run.setdefault(run_id, (rev, {}))[1].setdefault(variant, []).append(value)
        return [(rid, rev, values) for rid, (rev, values) in by_run.items()]

    def perf_trends(self, project: str, keys: list[tuple[str, str, str, str]], upto: float, window: int,
                    variant: str = "new") -> dict[tuple[str, str, str, str], list[list[float]]]:
        """For each (target, host class, benchmark, metric) of ``keys``: the ``variant`` values of
        each of its last ``window`` runs up to ``upto``, oldest first -- ``perf_series`` for many
        series in two queries (a run page shows every series the run measured: one query each
        made the page cost grow with the number of series)."""
        wanted = set(keys)
        with self.session() as s:
            last = list(s.scalars(
                select(Run.run_id)
                .where(Run.project == project, Run.created_at <= upto, Run.parent_run_id.is_(None),
                       select(SampleRow.run_id).where(SampleRow.run_id == Run.run_id).exists())
                .order_by(Run.created_at.desc()).limit(window)))
            q = (select(SampleRow.target, SampleRow.host_class, SampleRow.benchmark, SampleRow.metric,
                        SampleRow.run_id, SampleRow.value)
                 .join(Run, Run.run_id == SampleRow.run_id)
                 .where(SampleRow.run_id.in_(last), SampleRow.variant == variant)
                 .order_by(Run.created_at, SampleRow.repetition))
            found: dict[tuple[str, str, str, str], dict[str, list[float]]] = {}
            for target, host_class, benchmark, metric, run_id, value in s.execute(q):
                key = (target, host_class, benchmark, metric)
                if key in wanted:
                    found.setdefault(key, {}).setdefault(run_id, []).append(value)
        out = {k: list(v.values()) for k, v in found.items()}
        for key in keys:
            if len(out.get(key, [])) < window and len(last) == window:
                # Not measured on every one of the project's last nights: its own window, further back.
                out[key] = [v[variant] for _, _, v in self.perf_series(project, *key, upto, window) if variant in v]
        return out

    def step_records(self, run_ids: list[str], target: str, step: str) -> dict[str, ResultRecord]:
        """Run id -> the record of one step (e.g. "perf-iibench") on one target, for each of
        ``run_ids`` that has one: what a series needs beyond its samples (baseline, quietness)."""
        if not run_ids:
            return {}
        with self.session() as s:
            rows = s.scalars(select(JobRow).where(JobRow.run_id.in_(run_ids), JobRow.target == target,
                                                 JobRow.step == step))
            return {r.run_id: ResultRecord.model_validate(r.record) for r in rows}

    def perf_keys(self, run_id: str) -> list[tuple[str, str, str, str]]:
        """The (target, host class, benchmark, metric) series a run has samples in."""
        with self.session() as s:
            q = (select(SampleRow.target, SampleRow.host_class, SampleRow.benchmark, SampleRow.metric)
                 .where(SampleRow.run_id == run_id, SampleRow.variant == "new").distinct())
            return sorted(tuple(r) for r in s.execute(q))  # type: ignore[misc]

    def host_jobs(self, run_ids: list[str]) -> list[tuple[str, str, int]]:
        """(host name, status, jobs) of the runs ``run_ids``: each host's share of the recent
        nights and how its jobs ended (infra failures are the host's own)."""
        if not run_ids:
            return []
        with self.session() as s:
            q = (select(Host.hostname, JobRow.status, func.count())
                 .join(Host, Host.host_id == JobRow.host_id)
                 .where(JobRow.run_id.in_(run_ids)).group_by(Host.hostname, JobRow.status))
            return [(h, st, int(n)) for h, st, n in s.execute(q)]

    def open_leases(self) -> list[LeaseRow]:
        """The job attempts a host holds and has not delivered, newest beat first."""
        with self.session() as s:
            return list(s.scalars(select(LeaseRow).where(LeaseRow.done.is_(False)).order_by(LeaseRow.beat_at.desc())))

    def case_rows(self, run_ids: list[str], query: str | None = None) -> list[tuple[str, str, str, str, str, float]]:
        """(run id, target, suite, name, status, seconds) of the test cases of ``run_ids``, those
        whose suite/name holds ``query`` (any case) when given: the tests page's reading."""
        if not run_ids:
            return []
        q = select(Case.run_id, Case.target, Case.suite, Case.name, Case.status, Case.time).where(
            Case.run_id.in_(run_ids))
        if query:
            q = q.where(func.lower(Case.suite + "/" + Case.name).contains(query.lower(), autoescape=True))
        with self.engine.connect() as conn:  # not a Session: its rows cost twice as much
            return [tuple(r) for r in conn.execute(q).all()]  # type: ignore[misc]

    def case_times(self, suite: str, name: str, run_ids: list[str]) -> dict[tuple[str, str], float]:
        """(run id, target) -> seconds of one test case in the given runs."""
        if not run_ids:
            return {}
        with self.session() as s:
            q = select(Case.run_id, Case.target, Case.time).where(Case.name == name, Case.suite == suite,
                                                                   Case.run_id.in_(run_ids))
            return {(rid, target): secs for rid, target, secs in s.execute(q)}

    def hosts(self) -> list[Host]:
        with self.session() as s:
            return list(s.scalars(select(Host).order_by(Host.first_seen)))

    def late_results(self, run_id: str) -> list[tuple[float, ResultRecord]]:
        """Results that arrived after the run's report, oldest first."""
        with self.session() as s:
            q = select(LateResult).where(LateResult.run_id == run_id).order_by(LateResult.arrived_at)
            return [(r.arrived_at, ResultRecord.model_validate(r.record)) for r in s.scalars(q)]

    def delivery_counts(self, since: float = 0.0) -> dict[str, int]:
        """Outcome -> number of records offered to the ledger since ``since``."""
        with self.session() as s:
            q = select(DeliveryRow.outcome, func.count()).where(DeliveryRow.at >= since).group_by(DeliveryRow.outcome)
            return {outcome: n for outcome, n in s.execute(q)}

    def deliveries(self, run_id: str) -> list[DeliveryRow]:
        with self.session() as s:
            return list(s.scalars(select(DeliveryRow).where(DeliveryRow.run_id == run_id).order_by(DeliveryRow.id)))

    def ranked(self, run_id: str) -> list[tuple[str, int, str]]:
        """(job id, attempt, digest) of every record of the run the ledger has ranked (applied,
        duplicate, superseded or late): offering one of them again changes nothing."""
        with self.session() as s:
            q = (select(DeliveryRow.job_id, DeliveryRow.attempt, DeliveryRow.digest)
                 .where(DeliveryRow.run_id == run_id, DeliveryRow.digest.is_not(None),
                        DeliveryRow.outcome.in_(("applied", "duplicate", "superseded", "late"))).distinct())
            return [(j, a, d) for j, a, d in s.execute(q)]

    def upsert_host(self, conn: Connection, fp: dict[str, str]) -> str:
        """The host's id; its row made, or its last_seen refreshed, in the caller's transaction.
        A host whose row this process found already there (committed by then: rows of hosts
        are never deleted) is refreshed at most every HOST_REFRESH seconds: the ledger applies
        every record of every host, and the write was one of a record's round trips."""
        # Each cut to its column (a host's compiler banner may be longer): the database refuses a
        # longer value, and the record with it.
        fields = {k: str(fp.get(k, ""))[:_HOST_TEXT.get(k, 20)] for k in ("hostname", "cpu", "cores", "mem_gib",
                                                                          "kernel", "machine", "compiler")}
        host_id = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        if time.monotonic() - self._hosts_there.get(host_id, float("-inf")) < HOST_REFRESH:
            return host_id
        now = time.time()
        first_seen = conn.execute(self._host_upsert, dict(
            host_id=host_id, hostname=fields["hostname"], host_class=fp.get("class", "")[:_HOST_TEXT["class"]],
            cpu_model=fields["cpu"],
            cores=_int(fields["cores"]), memory_gib=_int(fields["mem_gib"]), kernel=fields["kernel"],
            machine=fields["machine"], compiler=fields["compiler"], first_seen=now, last_seen=now)).scalar()
        if first_seen != now:  # not made by this transaction, which may yet roll back
            self._hosts_there[host_id] = time.monotonic()
        return host_id

    @functools.cached_property
    def _host_upsert(self) -> Any:
        """Made once: the ledger upserts the host of every record it applies."""
        ins = self.insert(Host.__table__)
        return self.compiled(ins.on_conflict_do_update(index_elements=["host_id"],
                                                       set_={"last_seen": ins.excluded.last_seen})
                             .returning(Host.first_seen),
                             ("host_id", "hostname", "host_class", "cpu_model", "cores", "memory_gib", "kernel",
                              "machine", "compiler", "first_seen", "last_seen"))


def _int(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        return 0


MIGRATIONS = Path(__file__).parent / "migrations"
# The revision whose schema equals what create_all made before migrations existed: a database
# from then is stamped with it and upgraded from there.
BASELINE = "0001"


def alembic_config(connection: Any = None) -> Any:
    """Alembic configured in code: no alembic.ini, the scripts ship inside the package."""
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision. The collector, the nightly and the CLI may open
    the database at the same moment, so the upgrade runs under a lock (a file lock beside a
    SQLite file, an advisory lock on PostgreSQL) and is skipped at once when already current."""
    from alembic import command

    head = head_revision()
    if current_revision(engine) == head:
        return
    with _migration_lock(engine):
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                # Held until this transaction ends: PostgreSQL runs the DDL transactionally.
                conn.execute(text("SELECT pg_advisory_xact_lock(7141590)"))
            cfg = alembic_config(conn)
            tables = set(inspect(conn).get_table_names())
            if "alembic_version" not in tables and "runs" in tables:
                command.stamp(cfg, BASELINE)
            command.upgrade(cfg, "head")


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    db = engine.url.database if engine.dialect.name == "sqlite" else None
    if not db or db == ":memory:":
        yield
        return
    with open(f"{db}.migrate.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
