"""Publishing a nightly's reports: for each run (one per project) classify it against its
project's history, add the performance section and any late results, write the files on disk
and upload them to S3; then mail ONE message covering every run. It sits above gearfarm.report.document
and gearfarm.report.mail (which know nothing of each other) and degrades instead of failing: with S3
or the results database down, the reports are still written to disk and the mail still goes
out, and ``problems`` says what was missing, for the exit status."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from gearfarm.config import Config
from gearfarm.db import history, triage
from gearfarm.db.cases import RunCases
from gearfarm.db.results import ResultsDB, Run
from gearfarm.formats.result import ResultRecord
from gearfarm.perf import analysis as perf
from gearfarm.report import document as report
from gearfarm.report import joblog, links, mail
from gearfarm.report.mail import Delivery
from gearfarm.s3.store import ArtifactStore, StoreError

log = logging.getLogger(__name__)


@dataclass
class Publication:
    """``reports`` and ``paths_by_run`` hold every run's, in the order given (keyed by run id);
    ``report`` and ``paths`` are the first run's (the only one's for a single run). The mail's
    .eml is ``paths["eml"]`` when a message was written."""

    report: report.Report
    paths: dict[str, Path]
    delivery: Delivery | None
    problems: list[str] = field(default_factory=list)
    reports: dict[str, report.Report] = field(default_factory=dict)
    paths_by_run: dict[str, dict[str, Path]] = field(default_factory=dict)


def _db_down(what: str, e: Exception) -> str:
    return f"results database unavailable, {what}: {str(e).splitlines()[0]}"


def run_dir(cfg: Config, run_id: str) -> Path:
    return cfg.runs_dir() / run_id


def publish(cfg: Config, db: ResultsDB, store: ArtifactStore | None, runs: list[Run],
            records: dict[str, list[ResultRecord]], send_mail: bool = True, write_mail: bool = True,
            copied: Mapping[str, joblog.Made] | None = None) -> Publication:
    """The reports of ``runs`` (records[run_id] each), written and uploaded per run exactly as
    for a run on its own, and one message for all of them: for one run its report, for several
    one section per run in the order given (gearfarm.report.document.render_mail_*). The message is
    written as report.eml in the FIRST run's directory (state/runs/<first run>/report.eml); the
    other runs' directories get no .eml, and every run's notes record the delivery.
    ``write_mail`` False re-renders the reports without touching the message that was sent
    (``gearfarm report RUN``). ``copied``: the records whose job files are on disk already
    (joblog.Copier)."""
    if not runs:
        raise ValueError("publish needs at least one run")
    problems: list[str] = []
    reports: dict[str, report.Report] = {}
    paths_by_run: dict[str, dict[str, Path]] = {}
    copy_later: list[tuple[Run, list[ResultRecord]]] = []
    for run in runs:
        rep, paths, own, later = _publish_run(cfg, db, store, run, records.get(run.run_id, []), copied or {})
        reports[run.run_id], paths_by_run[run.run_id] = rep, paths
        # With several runs, the console and the exit status need to know whose problem it is.
        problems += own if len(runs) == 1 else [f"{run.project} ({run.run_id}): {p}" for p in own]
        if later:
            copy_later.append((run, later))
    first = runs[0]
    delivery = None
    if write_mail or send_mail:
        delivery = mail.deliver(letter(list(reports.values())), run_dir(cfg, first.run_id), cfg.mail, send_mail)
        paths_by_run[first.run_id]["eml"] = Path(delivery.eml)
        if delivery.error:
            problems.append(f"mail not sent: {delivery.error}; the message is in {delivery.eml}")
        if send_mail or not cfg.mail.host:
            try:
                for run in runs:
                    db.update_notes(run.run_id, mail=delivery.as_dict())
            except SQLAlchemyError as e:
                problems.append(_db_down("the mail's fate is not in the runs' notes", e))
    for run, later in copy_later:
        assert store is not None
        own = joblog.copy_all(store, db, later, run_dir(cfg, run.run_id).parent, copied)
        problems += own if len(runs) == 1 else [f"{run.project} ({run.run_id}): {p}" for p in own]
    for p in problems:
        log.warning("%s", p)
    return Publication(reports[first.run_id], paths_by_run[first.run_id], delivery, problems, reports, paths_by_run)


def follow_up(cfg: Config, db: ResultsDB, store: ArtifactStore | None, runs: list[Run],
              records: dict[str, list[ResultRecord]]) -> Publication:
    """After the bisections of the runs' regressions ended (after the nightly's mail): the
    reports again, now with their bisections (the nightly's message stays as it was sent), and
    a short follow-up message naming the culprits, written as bisection.eml beside report.eml
    and sent like it; every run's notes record its fate under "bisection_mail"."""
    pub = publish(cfg, db, store, runs, records, send_mail=False, write_mail=False)
    reports = list(pub.reports.values())
    note = mail.Letter(subject=report.bisection_subject(reports), runs=[r.run_id for r in reports],
                       text=report.render_bisection_text(reports), html=report.render_bisection_html(reports))
    pub.delivery = mail.deliver(note, run_dir(cfg, runs[0].run_id), cfg.mail, name="bisection.eml")
    if pub.delivery.error:
        pub.problems.append(f"the bisection mail was not sent: {pub.delivery.error}; it is in {pub.delivery.eml}")
    try:
        for run in runs:
            db.update_notes(run.run_id, bisection_mail=pub.delivery.as_dict())
    except SQLAlchemyError as e:
        pub.problems.append(_db_down("the bisection mail's fate is not in the runs' notes", e))
    return pub


def letter(reports: list[report.Report]) -> mail.Letter:
    """The one message for these runs' reports, in the order given."""
    return mail.Letter(subject=report.mail_subject(reports), runs=[r.run_id for r in reports],
                       text=report.render_mail_text(reports), html=report.render_mail_html(reports),
                       images=report.mail_images(reports))


def classify(db: ResultsDB, run: Run, records: list[ResultRecord], cases: RunCases | None = None
             ) -> list[history.CaseVerdict]:
    """The run's verdicts, kept with the run: the dashboard shows them without classifying the
    run again (which reads a hundred runs of history: 0.4 s against a page's 0.2 s budget)."""
    verdicts = history.classify_run(db, run, records, cases=cases)
    db.update_notes(run.run_id, verdicts=[v.as_dict() for v in verdicts if v.kind != "passed"])
    return verdicts


def _publish_run(cfg: Config, db: ResultsDB, store: ArtifactStore | None, run: Run, records: list[ResultRecord],
                 copied: Mapping[str, joblog.Made]) -> tuple[report.Report, dict[str, Path], list[str],
                                                          list[ResultRecord]]:
    """One run's report, on disk and in S3: (report, its files, what was missing, the records
    whose job files are still to be copied to disk)."""
    problems: list[str] = []
    reruns: list[ResultRecord] = []
    verdicts = None
    cases = None  # then the records' own (the database down: the cases the nightly saw)
    try:
        for rid in db.reruns_of([run.run_id]).get(run.run_id, []):
            reruns.extend(db.jobs(rid, cases=False))
        cases = RunCases.of_run(db, run.run_id)
        verdicts = classify(db, run, records, cases)
    except SQLAlchemyError as e:
        problems.append(_db_down("failures are not classified against history", e))
    out = run_dir(cfg, run.run_id)
    later: list[ResultRecord] = []
    if store is not None:
        if cfg.web.url:
            # The report links to the dashboard, which reads the store first: the copies are
            # its fallback, made after the mail (two requests a file: 10,000 files for a
            # 5,000-job night, a minute and more on two cores; docs/speed.md, "At scale").
            later = records + reruns
        else:
            # Before the report is written: its links point at these copies.
            problems += joblog.copy_all(store, db, records + reruns, out.parent, copied)
    rep = report.build(run, records, links.for_run(cfg.web.url, out), verdicts, reruns, cases)
    try:
        rep = rep.with_performance(perf.analyze(db, run), perf.figures(db, run, records))
    except SQLAlchemyError as e:
        rep = rep.with_performance([])
        problems.append(_db_down("no performance history", e))
    try:
        triage.record(db, run, triage.detected(run, verdicts, rep.performance or []))
    except SQLAlchemyError as e:
        problems.append(_db_down("the run's regressions are not on the dashboard", e))
    try:
        rep = rep.with_bisections(db.bisections(origin_run_ids=[run.run_id]))
    except SQLAlchemyError as e:
        rep = rep.with_bisections([])
        problems.append(_db_down("bisections not shown", e))
    try:
        rep = rep.with_late(db.late_results(run.run_id))
    except SQLAlchemyError as e:
        rep = rep.with_late([])
        problems.append(_db_down("late results not shown", e))
    rep = rep.with_problems(problems)
    paths = report.write(rep, records, out, cases)
    if store is not None:
        try:
            report.upload(rep, paths, store)
        except StoreError as e:
            problems.append(f"the report is on disk ({out}) but not in S3: {e}")
            rep = rep.with_problems(problems)
            paths = report.write(rep, records, out, cases)  # now saying so
    return rep, paths, problems, later
