"""The re-run of a night's new failures: once, before the report, so it can tell a flaky test
from a broken one. The re-run is a run of its own (R.rerun, linked to R), so the first
attempt's log and result are never overwritten, and it runs through the same execute as any
run. gearmand, not the farm, picks the worker: with several registered it is often another
one; the record says which ran it and the run's notes whether it differed."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gearfarm.db import history
from gearfarm.db.cases import RunCases
from gearfarm.formats.job import Artifact, JobId
from gearfarm.formats.result import ResultRecord
from gearfarm.gearman import admin
from gearfarm.run.execution import Executor, Quiet
from gearfarm.run.nightly import Plan, RunError, preflight

log = logging.getLogger(__name__)


def rerun_id(run_id: str) -> str:
    return run_id + history.RERUN_SUFFIX


class _Announcer(Quiet):
    """Says what is re-run, once it is submitted, with the workers that could take it."""

    def __init__(self, todo: dict[JobId, ResultRecord], functions: dict[str, int], say: Callable[[str], None]):
        self.todo, self.functions, self.say = todo, functions, say

    def submitted(self, plan: Plan, created: bool) -> None:
        for jid in self.todo:
            self.say(f"re-running {jid.target}/{jid.step} (new failure; {self.functions.get(jid.function, 0)} "
                     f"worker(s) registered for {jid.function})")


def rerun_new_failures(ex: Executor, p: Plan, records: list[ResultRecord], say: Callable[[str], None] | None = None,
                       poll: float = 1.0) -> list[ResultRecord]:
    """Re-run, once, every test job of the run ``p`` that has a new failure, and wait for the
    results; returns the re-run's records (none when nothing failed anew)."""
    db = ex.db
    run = db.get_run(p.run_id)
    if run is None or run.parent_run_id is not None:
        return []
    by_id = {r.job_id: r for r in records}
    todo: dict[JobId, ResultRecord] = {}
    for v in history.classify_run(db, run, records, cases=RunCases.of_run(db, run.run_id)):
        rec = by_id.get(v.job_id)
        if v.kind == "new" and rec is not None and rec.kind == "test" and rec.artifact_key and rec.artifact_sha256:
            todo[JobId(rerun_id(p.run_id), rec.target, rec.step)] = rec
    if not todo:
        return []
    if len(rerun_id(p.run_id)) > 96:
        log.warning("run id %s too long for a re-run id; new failures stay unconfirmed", p.run_id)
        return []
    targets = sorted({j.target for j in todo})
    timeout = 300.0
    cat = db.catalog_of(run)
    if cat is not None and all(r.name in cat.suites for r in todo.values()):
        timeout = max(cat.suite(r.name or "").timeout for r in todo.values())
    rp = Plan(run_id=rerun_id(p.run_id), source=p.source, targets=targets,
              suites={t: sorted(r.name or "" for j, r in todo.items() if j.target == t) for t in targets},
              benchmarks={t: [] for t in targets}, seed=p.seed, parent=p.run_id, build=False,
              deadline=min(p.deadline, time.time() + timeout + 120) if p.deadline else time.time() + timeout + 120,
              artifacts={r.target: Artifact(r.artifact_key, r.artifact_sha256)  # type: ignore[arg-type]
                         for r in todo.values()})
    functions = {fn: st.workers for fn, st in _functions(ex).items()}
    first = {str(j): r for j, r in todo.items()}

    def note_workers(_: Plan, recs: list[ResultRecord]) -> None:
        db.update_notes(rp.run_id, workers={
            r.job_id: {"first": first[r.job_id].worker, "rerun": r.worker,
                       "other_worker": bool(r.worker) and r.worker != first[r.job_id].worker}
            for r in recs if r.job_id in first})

    return ex.execute([rp], _Announcer(todo, functions, say or (lambda _msg: None)), settle=note_workers,
                      poll=poll)[rp.run_id]


def _functions(ex: Executor) -> dict[str, admin.FunctionStatus]:
    try:
        return preflight(ex.cfg)
    except RunError:
        return {}
