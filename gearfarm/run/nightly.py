"""Submitting a run and seeing it to its end: plan the expected jobs from the catalog, submit
one background build job per target (or, for a re-run, the test jobs themselves), submit each
target's test and perf jobs once the ledger has applied its passed build (with the artifact's
sha256 from that signed record), then watch until every job is terminal — resubmitting jobs that
lost their lease, recording "no worker" and deadline expiries through the ledger instead of
hanging — and close the run. Every payload is signed with the nightly's own key as it is
sent (gearfarm.run.outbox, which also keeps what no gearmand took for the next poll): no
worker host holds it, so no worker host can make a job.

This is the one wait loop: gearfarm.run.execution runs every plan (the nightly's, the re-run's,
a bisection probe's) through it."""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from gearfarm.config import Config, ProjectConfig
from gearfarm.db.results import NOT_RUN, ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import Catalog
from gearfarm.formats.job import (
    COLLECT_FUNCTION,
    Artifact,
    JobId,
    Payload,
    SignedBuild,
    Source,
    make_payload,
    step_name,
)
from gearfarm.formats.lease import beat_seconds
from gearfarm.formats.marker import Marker, sealed
from gearfarm.formats.result import ResultRecord
from gearfarm.gearman import Client, GearmanError, JobStatus, StatusUnknown, admin
from gearfarm.hosts.connection import ssl_context
from gearfarm.run import snapshot
from gearfarm.run.ledger import Ledger, farm_record
from gearfarm.run.outbox import Outbox
from gearfarm.run.queuelimit import QueueLimits
from gearfarm.run.states import Pending, RunStates
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore, StoreError

log = logging.getLogger(__name__)
# How long the nightly keeps waiting for an unreachable results database past the deadline.
DB_OUTAGE_LIMIT = 600.0
# What the watchdog asks gearmand about (Watchdog._asked), one round trip a job: every poll,
# a job gearmand said runs (its lease to judge), did not know (a loss to confirm) or whose
# holder's beats stopped; a job whose holder beats, never (its beats say it runs); a queued job
# at most once every SWEEP_SECONDS, and at most STATUS_SWEEP of them a poll, the longest unasked
# first. Asking about every pending job every poll made a night's cost grow with the square of
# its jobs, and asking about every running and every queued one 5 times a second was most of
# the nightly's CPU and of gearmand's at 1 host as at 64 (docs/speed.md). A queued job that
# gearmand lost is found at its next look, and resubmitted a lost grace after.
STATUS_SWEEP = 32
SWEEP_SECONDS = 5.0
# How often the nightly looks in S3 for records the collector never got, while the collector
# keeps up (every 30 s while it does not).
RECONCILE_CALM = 300.0
# How often the nightly looks for a person's cancel requests: a running job learns one at its
# next signed beat (10 s) anyway, and a look at every 0.2 s poll was a fifth of the nightly's CPU.
CANCEL_LOOK = 1.0


class RunError(RuntimeError):
    """The farm itself cannot run (exit status 2)."""


class ProjectError(RunError):
    """One project cannot run tonight: its revision cannot be fetched, its catalog does not
    parse or validate, its source snapshot cannot be made or stored. That project's night fails
    with this message (its run recorded and closed as failed: record_not_run); every other
    project's night goes on. ``farm``: the farm's own part failed (S3), not the project's."""

    def __init__(self, project: str, rev: str, message: str, farm: bool = False) -> None:
        super().__init__(message)
        self.project, self.rev, self.farm = project, rev, farm


@dataclass
class Plan:
    run_id: str
    # The project's tree and catalog this run builds (sha256s in every payload).
    source: Source
    targets: list[str]
    suites: dict[str, list[str]]
    benchmarks: dict[str, list[str]]
    seed: int = 1
    # Epoch seconds by which the run ends; fixed when the run is first recorded.
    deadline: float = 0.0
    # target -> the baseline build (last good), for paired perf runs.
    baselines: dict[str, Artifact] = field(default_factory=dict)
    # target -> the pinned reference build, the perf jobs' third side (ResultsDB.reference_build).
    references: dict[str, Artifact] = field(default_factory=dict)
    # A re-run has no build step: target -> the build its test jobs run on.
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    # A child run is linked to its parent (a nightly for a re-run, ``bisect-<id>`` for a
    # bisection's probe), which keeps it out of nightly history, series and last good builds.
    parent: str | None = None
    # False for a re-run: its test jobs run on the builds in ``artifacts``.
    build: bool = True
    # Run only these cases of the suites (a bisection's probe); empty: the whole suites.
    cases: list[str] = field(default_factory=list)
    # The catalog's text, recorded with the run (history and reports read it, not a repository).
    catalog_text: str = ""
    # Bytes of source and catalog this nightly uploaded for the run (0: already in S3).
    source_bytes: int = 0

    @property
    def rev(self) -> str:
        return self.source.rev

    @property
    def project(self) -> str:
        return self.source.project

    @property
    def rerun(self) -> bool:
        return not self.build

    def steps(self, target: str) -> list[str]:
        return (([] if self.rerun else [step_name("build")]) + [step_name("test", s) for s in self.suites[target]]
                + [step_name("perf", b) for b in self.benchmarks[target]])

    @property
    def expected(self) -> list[JobId]:
        return [JobId(self.run_id, t, s) for t in self.targets for s in self.steps(t)]

    def first_jobs(self, expected: list[JobId] | None = None) -> list[JobId]:
        """What is submitted at once; the rest waits for its target's build (Watchdog.release).
        ``expected``: the plan's jobs, when the caller made them already."""
        return [j for j in (self.expected if expected is None else expected) if self.rerun or j.kind == "build"]

    def ready(self, jid: JobId, states: dict[str, str]) -> bool:
        """A test or perf job exists only after its build passed; before that it waits on the
        build, not on a worker."""
        return self.rerun or jid.kind == "build" or states.get(f"{self.run_id}:{jid.target}:build") == "passed"

    def payload(self, jid: JobId, attempt: int = 1, artifact: Artifact | None = None,
                signed_builds: list[SignedBuild] | None = None) -> Payload:
        t = jid.target
        if jid.kind == "build":
            return make_payload(jid, source=self.source, deadline=self.deadline, attempt=attempt, seed=self.seed,
                                suites=self.suites[t], benchmarks=self.benchmarks[t], baseline=self.baselines.get(t),
                                reference=self.references.get(t), cases=self.cases, signed_builds=signed_builds or [])
        return make_payload(jid, source=self.source, deadline=self.deadline, attempt=attempt, seed=self.seed,
                            artifact=artifact or self.artifacts.get(t), baseline=self.baselines.get(t),
                            reference=self.references.get(t), cases=self.cases)


@dataclass(frozen=True)
class Loaded:
    """A project resolved for tonight: its repository, the commit, and the validated catalog."""

    name: str
    repo: Path
    rev: str
    catalog: Catalog
    catalog_text: str
    # The project's [[projects]] targets, each defined by the catalog; None: all of them.
    targets: list[str] | None = None
    # Where its submodules' mirrors are kept (snapshot.module_mirrors); None: fetched afresh.
    mirrors: Path | None = None


def load_project(cfg: Config, project: ProjectConfig, rev: str | None = None) -> Loaded:
    """Fetch the project, resolve ``rev`` (default: its configured branch) and validate its
    catalog (its timeouts within `[farm] max_timeout`). ProjectError saying what to fix."""
    try:
        repo = snapshot.repository(cfg, project)
        full = snapshot.resolve(repo, rev or project.branch)
    except snapshot.SourceError as e:
        raise ProjectError(project.name, rev or project.branch, _named(project.name, e)) from e
    try:
        text, origin = snapshot.catalog_text(cfg, project, repo, full)
        cat = catalog_mod.parse(text, origin, cfg.farm.max_timeout)
        catalog_mod.check_limits(cat, origin, cfg.farm.job_limits_max())
    except catalog_mod.CatalogError as e:
        raise ProjectError(project.name, full, _named(project.name, e)) from e
    for t in project.targets or []:
        try:
            cat.target(t)
        except catalog_mod.CatalogError as e:
            # The farm's config and the project's catalog disagree: the operator's to look at
            # too (exit status 2), whichever side changed.
            raise ProjectError(project.name, full, f"project {project.name}: [[projects]] targets: {e}",
                               farm=True) from e
    return Loaded(project.name, repo, full, cat, text, project.targets, snapshot.module_mirrors(cfg, project))


def _named(project: str, e: Exception) -> str:
    """``e``'s message, starting with the project's name (once)."""
    text = str(e)
    return text if text.startswith(f"project {project}: ") else f"project {project}: {text}"


def prepare(store: ArtifactStore, loaded: Loaded) -> tuple[Source, int]:
    """Upload the revision's snapshot and the catalog, each once, content-addressed; returns
    the run's source and the bytes this call uploaded (0 when both were there)."""
    try:
        snap = snapshot.publish_source(store, loaded.repo, loaded.rev, loaded.mirrors)
        sha, cat_bytes = snapshot.publish_catalog(store, loaded.catalog_text)
        snapshot.publish_latest(store, loaded.name, loaded.rev, sha)
    except snapshot.SourceError as e:  # the project's side: a submodule, git archive
        raise ProjectError(loaded.name, loaded.rev, f"project {loaded.name}: cannot make the source snapshot of "
                           f"{loaded.rev[:12]}: {e}") from e
    except StoreError as e:
        raise ProjectError(loaded.name, loaded.rev, f"project {loaded.name}: cannot store the source of "
                           f"{loaded.rev[:12]} in S3: {e}", farm=True) from e
    return Source(loaded.name, loaded.rev, snap.sha256, sha), snap.uploaded_bytes + cat_bytes


def record_not_run(db: ResultsDB, run_id: str, project: str, rev: str, error: str, seed: int) -> bool:
    """Record the run of a project that cannot run tonight (ProjectError), closed at once as
    failed with its error: the report, the mail and the dashboard show it beside the others.
    False when a run of that id exists already: it is left as it was."""
    if not db.create_run(run_id, rev[:40], [], [], notes={"seed": seed, "error": error}, deadline=time.time(),
                         project=project):
        return False
    db.finish_run(run_id, NOT_RUN)
    return True


@dataclass(frozen=True)
class Selection:
    """What a run of one project covers: its targets and, per target, suites and benchmarks."""

    targets: list[str]
    suites: dict[str, list[str]]
    benchmarks: dict[str, list[str]]


def select(cat: Catalog, targets: list[str] | None, suites: list[str] | None,
           benchmarks: list[str] | None) -> Selection:
    """Raise CatalogError naming the known entries for anything unknown."""
    names = targets if targets else sorted(cat.targets)
    for t in names:
        cat.target(t)
    benches = sorted(cat.benchmarks) if benchmarks is None else benchmarks
    for b in benches:
        cat.benchmark(b)
    return Selection(names, {t: cat.suites_for(t, suites) for t in names},
                     {t: list(benches) if cat.target(t).perf else [] for t in names})


def plan(run_id: str, source: Source, sel: Selection, seed: int = 1, catalog_text: str = "",
         source_bytes: int = 0) -> Plan:
    return Plan(run_id=run_id, source=source, targets=sel.targets, suites=sel.suites, benchmarks=sel.benchmarks,
                seed=seed, catalog_text=catalog_text, source_bytes=source_bytes)


class Board:
    """gearmand's function table as the nightly's poll reads it, five times a second: on one
    admin connection a server, kept open (a connection each time was a connect, and behind TLS
    a handshake, at every poll). A failed one is opened again at the next read."""

    def __init__(self, cfg: Config) -> None:
        self.sessions = [admin.Session(host, port, ssl_context(cfg), 5.0, cfg.gearman.tls_server_name)
                         for host, port in cfg.gearman.addresses()]

    def table(self) -> dict[str, admin.FunctionStatus]:
        """The table from the first server that answers; RunError naming every address tried
        when none does."""
        errors = []
        for session in self.sessions:
            # A connection the server closed since the last poll (a restart) is made again at
            # once: one try more, only then.
            for last in (not session.connected, True):
                try:
                    return session.status()
                except (OSError, GearmanError) as e:
                    if last:
                        errors.append(f"{session.address} ({e})")
                        break
        raise RunError(f"gearmand is unreachable: tried {', '.join(errors)}; start it or fix [gearman] servers")

    def close(self) -> None:
        for session in self.sessions:
            session.close()


def preflight(cfg: Config) -> dict[str, admin.FunctionStatus]:
    """gearmand's function table once (Board.table)."""
    board = Board(cfg)
    try:
        return board.table()
    finally:
        board.close()


def submit(cfg: Config, db: ResultsDB, outbox: Outbox, p: Plan) -> bool:
    """Record the run and submit its first jobs (those no gearmand takes now go with the
    outbox's next flush). False when the run existed already: a resubmission then only
    re-sends jobs that are not terminal (gearmand dedupes queued ones by unique id), under the
    deadline the run was first given."""
    if not p.rerun:
        # A baseline set by the caller stays (a bisection's probe measures against its known-good build).
        for t in p.targets:
            if p.benchmarks[t] and t not in p.baselines:
                base = db.last_good_build(p.project, t, p.rev)
                if base is not None and base.artifact_key and base.artifact_sha256:
                    p.baselines[t] = Artifact(base.artifact_key, base.artifact_sha256, base.rev)
                    ref = db.reference_build(p.project, t, cfg.farm.reference_nights)
                    if ref is not None:
                        p.references[t] = ref
                    elif cfg.farm.reference_nights:
                        p.references[t] = p.baselines[t]  # (re-)pinned tonight: the last good build
    created = db.create_run(p.run_id, p.rev, p.targets, [str(j) for j in p.expected],
                            notes={"suites": p.suites, "benchmarks": p.benchmarks, "seed": p.seed,
                                   "source_sha256": p.source.sha256, "source_uploaded_bytes": p.source_bytes},
                            parent_run_id=p.parent, deadline=p.deadline or time.time() + cfg.farm.run_deadline,
                            project=p.project,
                            catalog=(p.source.catalog_sha256, p.catalog_text) if p.catalog_text else None)
    run = db.get_run(p.run_id)
    assert run is not None
    p.deadline = run.deadline or run.created_at + cfg.farm.run_deadline
    done = db.terminal_ids(p.run_id)
    outbox.send([build_payload(db, p, jid) if jid.kind == "build" else p.payload(jid)
                 for jid in p.first_jobs() if str(jid) not in done])
    return created


def build_payload(db: ResultsDB, p: Plan, jid: JobId, attempt: int = 1) -> Payload:
    """A build's payload, naming the builds of its revision the farm signed before (the only
    stored artifacts it may reuse)."""
    signed = [SignedBuild(artifact_key=r.artifact_key, artifact_sha256=r.artifact_sha256,  # type: ignore[arg-type]
                          manifest_sha256=r.manifest_sha256)
              for r in db.signed_builds(p.project, p.rev, jid.target)]
    return p.payload(jid, attempt, signed_builds=signed)


def reconcile(ledger: Ledger, store: ArtifactStore, run_id: str, seen: set[str], prefix: str | None = None) -> int:
    """Offer the ledger every sealed record in S3 it has not been offered by this loop (a
    collector outage loses nothing). Each key holds one immutable record, so ``seen`` keys are
    skipped, and so are the records the ledger ranked already (the collector delivered them):
    reading every record of the night again, as this did, cost a GET and a signature check per
    job at the end of every night. The ledger's rules make the order irrelevant. With
    ``prefix``, only the records under it (one job's)."""
    try:
        found = [k for k in store.list(prefix or keys.run_prefix(run_id)) if keys.is_result(k) and k not in seen]
    except StoreError as e:
        log.warning("cannot reconcile from S3 now: %s", e)
        return 0
    if found:
        for job_id, attempt, digest in ledger.db.ranked(run_id):
            jid = JobId.parse(job_id)
            seen.add(keys.result(run_id, jid.target, jid.step, attempt, digest))
        found = [k for k in found if k not in seen]
    applied = 0
    for key in found:
        try:
            data = store.get_bytes(key)
        except StoreError as e:
            log.warning("cannot read %s: %s", key, e)
            continue
        try:
            outcome, _ = ledger.accept(data, "reconcile", store)
        except StoreError as e:
            log.warning("cannot read the cases of %s: %s", key, e)  # not seen: offered again next time
            continue
        seen.add(key)
        applied += outcome == "applied"
    return applied


Progress = Callable[[dict[str, str], dict[str, admin.FunctionStatus]], None]


class Watchdog:
    """Submits each target's test and perf jobs once its build passed; finds jobs that lost their
    lease (heartbeat stalled: worker dead or cut off) or that gearmand dropped (--job-retries
    exhausted, which it does silently for background jobs), and submits them again under the
    next attempt's unique id, within the run's budget."""

    def __init__(self, cfg: Config, db: ResultsDB, ledger: Ledger, store: ArtifactStore, client: Client, p: Plan,
                 seen: set[str], outbox: Outbox | None = None) -> None:
        self.cfg, self.db, self.ledger, self.store, self.client, self.plan = cfg, db, ledger, store, client, p
        self.seen = seen
        self.attempts: dict[JobId, int] = {}
        self.beats: dict[JobId, tuple[int, float]] = {}
        self.unknown_since: dict[JobId, float] = {}
        self.spent = 0
        # What the live page was last told of each unfinished job: (state, attempt).
        self.live: dict[str, tuple[str, int]] = {}
        # Cancel requests whose S3 marker is written.
        self.marked: set[int] = set()
        self.signer = cfg.nightly_signer()
        self.outbox = outbox if outbox is not None else Outbox(db, client, self.signer, QueueLimits(cfg))
        self._lease_view: tuple[float, dict[tuple[str, int], tuple[str, int]]] | None = None
        run = db.get_run(p.run_id)
        self.created_at = run.created_at if run is not None else time.time()
        # Jobs of this plan submitted by this process (builds and a re-run's jobs by submit()).
        expected = p.expected
        self.released: set[JobId] = set(p.first_jobs(expected))
        # Jobs gearmand said were running at their last look.
        self.running: set[JobId] = set()
        # When each queued job was last asked about; the lease's beats when gearmand said a held
        # job was queued again.
        self.asked_at: dict[JobId, float] = {}
        self.requeued: dict[JobId, int] = {}
        # A holder silent this long (two beats; half the lease time if that is less) is asked
        # about at every poll until gearmand or its beats say more.
        self.stale = min(2 * beat_seconds(cfg.farm.lease_timeout) + 1.0, cfg.farm.lease_timeout / 2)
        # The released jobs in the order the sweep looks at them between whole passes (see _focus).
        self.sweep: deque[JobId] = deque()
        # The plan's jobs not ended yet, as the wait loop keeps them (and its maps of the jobs).
        self.pending = Pending(expected)

    def attempt(self, jid: JobId) -> int:
        return self.attempts.get(jid, 1)

    def check(self, pending: Collection[JobId], states: dict[str, str], now: float,
              table: dict[str, admin.FunctionStatus], changed: dict[str, str] | None = None) -> None:
        """One poll's look at the pending jobs: every one (``changed`` None: after a whole read),
        or those _focus picks from what ``changed`` since the last poll. Called when gearmand
        answered the poll: what no server took before is sent first."""
        self.outbox.flush()
        seen: dict[str, tuple[str, int]] = {}
        try:
            if changed is None:
                jobs = list(pending)
                self.sweep = deque(sorted((j for j in jobs if j in self.released),
                                          key=lambda j: self.asked_at.get(j, 0.0)))
            else:
                jobs = self._focus(pending, changed, now)
            self._check(jobs, states, now, seen, _collector_keeps_up(table))
        finally:
            changed_live = {jid: s for jid, s in seen.items() if self.live.get(jid) != s}
            if changed_live:
                self.db.set_live(self.plan.run_id, changed_live)
                self.live.update(changed_live)

    def _focus(self, pending: Collection[JobId], changed: dict[str, str], now: float) -> list[JobId]:
        """The pending jobs a poll between whole passes looks at: those whose state changed (and
        when a build's did, every job not released yet), those a lease is held for or gearmand
        was last asked about as running, lost or queued again, and the next STATUS_SWEEP of the
        sweep. The rest cannot need a look: a job's verdict changes with its state, its lease or
        its asking, and each of those puts it here. Looking at every pending job each poll was 7
        ms a poll at 2,500 (docs/speed.md)."""
        focus: set[JobId] = set()
        builds = False
        ids = self.pending.ids
        for k in changed:
            jid = ids.get(k)
            if jid is not None:
                builds = builds or jid.kind == "build"
                focus.add(jid)
        if builds:
            focus.update(j for j in pending if j not in self.released)
        focus.update(ids[j] for j, _ in self._leases(now) if j in ids)
        focus.update(self.running, self.unknown_since, self.requeued)
        for _ in range(min(STATUS_SWEEP, len(self.sweep))):
            jid = self.sweep.popleft()
            if jid in pending:
                self.sweep.append(jid)
                focus.add(jid)
        return self.pending.ordered(j for j in focus if j in pending)

    def _check(self, pending: list[JobId], states: dict[str, str], now: float,
               seen: dict[str, tuple[str, int]], judge: bool) -> None:
        self.release([j for j in pending if j not in self.released and self.plan.ready(j, states)])
        # While the collector keeps up, the leases say which jobs run (their holders' beats); when
        # it is behind, the beats may be waiting in its queue, and gearmand is asked instead.
        leases = self._leases(now) if judge else {}
        ready, stalled = [], []
        for jid in pending:
            if not self.plan.ready(jid, states):
                seen[str(jid)] = ("waiting", self.attempt(jid))
                continue
            beating = self._beating(jid, leases, now)
            if beating:
                seen[str(jid)] = ("running", self.attempt(jid))
                self.unknown_since.pop(jid, None)
                continue
            ready.append(jid)
            if beating is False:
                stalled.append(jid)
        for jid in self._asked(ready, stalled, now):
            away = ""
            try:
                st = self.client.get_status_unique(jid.unique(self.attempt(jid)))
            except StatusUnknown as e:
                # Unknown to every server that answered; it may be on one that did not. A
                # server away for the lost grace is taken as lost with its queue (a lab's second
                # gearmand goes on): the job is submitted again to those that answer, and if the
                # server comes back and replays it, the ledger keeps one result (rule 3).
                st, away = JobStatus(e.key, False, False, 0, 0), ", ".join(e.addresses)
            except GearmanError as e:
                # No server answered: no verdict on any job now.
                log.warning("cannot ask gearmand about %s: %s", jid, e)
                return
            if st.known:
                seen[str(jid)] = ("running" if st.running else "queued", self.attempt(jid))
                self.unknown_since.pop(jid, None)
                if not st.running:
                    self.running.discard(jid)
                    self.beats.pop(jid, None)
                    held = leases.get((str(jid), self.attempt(jid)))
                    if held is not None:
                        # Back in the queue, its holder gone: it runs again once another holder beats.
                        self.requeued[jid] = held[1]
                    continue
                self.running.add(jid)
                if not judge:
                    # The collector is behind or away: the beats may be waiting in its queue, and
                    # are counted once it has taken them.
                    continue
                host, count = leases.get((str(jid), self.attempt(jid)), ("", -1))
                silent = self._silent_for(jid, count, now)
                if silent > self.cfg.farm.lease_timeout:
                    # Liveness is the holder's signed beats, not WORK_STATUS: anything holding the
                    # Gearman job can send that, and a worker that is not a registered host's
                    # never gets a lease at all.
                    self.resubmit(jid, f"lease lost: no signed heartbeat from {host} for {silent:.0f}s"
                                  if host else f"held for {silent:.0f}s by a worker that never claimed it "
                                  "(no registered host holds its lease)")
                continue
            self.running.discard(jid)
            since = self.unknown_since.setdefault(jid, now)
            if now - since > self.cfg.farm.lost_grace:
                # Its result may be on the way: S3 has it if the worker reported at all. Its own
                # records only: a look at the whole run listed 15,000 objects of a 5,000-job night
                # for each job thought lost.
                reconcile(self.ledger, self.store, self.plan.run_id, self.seen,
                          keys.job_results(jid.run_id, jid.target, jid.step))
                if str(jid) in self.db.terminal_ids(self.plan.run_id):
                    continue
                self.resubmit(jid, f"gearmand at {away} has not answered for {now - since:.0f}s, no other server "
                                   "holds the job and no result arrived" if away else
                                   "gearmand no longer holds the job and no result arrived")

    def _beating(self, jid: JobId, leases: dict[tuple[str, int], tuple[str, int]], now: float) -> bool | None:
        """Whether the holder of the job's attempt beats (True: it runs, nothing to ask gearmand),
        stopped beating (False: ask every poll, its lease is judged) or there is no holder (None:
        none claimed it, or gearmand queued it again since its holder's last beat).
        A beat is seen as the lease's count changing, by this process's clock (not the
        collector's: another host's)."""
        held = leases.get((str(jid), self.attempt(jid)))
        if held is None or self.requeued.get(jid) == held[1]:
            return None
        self.requeued.pop(jid, None)
        return self._silent_for(jid, held[1], now) <= self.stale

    def _silent_for(self, jid: JobId, count: int, now: float) -> float:
        """Seconds since the job's lease was last seen with a new beat count (``count`` now)."""
        last = self.beats.get(jid)
        if last is None or last[0] != count:
            self.beats[jid] = last = (count, now)
        return now - last[1]

    def _asked(self, ready: list[JobId], stalled: list[JobId], now: float) -> list[JobId]:
        """The ready jobs to ask gearmand about now (see STATUS_SWEEP): the urgent ones, and the
        queued ones due, the longest unasked first."""
        urgent = set(stalled) | {j for j in ready if j in self.running or j in self.unknown_since}
        due = [j for j in ready if j not in urgent and now - self.asked_at.get(j, 0.0) >= SWEEP_SECONDS]
        if len(due) > STATUS_SWEEP:
            due = heapq.nsmallest(STATUS_SWEEP, due, key=lambda j: self.asked_at.get(j, 0.0))
        for j in due:
            self.asked_at[j] = now
        return [j for j in ready if j in urgent] + due

    def _leases(self, now: float) -> dict[tuple[str, int], tuple[str, int]]:
        """The run's leases, read at most once a second: beats come every few seconds and a lease
        is judged over a minute, and on the embedded farm a perf job measures on this host."""
        if self._lease_view is None or now - self._lease_view[0] >= 1.0:
            self._lease_view = (now, self.db.leases(self.plan.run_id))
        return self._lease_view[1]

    def release(self, jids: list[JobId]) -> None:
        """Submit test and perf jobs whose build passed, a target's suites measured longest last
        time first (gearmand hands out one function's jobs in the order they came)."""
        if not jids:
            return
        by_target: dict[str, list[JobId]] = {}
        for j in jids:
            by_target.setdefault(j.target, []).append(j)
        for target, mine in sorted(by_target.items()):
            seconds = self.db.step_seconds(self.plan.project, target, self.created_at)
            order = {s: i for i, s in enumerate(self.plan.steps(target))}
            mine.sort(key=lambda j: (-seconds.get(j.step, 0.0), order[j.step]))
            # Every job of a target runs on its one build: its record is read once, not per job.
            artifact = self._artifact(mine[0])
            if artifact is None:
                for jid in mine:
                    expire(self.ledger, self.plan, [jid], "infra", "its build passed but left no artifact on record")
            else:
                self.outbox.send([self.plan.payload(jid, self.attempt(jid), artifact) for jid in mine])
            self.released.update(mine)
            self.sweep.extendleft(mine)  # never asked about: first

    def _artifact(self, jid: JobId) -> Artifact | None:
        """What a test or perf job runs on (the same for every job of its target): a re-run's
        given build, else the artifact its target's build record (signed by the host that built
        it) names."""
        if self.plan.rerun:
            return self.plan.artifacts.get(jid.target)
        build = self.db.job(str(JobId(self.plan.run_id, jid.target, "build")))
        if build is None or not build.artifact_key or not build.artifact_sha256:
            return None
        return Artifact(build.artifact_key, build.artifact_sha256)

    def resubmit(self, jid: JobId, why: str) -> None:
        self.beats.pop(jid, None)
        self.requeued.pop(jid, None)
        self.unknown_since.pop(jid, None)
        attempt = self.attempt(jid)
        if self.spent >= self.cfg.farm.resubmit_budget:
            expire(self.ledger, self.plan, [jid], "infra",
                   f"{why}; the run's resubmission budget ({self.cfg.farm.resubmit_budget}) is spent", attempt)
            return
        artifact = None
        if jid.kind != "build":
            artifact = self._artifact(jid)
            if artifact is None:
                expire(self.ledger, self.plan, [jid], "infra", f"{why}; cannot resubmit: its build left no artifact",
                       attempt)
                return
        self.spent += 1
        self.attempts[jid] = attempt + 1
        payload = (build_payload(self.db, self.plan, jid, attempt + 1) if jid.kind == "build"
                   else self.plan.payload(jid, attempt + 1, artifact))
        log.warning("%s: %s; submitting attempt %d", jid, why, attempt + 1)
        self.outbox.send([payload])


def _collector_keeps_up(table: dict[str, admin.FunctionStatus]) -> bool:
    """Whether the collector takes what is sent to it now (a worker registered, nothing waiting):
    only then does a lease whose beats stopped mean its worker stopped."""
    st = table.get(COLLECT_FUNCTION)
    return st is not None and st.workers > 0 and st.queued <= st.running


def wait(cfg: Config, db: ResultsDB, ledger: Ledger, store: ArtifactStore, client: Client, p: Plan,
         progress: Progress | None = None, poll: float = 0.2, outbox: Outbox | None = None) -> list[ResultRecord]:
    """Block until every expected job is terminal; returns the run's records. The results
    database may be away for a while (a restart): the loop waits for it rather than fail."""
    no_worker_since: dict[str, float] = {}
    seen: set[str] = set()
    last_reconcile = time.monotonic()
    watchdog = Watchdog(cfg, db, ledger, store, client, p, seen, outbox)
    db_down_since: float | None = None
    pending = watchdog.pending  # made once, then kept from the changes (not at every poll: jobs × polls)
    run_states = RunStates(db, p.run_id)
    cancel_due = 0.0  # time.monotonic() of the next look for cancel requests
    board = Board(cfg)
    try:
        while True:
            try:
                # Polled every `poll` seconds: the end of a run is noticed within it (it was 1 s, the
                # average 0.5 s of every nightly's tail), and reading statuses only keeps it cheap.
                states = run_states.read()
                pending.update(states, run_states.changed)
                try:
                    table = board.table()
                except RunError as e:
                    log.warning("%s", e)
                    table = {}
                if progress:
                    progress(states, table)
                if not pending:
                    break
                if time.monotonic() >= cancel_due:
                    if _cancel(db, ledger, store, p, pending, watchdog):
                        continue  # and look again at the next poll
                    cancel_due = time.monotonic() + CANCEL_LOOK
                now = time.time()
                if now > p.deadline:
                    if time.monotonic() - last_reconcile > 2.0:  # the records of jobs stopped at it
                        reconcile(ledger, store, p.run_id, seen)
                        last_reconcile = time.monotonic()
                    _past_deadline(cfg, db, ledger, p, pending, watchdog, now)
                    continue
                if time.monotonic() - last_reconcile > (RECONCILE_CALM if _collector_keeps_up(table) else 30):
                    # The collector may be down; S3 holds every result the workers reported. While it
                    # takes what is sent to it, every record reaches it through Gearman (a worker
                    # keeps a record it could not submit and submits it again), and a look at the
                    # whole run in S3, O(jobs), is only a net.
                    reconcile(ledger, store, p.run_id, seen)
                    last_reconcile = time.monotonic()
                for fn, count in pending.functions.items():
                    st = table.get(fn)
                    if count and table and (st is None or st.workers == 0):
                        since = no_worker_since.setdefault(fn, now)
                        # A function's jobs are one target's of one kind: all ready, or none.
                        if now - since >= cfg.farm.no_worker_wait and p.ready(pending.sample[fn], states):
                            for jid in pending.of(fn):
                                expire(ledger, p, [jid], "no_worker", f"no worker registered for {fn} within "
                                       f"{cfg.farm.no_worker_wait:.0f}s", watchdog.attempt(jid))
                    else:
                        no_worker_since.pop(fn, None)
                if table:
                    watchdog.check(pending, states, now, table, run_states.changed)
                db_down_since = None
            except SQLAlchemyError as e:
                db_down_since = db_down_since or time.time()
                log.warning("results database unavailable (%s); waiting for it", str(e).splitlines()[0])
                if time.time() > max(p.deadline, db_down_since) + DB_OUTAGE_LIMIT:
                    raise RunError(f"the results database has been unreachable since "
                                   f"{time.strftime('%H:%M:%S', time.localtime(db_down_since))}: {e}") from e
            time.sleep(poll)
    finally:
        board.close()
    reconcile(ledger, store, p.run_id, seen)
    return db.jobs(p.run_id)


def deadline_grace(cfg: Config) -> float:
    """Seconds past the run's deadline the nightly waits for the jobs still running then to
    report themselves stopped: each worker kills its job's tree at the deadline by its own clock
    (workers/base.py Heartbeat) and records it `timed_out` with its log; two signed beats more
    cover a worker whose clock is behind, which the ledger then refuses once the run closes."""
    return 2 * beat_seconds(cfg.farm.lease_timeout) + 5.0


def _past_deadline(cfg: Config, db: ResultsDB, ledger: Ledger, p: Plan, pending: Iterable[JobId],
                   watchdog: Watchdog, now: float) -> None:
    """End what is left of a run past its deadline. A job whose holder still beats is the
    project's: it held its slot past the end of the night. Its worker stops it with everything it
    started and records it `timed_out` with its log; only if no record came within
    deadline_grace does the nightly record that itself. A job that never started is `infra`,
    saying which jobs held the slots it waited for (of any run), so the report names them and
    not "the farm"."""
    at = time.strftime('%H:%M:%S', time.localtime(p.deadline))
    done = db.terminal_ids(p.run_id)
    leases = watchdog._leases(now)
    holders: list[tuple[str, str, float]] | None = None
    grace = deadline_grace(cfg)
    # Builds first: ending a build ends its dependents (skipped, with the reason).
    for jid in sorted(pending, key=lambda j: j.kind != "build"):
        if str(jid) in done:
            continue
        held = leases.get((str(jid), watchdog.attempt(jid)))
        if held is not None and watchdog._silent_for(jid, held[1], now) <= watchdog.stale:
            if now < p.deadline + grace:
                continue  # its worker is stopping it, and reports it with its log
            status, why = "timed_out", (f"still running on {held[0]} at the run deadline ({at}): it held its slot "
                                        f"past the end of the night, and its worker did not report it stopped within "
                                        f"{grace:.0f}s")
        elif held is not None:
            status, why = "infra", (f"not finished by the run deadline ({at}): its worker on {held[0]} stopped "
                                    "beating before it")
        else:
            if holders is None:
                holders = db.holders(p.deadline, p.deadline - watchdog.stale)
            busy = sorted((c, j, h) for j, h, c in holders if j != str(jid) and JobId.parse(j).function == jid.function)
            status, why = "infra", (f"not started by the run deadline ({at}): the slots serving {jid.function} were "
                                    "held by " + ", ".join(f"{j} (on {h} since "
                                                           f"{time.strftime('%H:%M:%S', time.localtime(c))})"
                                                           for c, j, h in busy[:5])
                                    + (f" and {len(busy) - 5} more" if len(busy) > 5 else "")
                                    if busy else f"not started by the run deadline ({at}): no worker serving "
                                    f"{jid.function} took it")
        expire(ledger, p, [jid], status, why, watchdog.attempt(jid))
        if jid.kind == "build":
            done = db.terminal_ids(p.run_id)  # its dependents ended with it


def _cancel(db: ResultsDB, ledger: Ledger, store: ArtifactStore, p: Plan, pending: Iterable[JobId],
            watchdog: Watchdog) -> bool:
    """Record as cancelled the pending jobs a person cancelled (the whole run, or some jobs),
    and write the S3 markers, signed by this nightly's key, that stop them on the workers
    (gearfarm.formats.marker: the dashboard only records the request). True when it recorded any."""
    asked = db.cancellations(p.run_id)
    if not asked:
        return False
    for c in asked:
        if c.id in watchdog.marked:
            continue
        target, step = c.job_id.split(":")[1:] if c.job_id else (None, None)
        try:
            m = Marker("cancel", p.run_id, target, step, c.who, c.at)
            store.put_bytes(m.key, sealed(watchdog.signer, m), "application/json")
            watchdog.marked.add(c.id)
        except StoreError as e:
            log.warning("cannot write the cancel marker of %s (%s); trying again", c.job_id or p.run_id, e)
    whole = next((c for c in asked if c.job_id is None), None)
    by_job = {c.job_id: c for c in asked if c.job_id is not None}
    todo = [(j, whole or by_job[str(j)]) for j in pending if whole is not None or str(j) in by_job]
    # Builds first: a cancelled build ends its tests with it (skipped, saying why).
    for jid, c in sorted(todo, key=lambda x: x[0].kind != "build"):
        if str(jid) in db.terminal_ids(p.run_id):
            continue
        what = "the run" if c.job_id is None else "the job"
        expire(ledger, p, [jid], "cancelled", f"{what} was cancelled by {c.who}", watchdog.attempt(jid))
    return bool(todo)


def expire(ledger: Ledger, p: Plan, jids: list[JobId], status: str, message: str, attempt: int = 1) -> None:
    """Record what the farm decided for jobs that did not run; the ledger's rules keep any
    product result that got there first and end a build's dependents with it."""
    for jid in jids:
        ledger.apply(farm_record(jid, p.rev, status, message, attempt), "nightly")
