"""Publishing a run's report: classify it against history, add the performance section and any
late results, write the files on disk, upload them to S3 and mail the message. It sits above
gearfarm.report and gearfarm.mail (which know nothing of each other) and degrades instead of
failing: with S3 or the results database down, the report is still written to disk and the
mail still goes out, and ``problems`` says what was missing, for the exit status."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from gearfarm import history, mail, perf, report
from gearfarm.config import Config
from gearfarm.mail import Delivery
from gearfarm.result import ResultRecord
from gearfarm.s3.store import ArtifactStore, StoreError
from gearfarm.store import ResultsDB, Run

log = logging.getLogger("gearfarm.publisher")


@dataclass
class Publication:
    report: dict[str, Any]
    paths: dict[str, Path]
    delivery: Delivery | None
    problems: list[str] = field(default_factory=list)


def _db_down(what: str, e: Exception) -> str:
    return f"results database unavailable, {what}: {str(e).splitlines()[0]}"


def publish(cfg: Config, db: ResultsDB, store: ArtifactStore | None, run: Run, records: list[ResultRecord],
            send_mail: bool = True, write_mail: bool = True) -> Publication:
    """The report for ``run`` made from ``records``. ``write_mail`` False re-renders the report
    without touching the message that was sent (``gearfarm report RUN``)."""
    problems: list[str] = []
    reruns: list[ResultRecord] = []
    verdicts = None
    try:
        for rid in db.reruns_of([run.run_id]).get(run.run_id, []):
            reruns.extend(db.jobs(rid))
        verdicts = history.classify_run(db, run, records)
    except SQLAlchemyError as e:
        problems.append(_db_down("failures are not classified against history", e))
    rep = report.build(run, records, store, verdicts, reruns)
    try:
        report.add_performance(rep, perf.analyze(db, run, cfg.path(cfg.farm.repo)))
    except SQLAlchemyError as e:
        report.add_performance(rep, [])
        problems.append(_db_down("no performance history", e))
    try:
        report.add_late(rep, db.late_results(run.run_id))
    except SQLAlchemyError as e:
        report.add_late(rep, [])
        problems.append(_db_down("late results not shown", e))
    out = cfg.path(cfg.farm.state_dir) / "runs" / run.run_id
    rep["problems"] = problems
    paths = report.write(rep, records, out)
    if store is not None:
        try:
            report.upload(rep, paths, store)
        except StoreError as e:
            problems.append(f"the report is on disk ({out}) but not in S3: {e}")
            paths = report.write(rep, records, out)  # now saying so
    delivery = None
    if write_mail or send_mail:
        delivery = mail.deliver(rep, report.render_text(rep), report.render_html(rep, mail=True), out, cfg.mail,
                                send_mail)
        paths["eml"] = Path(delivery.eml)
        if delivery.error:
            problems.append(f"mail not sent: {delivery.error}; the message is in {delivery.eml}")
        if send_mail or not cfg.mail.host:
            try:
                db.update_notes(run.run_id, mail=delivery.as_dict())
            except SQLAlchemyError as e:
                problems.append(_db_down("the mail's fate is not in the run's notes", e))
    for p in problems:
        log.warning("%s", p)
    return Publication(rep, paths, delivery, problems)
