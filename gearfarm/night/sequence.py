"""A night, top to bottom: check the farm can sign and store, prepare each project's source
snapshot and plan its run, submit and watch every run (re-running new failures before the
report), close them, publish the reports and the mail, bisect what they found, and decide the
exit status. Everything a person should see goes through the caller's `Observer`; nothing here
prints, so the same night runs under the command line, a test or a service.

One project's failure costs that project only: a project whose revision, catalog or source
snapshot cannot be had (`NotRun`, `nightly.ProjectError`) has its run recorded and closed as
failed with the error, reported and mailed with the others, while every other project runs.

The exit status: 0 all passed, 1 a job failed or is missing, or a project could not run, 2 the
farm itself had a problem (`NightError` before anything ran; a problem after the runs, such as
a mail not sent, still lets every report be written first)."""

from __future__ import annotations

import importlib
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sqlalchemy.exc import SQLAlchemyError

from gearfarm.bisection import driver as bisection
from gearfarm.bisection.subject import BisectionError
from gearfarm.config import Config, ConfigError
from gearfarm.db.results import NOT_RUN, ResultsDB, Run
from gearfarm.formats.exitcode import EXIT_FAILED, EXIT_FARM, EXIT_OK
from gearfarm.formats.result import ResultRecord
from gearfarm.formats.words import counted
from gearfarm.gearman import GearmanError
from gearfarm.hosts import reach
from gearfarm.hosts.connection import gearman_client
from gearfarm.report import joblog
from gearfarm.run import nightly, rerun
from gearfarm.run.execution import Abandoned, Executor, Watcher
from gearfarm.run.ledger import Ledger
from gearfarm.run.snapshot import SourceError
from gearfarm.s3.store import ArtifactStore, StoreError


class NightError(RuntimeError):
    """The night cannot run at all: the message names the problem and its fix (exit status 2)."""


class Observer(Watcher, Protocol):
    """What the night tells its caller, beside the runs' progress (Watcher)."""

    def say(self, text: str) -> None:
        """Progress: what the night is doing now."""

    def result(self, text: str) -> None:
        """What the night found: the reports, where they are, what was moved and mailed."""

    def warn(self, text: str) -> None:
        """Something the night works around (no worker for a target, a bisection that stopped)."""

    def problem(self, text: str) -> None:
        """A problem of the farm itself: the night ends with exit status 2."""


@dataclass
class Project:
    """One project of the night: its catalog at the revision, the run id, what to run."""

    loaded: nightly.Loaded
    run_id: str
    selection: nightly.Selection


@dataclass
class NotRun:
    """A project of the night that cannot run (nightly.ProjectError: its revision, its catalog,
    its snapshot): its run is recorded and closed as failed with ``error``, and reported."""

    project: str
    rev: str
    run_id: str
    error: str
    # The farm's own part failed (S3 would not take the snapshot): also a farm problem.
    farm: bool = False


def run_night(cfg: Config, projects: Sequence[Project], seed: int, observer: Observer,
              report_dir: Path | None = None, not_run: Sequence[NotRun] = ()) -> int:
    """Run the night; returns its exit status. Raises NightError when nothing could run.
    ``not_run``: the projects that could not be loaded, reported with the others."""
    try:
        cfg.nightly_signer()  # every payload is signed with it: without it, nothing is submitted
    except ConfigError as e:
        raise NightError(str(e)) from e
    db = ResultsDB(cfg.database.url)
    store = ArtifactStore(cfg.s3, retry_for=60)
    failed = list(not_run)
    plans = _plan(cfg, store, projects, seed, observer, failed)
    # The report's modules take a while to import: done while the jobs run, not between the
    # last job and the report, nor before the first submit.
    later = threading.Thread(target=lambda: [importlib.import_module(m) for m in report_modules(plans)], daemon=True)
    # The job files' copies on disk are made as the jobs end, not all after the report.
    copier = joblog.Copier(store, db, cfg.runs_dir())
    with gearman_client(cfg) as client:
        ex = Executor(cfg, db, Ledger(db), store, client)
        unclosed: dict[str, str] = {}
        try:
            by_run = ex.execute(
                plans, _Starting(observer, later, len(plans), copier),
                # New failures are re-run once before the report, so it can tell flaky from broken.
                settle=lambda p, records: rerun.rerun_new_failures(ex, p, records, say=observer.say),
                unclosed=lambda p, e: unclosed.setdefault(p.run_id, str(e).splitlines()[0]))
        except Abandoned as e:
            # Its runs are closed with the cause in every job's row: their reports say it.
            why = f"cannot submit to gearmand: {e}" if isinstance(e.cause, GearmanError) else str(e)
            if not e.runs and not failed:
                copier.close()
                raise NightError(why) from e
            by_run, plans = dict(e.runs), [p for p in plans if p.run_id in e.runs]
            problems = [n.error for n in failed if n.farm] + [why]
            runs = [_not_run(db, n, seed, by_run, problems) for n in failed]
            runs += [_closed(cfg, db, p, by_run, unclosed, problems) for p in plans]
            return _publish(cfg, db, store, plans, runs, by_run, problems, seed, observer, report_dir,
                            copier.close(), bisect=False)
    problems = [n.error for n in failed if n.farm]
    # The projects that could not run first: they are the night's news.
    runs = [_not_run(db, n, seed, by_run, problems) for n in failed]
    runs += [_closed(cfg, db, p, by_run, unclosed, problems) for p in plans]
    return _publish(cfg, db, store, plans, runs, by_run, problems, seed, observer, report_dir, copier.close())


def report_modules(plans: Sequence[nightly.Plan]) -> list[str]:
    """The modules the night's report loads: the change-point detector (scipy) and the plots
    (matplotlib) only when a run measures benchmarks (gearfarm.perf.analysis loads them where a
    series is). Loaded in every night, they were 1-1.5 s of the nightly's CPU while its first
    jobs ran, on the cores those jobs ran on: on one host, a tenth of a 100-job night's CPU
    (docs/speed.md)."""
    modules = ["gearfarm.report.publisher", "gearfarm.report.document"]
    if any(any(p.benchmarks.values()) for p in plans):
        modules += ["gearfarm.perf.changepoint", "gearfarm.perf.plot"]
    return modules


def _plan(cfg: Config, store: ArtifactStore, projects: Sequence[Project], seed: int,
          observer: Observer, failed: list[NotRun]) -> list[nightly.Plan]:
    """Each project's source snapshot in S3 and its plan; the functions no worker serves. A
    project whose snapshot cannot be made joins ``failed``; the others go on."""
    plans = []
    try:
        store.check()
        table = nightly.preflight(cfg)
        for pr in projects:
            lp = pr.loaded
            try:
                source, moved = nightly.prepare(store, lp)
            except nightly.ProjectError as e:
                observer.warn(f"project {lp.name} does not run tonight: {e}")
                failed.append(NotRun(lp.name, lp.rev, pr.run_id, str(e), e.farm))
                continue
            observer.say(f"project {lp.name}: revision {lp.rev[:12]}, source snapshot "
                         f"{'uploaded, ' + str(moved) + ' bytes' if moved else 'already in S3, 0 bytes uploaded'}")
            plans.append(nightly.plan(pr.run_id, source, pr.selection, seed, lp.catalog_text, moved))
    except (StoreError, nightly.RunError) as e:
        # An outage (a lab's gearmand or MinIO not started): say which unit starts it.
        down = reach.check(cfg)
        raise NightError(f"{e}; {down.start}" if down else str(e)) from e
    for t in sorted({t for p in plans for t in p.targets}):
        fn = f"build:{t}"
        if table.get(fn) is None or table[fn].workers == 0:
            observer.warn(f"preflight: no worker registered for {fn}; its jobs are recorded as "
                          f"'no worker' after {cfg.farm.no_worker_wait:.0f}s")
    return plans


class _Starting:
    """The caller's watcher, which also starts importing the report's modules once every run is
    submitted."""

    def __init__(self, observer: Observer, later: threading.Thread, plans: int, copier: joblog.Copier):
        self.observer, self.later, self.left, self.copier = observer, later, plans, copier

    def submitted(self, plan: nightly.Plan, created: bool) -> None:
        self.observer.submitted(plan, created)
        self.left -= 1
        if not self.left:
            self.later.start()

    def progress(self, plan: nightly.Plan, states: dict[str, str], functions: dict) -> None:
        self.copier.offer(states)
        self.observer.progress(plan, states, functions)

    def waited(self, plan: nightly.Plan, records: list[ResultRecord]) -> None:
        self.observer.waited(plan, records)


def _closed(cfg: Config, db: ResultsDB, p: nightly.Plan, by_run: dict[str, list[ResultRecord]],
            unclosed: dict[str, str], problems: list[str]) -> Run:
    """The closed run as recorded; when the database failed at the end, the run as planned, with
    the problem said (the report is then made from what was seen while waiting)."""
    why = unclosed.get(p.run_id)
    if why is None:
        try:
            run = db.get_run(p.run_id)
            assert run is not None
            return run
        except SQLAlchemyError as e:
            why = str(e).splitlines()[0]
    problems.append(f"results database unavailable at the end of run {p.run_id} ({why}): the run is not closed; "
                    "the report is made from the results seen while waiting")
    by_run[p.run_id] = []
    return Run(run_id=p.run_id, rev=p.rev, created_at=p.deadline - cfg.farm.run_deadline, finished_at=time.time(),
               expected=[str(j) for j in p.expected], targets=p.targets, state="finished", notes={"seed": p.seed},
               parent_run_id=None, project=p.project)


def _not_run(db: ResultsDB, n: NotRun, seed: int, by_run: dict[str, list[ResultRecord]], problems: list[str]) -> Run:
    """The run of a project that could not run, recorded and closed as failed with its error.
    When the database fails, or a run of that id exists already (a --run-id given again, which
    is left as it was), the run as it would be recorded: its report still says why."""
    by_run[n.run_id] = []
    try:
        if nightly.record_not_run(db, n.run_id, n.project, n.rev, n.error, seed):
            run = db.get_run(n.run_id)
            assert run is not None
            return run
    except SQLAlchemyError as e:
        problems.append(f"results database unavailable: the failed run {n.run_id} of project {n.project} is not "
                        f"recorded ({str(e).splitlines()[0]}); its report says why it did not run")
    now = time.time()
    return Run(run_id=n.run_id, rev=n.rev[:40], created_at=now, finished_at=now, expected=[], targets=[],
               state=NOT_RUN, notes={"seed": seed, "error": n.error}, parent_run_id=None, project=n.project)


def _publish(cfg: Config, db: ResultsDB, store: ArtifactStore, plans: list[nightly.Plan], runs: list[Run],
             by_run: dict[str, list[ResultRecord]], problems: list[str], seed: int, observer: Observer,
             report_dir: Path | None, copied: dict[str, joblog.Made], bisect: bool = True) -> int:
    """Write and send the reports, bisect what they found (unless ``bisect`` is False: a night
    that could not go on has nothing a probe could judge), say the farm's problems; the exit status."""
    from gearfarm.report import document, publisher

    pub = publisher.publish(cfg, db, store, runs, by_run, copied=copied)
    problems = problems + pub.problems
    for run in runs:
        observer.result(document.render_text(pub.reports[run.run_id]))
        html = pub.paths_by_run[run.run_id]["html"]
        observer.result(f"report: {html}")
        if report_dir is not None:
            try:
                shutil.copytree(html.parent, report_dir / run.run_id, dirs_exist_ok=True)
                observer.result(f"report copied to {report_dir / run.run_id}")
            except OSError as e:
                problems.append(f"cannot copy the report of {run.run_id} to {report_dir}: {e}")
    for p in plans:
        builds = [r for r in by_run[p.run_id] if r.kind == "build"]
        observer.result(f"project {p.project}: moved {p.source_bytes} bytes of source and "
                     f"{sum(r.bytes_uploaded for r in builds)} bytes of artifacts "
                     f"({sum(1 for r in builds if r.reused_artifact)} of {counted(len(builds), 'build')} reused)")
    if pub.delivery is not None and not pub.delivery.error:
        d = pub.delivery
        observer.result(f"mail: {'sent to ' + ', '.join(d.recipients) if d.sent else d.eml}")
    if cfg.bisect.auto and bisect:
        problems += _bisect_after(cfg, db, store, runs, by_run, seed, observer)
    for problem in problems:
        observer.problem(problem)
    if problems:
        return EXIT_FARM
    bad = [r for recs in by_run.values() for r in recs if r.status not in ("passed", "skipped")]
    missing = any(pub.reports[r.run_id].missing for r in runs)
    not_run = any(pub.reports[r.run_id].not_run for r in runs)
    return EXIT_FAILED if bad or missing or not_run else EXIT_OK


def _bisect_after(cfg: Config, db: ResultsDB, store: ArtifactStore, runs: list[Run],
                  by_run: dict[str, list[ResultRecord]], seed: int, observer: Observer) -> list[str]:
    """After the nightly's mail: bisect what its reports found ([bisect] auto), then write the
    reports again with the culprits and send the follow-up mail. Returns the farm's problems
    (a follow-up mail not sent); a bisection that could not go on is said, and recorded with
    its state "error", but does not change the nightly's exit status."""
    from gearfarm.report import publisher

    try:
        found = [c for run in runs for c in bisection.candidates(cfg, db, run.run_id)]
    except (SQLAlchemyError, SourceError) as e:
        observer.warn(f"regressions not bisected: {str(e).splitlines()[0]}")
        return []
    if not found:
        return []
    # One search per group: the new failures of one target and range together.
    observer.say(f"bisecting {sum(len(c.subjects) for c in found)} regression(s) in {len(found)} group(s), "
                 f"{cfg.bisect.parallel} at a time")
    for rows in bisection.run_all(cfg, db, store, found, seed, say=observer.say):
        if isinstance(rows, BisectionError):
            observer.warn(f"bisection problem: {rows}")
        else:
            observer.result(bisection.describe(rows))
    with_bisections = [r for r in runs if any(c.origin_run_id == r.run_id for c in found)]
    pub = publisher.follow_up(cfg, db, store, with_bisections, by_run)
    if pub.delivery is not None and not pub.delivery.error:
        d = pub.delivery
        observer.result(f"bisection mail: {'sent to ' + ', '.join(d.recipients) if d.sent else d.eml}")
    return pub.problems
