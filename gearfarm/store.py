"""The results database (SQLAlchemy): runs, jobs (one row per job id), test cases and
benchmark samples. SQLite by default; PostgreSQL when the configured URL says so."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    create_engine,
    delete,
    event,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from gearfarm.result import TERMINAL, ResultRecord


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"
    run_id: Mapped[str] = mapped_column(String(96), primary_key=True)
    rev: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Every job id the run must end with, so a missing one is visible, never silent.
    expected: Mapped[list[str]] = mapped_column(JSON)
    targets: Mapped[list[str]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), default="running")
    notes: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Job(Base):
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


class Case(Base):
    __tablename__ = "cases"
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


class ResultsDB:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = create_engine(url, future=True)
        if url.startswith("sqlite"):
            # The collector writes while the nightly and CLI read: WAL lets them overlap,
            # and a busy timeout turns lock contention into waiting instead of errors.
            @event.listens_for(self.engine, "connect")
            def _pragmas(conn: Any, _rec: Any) -> None:
                cur = conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.close()

        self._session = sessionmaker(self.engine, expire_on_commit=False)
        Base.metadata.create_all(self.engine)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._session() as s, s.begin():
            yield s

    def create_run(self, run_id: str, rev: str, targets: list[str], expected: list[str],
                   notes: dict[str, Any] | None = None) -> bool:
        """Record a run; False when it exists already (a resubmission adds nothing)."""
        with self.session() as s:
            if s.get(Run, run_id) is not None:
                return False
            s.add(Run(run_id=run_id, rev=rev, created_at=time.time(), expected=expected,
                      targets=targets, state="running", notes=notes or {}))
            return True

    def get_run(self, run_id: str) -> Run | None:
        with self.session() as s:
            return s.get(Run, run_id)

    def runs(self, limit: int = 50) -> list[Run]:
        with self.session() as s:
            return list(s.scalars(select(Run).order_by(Run.created_at.desc()).limit(limit)))

    def finish_run(self, run_id: str, state: str) -> None:
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is not None:
                run.state = state
                run.finished_at = time.time()

    def upsert(self, rec: ResultRecord, host_class: str = "") -> bool:
        """Store a result; exactly one row per job id. Returns False when the stored row is
        already terminal and this record would not change it (a duplicate delivery)."""
        data = rec.model_dump(mode="json")
        with self.session() as s:
            if s.get(Run, rec.run_id) is None:
                # A result can outrun its run's row only in a lab where the run was submitted
                # against another database; keep the result rather than drop it.
                s.add(Run(run_id=rec.run_id, rev=rec.rev, created_at=time.time(), expected=[],
                          targets=[rec.target], state="running", notes={"implicit": True}))
                s.flush()
            row = s.get(Job, rec.job_id)
            if row is not None and row.record == data:
                return False
            if row is None:
                row = Job(job_id=rec.job_id, run_id=rec.run_id)
                s.add(row)
            row.target, row.kind, row.step, row.status = rec.target, rec.kind, rec.step, rec.status
            row.attempt, row.worker = rec.attempt, rec.worker
            row.started_at, row.finished_at, row.record = rec.started_at, rec.finished_at, data
            s.flush()
            s.execute(delete(Case).where(Case.job_id == rec.job_id))
            s.execute(delete(SampleRow).where(SampleRow.job_id == rec.job_id))
            s.add_all(Case(job_id=rec.job_id, run_id=rec.run_id, target=rec.target, suite=rec.name or rec.step,
                           classname=c.classname, name=c.name, status=c.status, time=c.time,
                           message=c.message[:4000]) for c in rec.cases)
            s.add_all(SampleRow(job_id=rec.job_id, run_id=rec.run_id, rev=rec.rev, target=rec.target,
                                host_class=host_class, benchmark=x.benchmark, metric=x.metric, variant=x.variant,
                                repetition=x.repetition, value=x.value) for x in rec.samples)
            return True

    def jobs(self, run_id: str) -> list[ResultRecord]:
        with self.session() as s:
            rows = s.scalars(select(Job).where(Job.run_id == run_id).order_by(Job.job_id))
            return [ResultRecord.model_validate(r.record) for r in rows]

    def job_count(self, run_id: str) -> int:
        with self.session() as s:
            return len(list(s.scalars(select(Job.job_id).where(Job.run_id == run_id))))

    def terminal_ids(self, run_id: str) -> set[str]:
        with self.session() as s:
            rows = s.execute(select(Job.job_id, Job.status).where(Job.run_id == run_id))
            return {jid for jid, st in rows if st in TERMINAL}

    def cases_of(self, name: str) -> Iterable[tuple[Case, Run]]:
        with self.session() as s:
            q = (select(Case, Run).join(Run, Run.run_id == Case.run_id)
                 .where(Case.name == name).order_by(Run.created_at))
            return list(s.execute(q).tuples())


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)
