"""Regressions and their triage: every new failure and every performance change a run's report
found is recorded once (by kind, project, target, subject and first bad revision), with a
triage state kept on the server — untriaged, investigating, expected, fixed, won't fix — who
set it and why, and the trail of every change. Marking a performance change "expected" is the
same as `gearfarm perf expect`: the change stops being reported."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from gearfarm.db.history import CaseVerdict
from gearfarm.db.results import Annotation, Regression, ResultsDB, Run, TriageEvent

STATES = ("untriaged", "investigating", "expected", "fixed", "wontfix")
LABELS = {"untriaged": "untriaged", "investigating": "investigating", "expected": "expected", "fixed": "fixed",
          "wontfix": "won't fix"}
KINDS = ("failure", "performance")


class TriageError(ValueError):
    """A triage request names an unknown regression or state."""


@dataclass(frozen=True)
class Detected:
    kind: str
    target: str
    subject: str
    first_bad_rev: str
    last_good_rev: str | None
    first_bad_run: str
    detail: dict[str, Any]


def perf_subject(benchmark: str, metric: str, host_class: str) -> str:
    return f"{benchmark}/{metric}@{host_class}" if host_class else f"{benchmark}/{metric}"


def detected(run: Run, verdicts: list[CaseVerdict] | None, perf_entries: list[dict[str, Any]]) -> list[Detected]:
    """What a run's report found that a person should look at: its new failures (not known,
    not flaky) and its performance changes (a change may be found a night or two after its
    first bad night; it is recorded at that night, once, however many reports raise it)."""
    out = []
    for v in verdicts or []:
        if v.kind == "new":
            out.append(Detected("failure", v.target, v.test, run.rev, None, run.run_id,
                                {"reason": v.reason, "job_id": v.job_id}))
    for e in perf_entries:
        out.append(Detected("performance", e["target"], perf_subject(e["benchmark"], e["metric"], e["host_class"]),
                            e["first_bad_rev"], e.get("last_good_rev"), e.get("first_bad_run") or run.run_id,
                            {k: e.get(k) for k in ("benchmark", "metric", "host_class", "direction", "change",
                                                   "ci_low", "ci_high", "p_value", "before", "after",
                                                   "higher_is_better")}))
    return out


def last_good_rev(db: ResultsDB, g: Regression) -> str | None:
    """A regression's last good revision: the change point's for a performance change; for a new
    failure (recorded without one), the previous run's on its target. None when there is none."""
    if g.last_good_rev is not None:
        return g.last_good_rev
    run = db.get_run(g.first_bad_run)
    prev = db.runs_before(run.created_at, g.project, g.target, limit=1) if run else []
    return prev[0].rev if prev else None


def record(db: ResultsDB, run: Run, found: list[Detected]) -> int:
    """Store what ``run`` found; a regression already stored (the same run published again)
    keeps its row and its triage. Returns how many were new."""
    new = 0
    now = time.time()
    with db.writing() as conn:
        for d in found:
            stmt = db.insert(Regression).values(
                kind=d.kind, project=run.project, target=d.target, subject=d.subject, first_bad_run=d.first_bad_run,
                first_bad_rev=d.first_bad_rev, last_good_rev=d.last_good_rev, detected_at=now, detail=d.detail,
                state="untriaged", state_by="", state_note="", state_at=None)
            got = conn.execute(stmt.on_conflict_do_nothing(
                index_elements=["kind", "project", "target", "subject", "first_bad_rev"]).returning(Regression.id))
            new += got.first() is not None
    return new


def set_state(db: ResultsDB, regression_id: int, state: str, who: str, note: str = "") -> Regression:
    """Change a regression's triage state, keeping the trail; "expected" on a performance
    change also annotates it, so the reports stop raising it."""
    if state not in STATES:
        raise TriageError(f"unknown triage state {state!r}; one of: {', '.join(STATES)}")
    now = time.time()
    with db.session(write=True) as s:
        reg = s.get(Regression, regression_id)
        if reg is None:
            raise TriageError(f"no regression #{regression_id}")
        reg.state, reg.state_by, reg.state_note, reg.state_at = state, who, note, now
        s.add(TriageEvent(regression_id=regression_id, state=state, who=who, note=note, at=now))
        if state == "expected" and reg.kind == "performance":
            bench, metric = reg.detail.get("benchmark", ""), reg.detail.get("metric", "")
            exists = s.scalars(select(Annotation).where(
                Annotation.benchmark == bench, Annotation.metric == metric, Annotation.target == reg.target,
                Annotation.rev == reg.first_bad_rev)).first()
            if exists is None:
                s.add(Annotation(benchmark=bench, metric=metric, target=reg.target, rev=reg.first_bad_rev,
                                 note=f"{who}: {note}" if note else who, created_at=now))
        return reg


def listing(db: ResultsDB, project: str | None = None, state: str | None = None, kind: str | None = None,
            limit: int = 200, run_id: str | None = None, subject: str | None = None,
            target: str | None = None) -> list[Regression]:
    """Regressions, newest first (``run_id``: those first seen in that run)."""
    q = select(Regression).order_by(Regression.detected_at.desc(), Regression.id.desc()).limit(limit)
    for column, value in ((Regression.first_bad_run, run_id), (Regression.subject, subject),
                          (Regression.target, target), (Regression.project, project), (Regression.state, state),
                          (Regression.kind, kind)):
        if value:
            q = q.where(column == value)
    with db.session() as s:
        return list(s.scalars(q))


def trail(db: ResultsDB, regression_id: int) -> list[TriageEvent]:
    with db.session() as s:
        q = select(TriageEvent).where(TriageEvent.regression_id == regression_id).order_by(TriageEvent.id)
        return list(s.scalars(q))


def get(db: ResultsDB, regression_id: int) -> Regression | None:
    with db.session() as s:
        return s.get(Regression, regression_id)


def as_dict(reg: Regression) -> dict[str, Any]:
    return {"id": reg.id, "kind": reg.kind, "project": reg.project, "target": reg.target, "subject": reg.subject,
            "first_bad_run": reg.first_bad_run, "first_bad_rev": reg.first_bad_rev,
            "last_good_rev": reg.last_good_rev, "detected_at": reg.detected_at, "detail": reg.detail,
            "state": reg.state, "state_label": LABELS.get(reg.state, reg.state), "state_by": reg.state_by,
            "state_note": reg.state_note, "state_at": reg.state_at}
