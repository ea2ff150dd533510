"""Classifying a run's results against history, per test case and target, within the run's
project: another project's runs are never its history, even for a test of the same name.

Verdicts for a test case on a target (failing means failed or error in its JUnit):
  new     failing now, passing in that target's previous run (or never seen before)
  known   failing now and in the previous run: "failing since run X at rev Y"
  fixed   passing now, failing in the previous run
  flaky   failing now, and either passing on its automatic re-run, or with a history that flips:
          a re-run that passed, or FLIP_LIMIT or more status changes, within the last WINDOW runs
  passed  passing now and before (not reported)

A job that failed as a product failure without any failing test case (a build that does not
compile, a suite that timed out or crashed) is judged the same way as a pseudo case named
"[step]", so it is new, known or fixed like any test. Farm failures (infra, no worker) are the
farm's, not the engine's, and are never classified.

The re-run of a run R (gearfarm.run.rerun) is a run of its own, R.rerun, linked
by parent_run_id: history reads its verdicts as a second opinion, never as a run of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from gearfarm.db.cases import RunCases
from gearfarm.db.results import ResultsDB, Run
from gearfarm.formats.result import PRODUCT_FAILURES, ResultRecord
from gearfarm.formats.words import counted

log = logging.getLogger(__name__)

# Runs of a target looked at for flakiness, and how many status changes in them make a test
# flaky. Two changes are a break and its fix (pass, fail, fail, pass) and must stay "fixed";
# three mean it goes back and forth.
WINDOW = 10
FLIP_LIMIT = 3
# Runs read back for "failing since": a streak longer than this is reported as "since before".
HISTORY_RUNS = 100
RERUN_SUFFIX = ".rerun"
KINDS = ("new", "known", "fixed", "flaky", "passed")


@dataclass
class CaseRun:
    """One result of one test case on one target in one run (first attempt), and the result
    of its re-run when there was one."""

    run_id: str
    rev: str
    status: str  # passed | failed
    rerun: str | None = None

    @property
    def failed(self) -> bool:
        return self.status == "failed"


@dataclass
class CaseVerdict:
    target: str
    suite: str
    name: str
    kind: str
    reason: str = ""
    since_run: str | None = None
    since_rev: str | None = None
    rerun: str | None = None
    job_id: str = ""
    history: list[str] = field(default_factory=list)  # statuses, oldest first, this run last

    @property
    def test(self) -> str:
        return f"{self.suite}/{self.name}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "test": self.test}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaseVerdict:
        return cls(**{k: v for k, v in d.items() if k != "test"})


def flips(statuses: Iterable[str]) -> int:
    seq = list(statuses)
    return sum(1 for a, b in zip(seq, seq[1:], strict=False) if a != b)


def classify(history: list[CaseRun], current: CaseRun, window: int = WINDOW,
             flip_limit: int = FLIP_LIMIT) -> tuple[str, str, CaseRun | None]:
    """The verdict for ``current`` given the earlier outcomes (oldest first) of the same test on
    the same target: (kind, reason, first outcome of the failing streak for known/fixed)."""
    prev = history[-1] if history else None
    if not current.failed and (prev is None or not prev.failed):
        return "passed", "", None  # most cases of a night: nothing below would change it
    recent = history[-(window - 1):] if window > 1 else []
    n_flips = flips([o.status for o in recent] + [current.status])
    flaky_rerun = [o for o in recent if o.failed and o.rerun == "passed"]
    if current.failed:
        if current.rerun == "passed":
            return "flaky", "failed, then passed on its re-run", None
        if flaky_rerun:
            o = flaky_rerun[-1]
            return "flaky", f"passed on its re-run in run {o.run_id}, within the last {counted(window, 'run')}", None
        if n_flips >= flip_limit:
            return ("flaky", f"changed status {counted(n_flips, 'time')} in the last {counted(len(recent) + 1, 'run')}",
                    None)
        if prev is None:
            return "new", "no earlier result on this target", None
        if not prev.failed:
            how = "confirmed by its re-run" if current.rerun == "failed" else "not re-run"
            return "new", f"passed in run {prev.run_id}; {how}", None
        return "known", "", streak_start(history)
    if prev is not None and prev.failed:
        if prev.rerun == "passed" or n_flips >= flip_limit:
            return "passed", "flaky before, passing now", None
        return "fixed", "", streak_start(history)
    return "passed", "", None


def streak_start(history: list[CaseRun]) -> CaseRun | None:
    """The first outcome of the failing streak that ends the history."""
    start = None
    for o in reversed(history):
        if not o.failed:
            break
        start = o
    return start


def _case_status(status: str) -> str | None:
    return {"passed": "passed", "failed": "failed", "error": "failed"}.get(status)


def _job_status(status: str, failing_cases: int) -> str | None:
    """The pseudo case of a job: failed only when no test case explains the failure."""
    if status == "passed":
        return "passed"
    if status in PRODUCT_FAILURES:
        return "passed" if failing_cases else "failed"
    return None


def pseudo_name(step: str) -> str:
    return f"[{step}]"


def _suite_of(rec_name: str | None, step: str) -> str:
    return rec_name or step


def _statuses(db: ResultsDB, run_ids: list[str]) -> dict[tuple[str, str, str, str], str]:
    """(run_id, target, suite, name) -> passed|failed, from the database."""
    out: dict[tuple[str, str, str, str], str] = {}
    failing: dict[tuple[str, str], int] = {}
    for rid, target, suite, name, status in db.cases_in(run_ids):
        st = _case_status(status)
        if st is None:
            continue
        key = (rid, target, suite, name)
        if key not in out or st == "failed":
            out[key] = st
        if st == "failed":
            failing[(rid, f"{target}\0{suite}")] = failing.get((rid, f"{target}\0{suite}"), 0) + 1
    for rid, target, step, status, _started, _finished in db.job_cells(run_ids):
        suite = step.split("-", 1)[1] if "-" in step else step
        st = _job_status(status, failing.get((rid, f"{target}\0{suite}"), 0))
        if st is not None:
            out[(rid, target, suite, pseudo_name(step))] = st
    return out


def classify_run(db: ResultsDB, run: Run, records: list[ResultRecord], window: int = WINDOW,
                 cases: RunCases | None = None) -> list[CaseVerdict]:
    """The verdicts of the run's test cases that fail now or failed in the run's history (its
    HISTORY_RUNS earlier runs on their target), "passed" ones among them; ``cases``: the run's
    cases as the database counts them (default: the records' own).

    A case that passes now and failed in none of those runs is "passed" whatever else its
    history holds (``classify``: only a failing previous outcome changes a passing case) and is
    left out, unread: a 5,000-job night has 200,000 cases, most of them passing for months, and
    reading each one's history was the report's largest cost (docs/speed.md, "At scale"). The
    history that is read: the failing cases of every earlier run (the partial index
    ix_cases_failing), then the whole history of the few cases that fail now or failed then."""
    own = [r for r in records if r.run_id == run.run_id]
    cases = cases or RunCases.of_records(own)
    failing_now = current_failures(own, cases)
    targets = sorted({r.target for r in own})
    earlier = {t: list(reversed(rs))
               for t, rs in db.runs_before_each(run.created_at, run.project, targets, HISTORY_RUNS).items()}
    revs = {r.run_id: r.rev for rs in earlier.values() for r in rs}
    ran_on = {(r.run_id, t) for t, rs in earlier.items() for r in rs}
    parents = sorted({r.run_id for rs in earlier.values() for r in rs} | {run.run_id})
    children = db.reruns_of(parents)
    parent_of = {c: p for p, cs in children.items() for c in cs}
    every_run = parents + sorted(parent_of)
    # What failed before: the failing cases of the history, and the jobs that failed without one.
    failed_cases = db.failing_in(every_run)
    failing_per_job = _count_by_job(failed_cases)
    case_keys = {k for k in failing_now if not k[2].startswith("[")}
    case_keys |= {(t, suite, name) for rid, t, suite, name in failed_cases if (rid, t) in ran_on}
    job_keys = {(k[0], k[2][1:-1]) for k in failing_now if k[2].startswith("[")}
    for rid, t, step, status in db.job_statuses(every_run, failing=True):
        if (rid, t) in ran_on and _job_status(status, failing_per_job.get((rid, t, _step_suite(step)), 0)) == "failed":
            job_keys.add((t, step))
    # Their whole history, tonight's outcome and the re-runs' included.
    outcomes: dict[tuple[str, str, str, str], str] = {}
    for rid, t, suite, name, status in db.case_statuses(every_run, case_keys):
        st = _case_status(status)
        if st is not None and ((key := (rid, t, suite, name)) not in outcomes or st == "failed"):
            outcomes[key] = st
    for rid, t, step, status in db.job_statuses(every_run, steps=job_keys):
        st = _job_status(status, failing_per_job.get((rid, t, _step_suite(step)), 0))
        if st is not None:
            outcomes[(rid, t, _step_suite(step), pseudo_name(step))] = st
    own_jobs = {(r.target, r.step): r for r in own}
    by_suite = {(r.target, _suite_of(r.name, r.step)): r for r in own}
    current: dict[tuple[str, str, str], tuple[str, ResultRecord]] = dict(failing_now)
    for (rid, t, suite, name), st in outcomes.items():
        if rid == run.run_id and (t, suite, name) not in current:
            rec = own_jobs.get((t, name[1:-1])) if name.startswith("[") else by_suite.get((t, suite))
            if rec is not None:
                current[(t, suite, name)] = (st, rec)
    rerun_status = {(parent_of[rid], t, suite, name): st for (rid, t, suite, name), st in outcomes.items()
                    if rid in parent_of}
    verdicts = []
    for (target, suite, name), (status, rec) in sorted(current.items()):
        cur = CaseRun(run.run_id, run.rev, status, rerun_status.get((run.run_id, target, suite, name)))
        hist = [CaseRun(r.run_id, revs[r.run_id], outcomes[k], rerun_status.get(k))
                for r in earlier[target] if (k := (r.run_id, target, suite, name)) in outcomes]
        kind, reason, since = classify(hist, cur, window)
        if kind == "known" and since is None:
            since = cur
        if since is not None and hist and since is hist[0] and len(earlier[target]) >= HISTORY_RUNS:
            reason = f"since before run {since.run_id}"
        verdicts.append(CaseVerdict(target=target, suite=suite, name=name, kind=kind, reason=reason,
                                    since_run=since.run_id if since else None, since_rev=since.rev if since else None,
                                    rerun=cur.rerun, job_id=rec.job_id,
                                    history=[o.status for o in hist[-(window - 1):]] + [status]))
    return verdicts


def current_failures(records: list[ResultRecord], cases: RunCases
                     ) -> dict[tuple[str, str, str], tuple[str, ResultRecord]]:
    """(target, suite, name) -> ("failed", the job's record) of the run's failing test cases, and
    of its jobs that failed as a product failure without a failing case ("[step]")."""
    out: dict[tuple[str, str, str], tuple[str, ResultRecord]] = {}
    for r in records:
        suite = _suite_of(r.name, r.step)
        for c in cases.failing.get(r.job_id, []):
            out[(r.target, suite, c.name)] = ("failed", r)
        if _job_status(r.status, cases.failing_count(r.job_id)) == "failed":
            out[(r.target, suite, pseudo_name(r.step))] = ("failed", r)
    return out


def _step_suite(step: str) -> str:
    """The suite the cases table names a job's cases by, from its step ("test-unit": "unit")."""
    return step.split("-", 1)[1] if "-" in step else step


def _count_by_job(rows: list[tuple[str, str, str, str]]) -> dict[tuple[str, str, str], int]:
    out: dict[tuple[str, str, str], int] = {}
    for rid, t, suite, _name in rows:
        out[(rid, t, suite)] = out.get((rid, t, suite), 0) + 1
    return out


def history_of(db: ResultsDB, test: str, window: int = WINDOW, project: str | None = None,
               recent: int | None = None) -> list[tuple[Run, str, str, str, str]]:
    """A test's results across runs and targets (of ``project``, or of every project, each
    judged against its own), each with the verdict it had when its run was classified:
    (run, target, suite, status, verdict), oldest first; ``run.project`` names the project.
    ``recent``: only the newest that many runs (a streak older than them is judged from them)."""
    rows = db.cases_of(test, project=project, recent=recent)
    reruns = db.reruns_of({run.run_id for _, run in rows})
    rerun_status: dict[tuple[str, str, str, str], str] = {}
    for parent, children in reruns.items():
        for (_rid, target, suite, name), st in _statuses(db, children).items():
            rerun_status[(parent, target, suite, name)] = st
    seen: dict[tuple[str, str, str], list[CaseRun]] = {}
    out = []
    for case, run in rows:
        st = _case_status(case.status)
        if st is None:
            out.append((run, case.target, case.suite, case.status, "-"))
            continue
        hist = seen.setdefault((run.project, case.target, case.suite), [])
        cur = CaseRun(run.run_id, run.rev, st, rerun_status.get((run.run_id, case.target, case.suite, case.name)))
        kind, reason, since = classify(hist, cur, window)
        label = kind
        if kind in ("known", "fixed") and since is not None:
            label = f"{kind} (since {since.run_id} at {since.rev[:12]})"
        elif kind == "flaky" or (kind == "new" and cur.rerun):
            label = f"{kind} ({reason})"
        out.append((run, case.target, case.suite, case.status, label))
        hist.append(cur)
    return out
