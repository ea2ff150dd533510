"""Submitting a nightly run and seeing it to its end: plan the expected jobs from the catalog,
submit one signed background build job per target, then watch until every job is terminal,
recording "no worker" and deadline expiries instead of hanging."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gearfarm.catalog import Catalog
from gearfarm.config import Config
from gearfarm.gearman import Client, GearmanError, admin
from gearfarm.job import Payload, function_name, job_id, sign, step_name, unique_id
from gearfarm.result import TERMINAL, ResultRecord
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore, StoreError
from gearfarm.store import ResultsDB

log = logging.getLogger("gearfarm.nightly")


class RunError(RuntimeError):
    """The farm itself cannot run (exit status 2)."""


@dataclass
class Plan:
    run_id: str
    rev: str
    targets: list[str]
    suites: dict[str, list[str]]
    benchmarks: dict[str, list[str]]
    seed: int = 1
    expected: list[str] = field(default_factory=list)
    # target -> the baseline build's (rev, artifact key, sha256), for paired perf runs.
    baselines: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def build_payload(self, target: str, attempt: int = 1) -> Payload:
        base = self.baselines.get(target)
        extra = {"baseline_rev": base[0], "baseline_key": base[1], "baseline_sha256": base[2]} if base else {}
        return Payload(kind="build", run_id=self.run_id, rev=self.rev, target=target, suites=self.suites[target],
                       benchmarks=self.benchmarks[target], seed=self.seed, attempt=attempt,
                       submitted_at=time.time(), **extra)

    def steps(self, target: str) -> list[str]:
        return ([step_name("build")] + [step_name("test", s) for s in self.suites[target]]
                + [step_name("perf", b) for b in self.benchmarks[target]])


def resolve_rev(repo: Path, rev: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RunError(f"revision {rev!r} not found in {repo}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def plan(cat: Catalog, run_id: str, rev: str, targets: list[str] | None, suites: list[str] | None,
         benchmarks: list[str] | None, seed: int = 1) -> Plan:
    """Raise CatalogError naming the known entries for anything unknown."""
    names = targets if targets else sorted(cat.targets)
    for t in names:
        cat.target(t)
    benches = sorted(cat.benchmarks) if benchmarks is None else benchmarks
    for b in benches:
        cat.benchmark(b)
    p = Plan(run_id=run_id, rev=rev, targets=names,
             suites={t: cat.suites_for(t, suites) for t in names},
             benchmarks={t: list(benches) if cat.target(t).perf else [] for t in names}, seed=seed)
    p.expected = [job_id(run_id, t, s) for t in names for s in p.steps(t)]
    return p


def preflight(cfg: Config) -> dict[str, admin.FunctionStatus]:
    """gearmand's function table, from the first server that answers; RunError naming every
    address tried when none does."""
    from gearfarm.workers.base import ssl_context

    errors = []
    for host, port in cfg.gearman.addresses():
        try:
            return admin.status(host, port, ssl_context=ssl_context(cfg))
        except (OSError, GearmanError) as e:
            errors.append(f"{host}:{port} ({e})")
    raise RunError(f"gearmand is unreachable: tried {', '.join(errors)}; start it or fix [gearman] servers")


def submit(cfg: Config, db: ResultsDB, client: Client, p: Plan) -> bool:
    """Record the run and submit its build jobs. False when the run existed already: a
    resubmission then only re-sends jobs (gearmand dedupes them by unique id)."""
    created = db.create_run(p.run_id, p.rev, p.targets, p.expected,
                            notes={"suites": p.suites, "benchmarks": p.benchmarks, "seed": p.seed})
    for t in p.targets:
        if p.benchmarks[t]:
            base = db.last_good_build(t, p.rev)
            if base is not None and base.artifact_key and base.artifact_sha256:
                p.baselines[t] = (base.rev, base.artifact_key, base.artifact_sha256)
        payload = p.build_payload(t)
        if not created and job_id(p.run_id, t, "build") in db.terminal_ids(p.run_id):
            continue
        client.submit_background(payload.function, sign(payload, cfg.farm.secrets), unique=payload.unique)
    return created


def _function_of(step: str, target: str) -> str:
    kind = step.split("-", 1)[0]
    return function_name(kind, target)  # type: ignore[arg-type]


def reconcile(db: ResultsDB, store: ArtifactStore, run_id: str) -> int:
    """Load result records from S3 that the database lacks (a collector outage loses none)."""
    have = {r.job_id: r for r in db.jobs(run_id)}
    added = 0
    try:
        result_keys = list(store.list(keys.run_prefix(run_id)))
    except StoreError as e:
        log.warning("cannot reconcile from S3 now: %s", e)
        return 0
    for key in result_keys:
        if not key.endswith("/result.json"):
            continue
        try:
            rec = ResultRecord.model_validate_json(store.get_bytes(key))
        except (StoreError, ValueError) as e:
            log.warning("cannot read %s: %s", key, e)
            continue
        if rec.job_id not in have or have[rec.job_id].status not in TERMINAL:
            db.upsert(rec, host_class=rec.host.get("class", ""))
            added += 1
    return added


Progress = Callable[[dict[str, str], dict[str, admin.FunctionStatus]], None]


class Watchdog:
    """Finds jobs that lost their lease (heartbeat stalled: worker dead or cut off) or that
    gearmand dropped (--job-retries exhausted, which it does silently for background jobs),
    and submits them again under the next attempt's unique id, within the run's budget."""

    def __init__(self, cfg: Config, db: ResultsDB, store: ArtifactStore, client: Client, p: Plan) -> None:
        self.cfg, self.db, self.store, self.client, self.plan = cfg, db, store, client, p
        self.attempts: dict[str, int] = {}
        self.beats: dict[str, tuple[int, float]] = {}
        self.unknown_since: dict[str, float] = {}
        self.spent = 0

    def check(self, pending: list[str], states: dict[str, str], now: float) -> None:
        for jid in pending:
            if not _ready(jid, self.plan, states):
                continue
            attempt = self.attempts.get(jid, 1)
            try:
                st = self.client.get_status_unique(unique_id(jid, attempt))
            except GearmanError as e:
                log.warning("cannot ask gearmand about %s: %s", jid, e)
                return
            if st.known:
                self.unknown_since.pop(jid, None)
                if not st.running:
                    self.beats.pop(jid, None)
                    continue
                last = self.beats.get(jid)
                if last is None or last[0] != st.numerator:
                    self.beats[jid] = (st.numerator, now)
                elif now - last[1] > self.cfg.farm.lease_timeout:
                    self.resubmit(jid, states, f"lease lost: no heartbeat for {now - last[1]:.0f}s")
                continue
            since = self.unknown_since.setdefault(jid, now)
            if now - since > self.cfg.farm.lost_grace:
                # Its result may be on the way: S3 has it if the worker reported at all.
                reconcile(self.db, self.store, self.plan.run_id)
                if self.db.terminal_ids(self.plan.run_id) & {jid}:
                    continue
                self.resubmit(jid, states, "gearmand no longer holds the job and no result arrived")

    def resubmit(self, jid: str, states: dict[str, str], why: str) -> None:
        self.beats.pop(jid, None)
        self.unknown_since.pop(jid, None)
        if self.spent >= self.cfg.farm.resubmit_budget:
            _expire(self.db, self.plan, [jid], "infra",
                    f"{why}; the run's resubmission budget ({self.cfg.farm.resubmit_budget}) is spent")
            return
        self.spent += 1
        attempt = self.attempts.get(jid, 1) + 1
        self.attempts[jid] = attempt
        payload = self._payload(jid, attempt)
        if payload is None:
            _expire(self.db, self.plan, [jid], "infra", f"{why}; cannot resubmit: its build left no artifact")
            return
        log.warning("%s: %s; submitting attempt %d", jid, why, attempt)
        self.client.submit_background(payload.function, sign(payload, self.cfg.farm.secrets), unique=payload.unique)

    def _payload(self, jid: str, attempt: int) -> Payload | None:
        p = self.plan
        target, step = jid[len(p.run_id) + 1:].split(":", 1)
        if step == "build":
            return p.build_payload(target, attempt)
        build = next((r for r in self.db.jobs(p.run_id) if r.job_id == job_id(p.run_id, target, "build")), None)
        if build is None or not build.artifact_key or not build.artifact_sha256:
            return None
        kind, _, name = step.partition("-")
        return Payload(kind=kind, run_id=p.run_id, rev=p.rev, target=target, name=name,  # type: ignore[arg-type]
                       artifact_key=build.artifact_key, artifact_sha256=build.artifact_sha256, seed=p.seed,
                       attempt=attempt, submitted_at=time.time())


def wait(cfg: Config, db: ResultsDB, store: ArtifactStore, client: Client, p: Plan,
         progress: Progress | None = None, poll: float = 1.0) -> list[ResultRecord]:
    """Block until every expected job is terminal; returns the run's records."""
    run = db.get_run(p.run_id)
    start = run.created_at if run else time.time()
    deadline = start + cfg.farm.run_deadline
    no_worker_since: dict[str, float] = {}
    last_reconcile = time.monotonic()
    watchdog = Watchdog(cfg, db, store, client, p)
    while True:
        states = {r.job_id: r.status for r in db.jobs(p.run_id)}
        pending = [j for j in p.expected if states.get(j) not in TERMINAL]
        try:
            table = preflight(cfg)
        except RunError as e:
            log.warning("%s", e)
            table = {}
        if progress:
            progress(states, table)
        if not pending:
            break
        now = time.time()
        if now > deadline:
            reconcile(db, store, p.run_id)
            _expire(db, p, pending, "infra", f"not finished by the run deadline ({cfg.farm.run_deadline:.0f}s)")
            continue
        if time.monotonic() - last_reconcile > 30:
            # The collector may be down; S3 holds every result the workers reported.
            reconcile(db, store, p.run_id)
            last_reconcile = time.monotonic()
        for jid in pending:
            target, step = jid[len(p.run_id) + 1:].split(":", 1)
            fn = _function_of(step, target)
            st = table.get(fn)
            if table and (st is None or st.workers == 0):
                since = no_worker_since.setdefault(fn, now)
                if now - since >= cfg.farm.no_worker_wait and _ready(jid, p, states):
                    _expire(db, p, [jid], "no_worker",
                            f"no worker registered for {fn} within {cfg.farm.no_worker_wait:.0f}s")
            else:
                no_worker_since.pop(fn, None)
        if table:
            watchdog.check(pending, states, now)
        time.sleep(poll)
    reconcile(db, store, p.run_id)
    return db.jobs(p.run_id)


def _ready(jid: str, p: Plan, states: dict[str, str]) -> bool:
    """A test or perf job exists only after its build passed; before that it waits on the
    build, not on a worker."""
    target, step = jid[len(p.run_id) + 1:].split(":", 1)
    return step == "build" or states.get(job_id(p.run_id, target, "build")) == "passed"


def _expire(db: ResultsDB, p: Plan, jids: list[str], status: str, message: str) -> None:
    now = time.time()
    for jid in jids:
        target, step = jid[len(p.run_id) + 1:].split(":", 1)
        kind, _, name = step.partition("-")
        rec = ResultRecord(job_id=jid, run_id=p.run_id, target=target, kind=kind, step=step,  # type: ignore[arg-type]
                           name=name or None, rev=p.rev, status=status, worker="nightly",  # type: ignore[arg-type]
                           started_at=now, finished_at=now, message=message)
        db.upsert(rec)
        if step == "build":
            for s in p.steps(target)[1:]:
                dep = job_id(p.run_id, target, s)
                k, _, n = s.partition("-")
                db.upsert(rec.model_copy(update={"job_id": dep, "step": s, "kind": k, "name": n,
                                                 "status": "skipped",
                                                 "message": f"skipped: the build was recorded as {status}"}))

