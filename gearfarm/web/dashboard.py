"""What each dashboard page shows, as plain data: the web layer (gearfarm.web.app) renders these
dicts as HTML and serves them unchanged as JSON under /api/, so the page and its API can never
disagree. Everything here reads the results database (and the project's repository for change
sets); nothing here knows about HTTP."""

from __future__ import annotations

import functools
import logging
import math
import re
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr

from gearfarm.config import Config, ConfigError
from gearfarm.db import history, triage
from gearfarm.db.cases import RunCases
from gearfarm.db.results import ResultsDB, Run
from gearfarm.formats.job import JobId
from gearfarm.formats.result import PRODUCT_FAILURES, ResultRecord
from gearfarm.formats.words import counted
from gearfarm.gearman import GearmanError, admin
from gearfarm.hosts import reach, tls
from gearfarm.hosts.connection import ssl_context
from gearfarm.perf import analysis as perf
from gearfarm.perf import compare as judge
from gearfarm.perf.pairs import Paired
from gearfarm.report import document as report
from gearfarm.report.links import DashboardLinks
from gearfarm.run import snapshot
from gearfarm.web import svgplot
from gearfarm.web.pagecache import PageCache, Parts

log = logging.getLogger(__name__)

NIGHTS = 10
# A run page lists each job's timings up to this many jobs; past it, each target's summed, and a
# target's jobs when asked for (?target=): 5,000 rows took half a second to render and to read.
TIMING_ROWS = 500
# A test's page reads this many of the newest runs.
TEST_RUNS = 200
# Worst first: the state a target shows for a run is the worst of its jobs'.
SEVERITY = ("failed", "infra", "cancelled", "running", "missing", "passed")


# A status in words with a mark, so that no page tells it by colour alone.
STATUS_WORDS = {"passed": "✔ passed", "failed": "✘ failed", "error": "✘ error", "timed_out": "⏱ timed out",
                "infra": "⚠ infra", "no_worker": "⚠ no worker", "skipped": "– skipped", "cancelled": "⊘ cancelled",
                "missing": "? missing", "running": "… running"}


def status_word(status: str | None) -> str:
    return STATUS_WORDS.get(status or "", status or "")


def status_mark(status: str | None) -> str:
    """The mark alone, for a cell too small for the word (its title says the word)."""
    return status_word(status).split(" ", 1)[0] if (status or "") in STATUS_WORDS else "?"


def step_key(step: str) -> tuple[int, str]:
    """Build first, then suites, then benchmarks: the order a target's stages run in."""
    return ({"build": 0, "test": 1, "perf": 2}.get(step.split("-", 1)[0], 3), step)


def target_state(steps: dict[str, str], expected: list[str], running: bool) -> tuple[str, str | None]:
    """(state, failing stage) of one target in one run from its jobs' statuses (step ->
    status) and the steps it expects: failed (the product), infra (the farm), cancelled (by a
    person), running, missing (the run ended without them), passed."""
    order = sorted(set(steps) | set(expected), key=step_key)
    for step in order:
        if steps.get(step) in PRODUCT_FAILURES:
            return "failed", step
    for step in order:
        if steps.get(step) in ("infra", "no_worker"):
            return "infra", step
    for step in order:
        if steps.get(step) == "cancelled":
            return "cancelled", step
    pending = [s for s in order if s not in steps]
    if pending:
        return ("running" if running else "missing"), pending[0]
    return "passed", None


def _expected_steps(run: Run) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for text in run.expected or []:
        try:
            jid = JobId.parse(text)
        except ValueError:
            continue
        out.setdefault(jid.target, []).append(jid.step)
    return out


def _run_brief(run: Run) -> dict[str, Any]:
    return {"run_id": run.run_id, "project": run.project, "rev": run.rev, "created_at": run.created_at,
            "finished_at": run.finished_at, "state": run.state}


def status(db: ResultsDB, nights: int = NIGHTS, cache: PageCache | None = None) -> dict[str, Any]:
    """Projects × targets for each project's latest nightly, and the last ``nights`` per target."""
    projects = []
    for project in db.projects():
        runs = db.runs(limit=nights, project=project)  # newest first
        if not runs:
            continue
        states = _target_states(db, runs, cache)
        targets: list[str] = []
        for r in runs:
            targets += [t for t in r.targets or [] if t not in targets]
        rows = []
        for t in targets:
            strip = []
            for r in reversed(runs):
                if t not in (r.targets or []):
                    continue
                state, stage = states[r.run_id][t]
                strip.append({"run_id": r.run_id, "rev": r.rev, "created_at": r.created_at, "state": state,
                              "stage": stage})
            latest = strip[-1] if strip else None
            rows.append({"target": t, "latest": latest, "strip": strip})
        projects.append({"project": project, "latest": _run_brief(runs[0]), "targets": rows})
    return {"generated_at": time.time(), "nights": nights, "projects": projects}


def runs(db: ResultsDB, project: str | None = None, limit: int = 100,
         cache: PageCache | None = None) -> dict[str, Any]:
    rows = db.runs(limit=limit, project=project)
    states = _target_states(db, rows, cache)
    out = []
    for r in rows:
        worst = min((st for st, _ in states[r.run_id].values()), key=SEVERITY.index, default="missing")
        out.append({**_run_brief(r), "targets": r.targets, "result": worst})
    return {"project": project, "runs": out}


def _target_states(db: ResultsDB, runs: list[Run], cache: PageCache | None) -> dict[str, dict[str, list[Any]]]:
    """Run id -> target -> [state, failing stage] (target_state) of each of ``runs``. An ended
    run's are kept per version of the run when a ``cache`` is given: the front page's ten and
    the runs page's hundred 5,000-job nights are 50,000 and 500,000 jobs to read at each look."""
    versions = db.run_versions([r.run_id for r in runs if r.finished_at is not None]) if cache is not None else {}
    states: dict[str, dict[str, list[Any]]] = {}
    for r in runs:
        got = cache.get(("target-states", r.run_id), versions[r.run_id], ("states",)) \
            if cache is not None and r.run_id in versions else None
        if got is not None:
            states[r.run_id] = got["states"]
    todo = [r for r in runs if r.run_id not in states]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for rid, target, step, st, _s, _f in db.job_cells([r.run_id for r in todo]):
        cells.setdefault((rid, target), {})[step] = st
    for r in todo:
        # Once a run, not once a target and run: 100 targets of 5,000 jobs parsed every job id
        # 100 times, 2 million parses a page (docs/speed.md, "At scale").
        expected = _expected_steps(r)
        states[r.run_id] = {t: list(target_state(cells.get((r.run_id, t), {}), expected.get(t, []),
                                                 r.state == "running")) for t in r.targets or []}
        if cache is not None and r.run_id in versions:
            cache.put(("target-states", r.run_id), versions[r.run_id], {"states": states[r.run_id]})
    return states


class RunPage(report.Report):
    """A run on the dashboard: its report, with links into the dashboard, and what only the
    dashboard shows beside it."""

    state: str
    parent_run_id: str | None
    previous: dict[str, Any] | None
    changes: list[dict[str, Any]]
    changes_error: str | None
    built: dict[str, Any] | None
    regressions: list[dict[str, Any]]
    curves: list[dict[str, Any]]
    builds: list[dict[str, Any]]
    job_timings: list[dict[str, Any]]
    target_timings: list[dict[str, Any]]
    timing_columns: list[tuple[str, str]]
    # The version of the records it was made from when it was kept (ResultsDB.run_version),
    # which what is made from it may be kept under too (its matrix's and results' HTML); None:
    # made anew.
    _version: str | None = PrivateAttr(default=None)
    # What it was made from, for the parts it leaves out (whole()).
    _parts: Parts | None = PrivateAttr(default=None)

    @property
    def version(self) -> str | None:
        return self._version

    def whole(self) -> RunPage:
        """This page with its matrix, read from what it was made from when left out."""
        if self.matrix or self._parts is None or "matrix" not in self._parts:
            return self
        return self.model_copy(update={"matrix": self._parts.load("matrix")})

    def as_dict(self) -> dict[str, Any]:
        """The fields that were set, as they are: every part is already plain JSON data (made by
        run() from the report's own dict), which a model_dump would walk again, 7 MB of it."""
        return {k: getattr(self, k) for k in self.model_fields_set}


def run(db: ResultsDB, cfg: Config, run_id: str, root: str = "/", cache: PageCache | None = None,
        jobs: bool = True, timings_of: str | None = None) -> RunPage | None:
    """One run: the report's matrix, failures and classification with links into the
    dashboard, the change set since the previous run of its project, the night's performance
    figures and what it was the first to show (its regressions). What comes from the run's own
    records is made once per version of them when a ``cache`` is given and the run has ended
    (a 5,000-job night's took 2 s: docs/speed.md, "At scale").

    ``jobs`` False is the HTML page's: without the records' list (the page shows the matrix and
    timings made from them), without the matrix when its HTML is kept (``RunPage.whole`` reads
    it when that is made), and on a night of more than TIMING_ROWS jobs with the per-job
    timings of target ``timings_of`` only (none without it: the page sums them per target).
    With ``jobs``, everything: the matrix, timings and records as JSON text the API writes out
    unread (decoding and encoding them again was most of a 5,000-job night's /api/run)."""
    r = db.get_run(run_id)
    if r is None:
        return None
    rerun_ids = db.reruns_of([run_id]).get(run_id, [])
    # A running run's page shows its wall time so far: made anew each time, until it ends.
    cache = cache if r.finished_at is not None else None
    key = ("run", run_id, root)
    version = db.run_version([run_id, *rerun_ids]) if cache is not None else ""
    made = cache.entry(key, version) if cache is not None else None
    if made is None:
        fresh = _run_made(db, r, rerun_ids, root)
        if cache is not None:
            cache.put(key, version, fresh)
        made = Parts(objects=fresh)
    head = made.load("page")
    if jobs:
        matrix, timings, records = made.raw("matrix"), made.raw("timings"), made.raw("jobs")
    else:
        # The matrix's HTML is kept beside a kept page; a page made anew renders it.
        matrix, records = ({} if cache is not None else made.load("matrix")), []
        timings = (made.load("timings") if sum(head["counts"].values()) <= TIMING_ROWS
                   else made.load(f"timings/{timings_of}", []) if timings_of else [])
    prev = db.runs_before(r.created_at, r.project, limit=1)
    changes, changes_error = (_changes(cfg, r.project, prev[0].rev, r.rev) if prev
                              else ([], "no earlier run of this project"))
    # Made from trusted parts: the report's own dict, just made or read back as it was kept
    # (validating 7 MB of it again would cost what keeping it saves).
    page = RunPage.model_construct(
        **head, matrix=matrix, job_timings=timings, jobs=records, perf_figures=perf.figures(db, r),
        state=r.state, parent_run_id=r.parent_run_id, previous=_run_brief(prev[0]) if prev else None, changes=changes,
        changes_error=changes_error, built=_built(cfg, r.project, r.rev),
        regressions=[triage.as_dict(g) for g in triage.listing(db, run_id=run_id)])
    page = page.with_bisections(db.bisections(origin_run_ids=[run_id]))
    page._version = version if cache is not None else None
    page._parts = made
    return page


def _run_made(db: ResultsDB, r: Run, rerun_ids: list[str], root: str) -> dict[str, Any]:
    """The parts of a run page made from the run's own records and cases: its report (links
    into the dashboard at ``root``), builds, timings per target and curves ("page"), its
    matrix ("matrix"), each job's timings ("timings", and each target's apart: "timings/<target>")
    and its records without their cases ("jobs"), as JSON."""
    # The records without their cases, which the database counts (a 5,000-job night's 200,000
    # cases made this page 5.5 s and its JSON 7 s: docs/speed.md, "At scale").
    records = db.jobs(r.run_id, cases=False)
    timings = sorted((_timing(x) for x in records), key=lambda d: (d["target"], step_key(d["step"])))
    cases = RunCases.of_run(db, r.run_id)
    reruns = [rec for rid in rerun_ids for rec in db.jobs(rid, cases=False)]
    stored = (r.notes or {}).get("verdicts")
    verdicts = ([history.CaseVerdict.from_dict(v) for v in stored] if isinstance(stored, list)
                else history.classify_run(db, r, records, cases=cases))  # not reported yet (or by an older gearfarm)
    page = report.build(r, records, DashboardLinks(root), verdicts, reruns, cases).as_dict()
    jobs = page.pop("jobs")
    matrix = page.pop("matrix")
    page.update(
        curves=_curves(records),
        builds=[{"target": x.target, "sha256": x.artifact_sha256, "manifest_sha256": x.manifest_sha256,
                 "host": x.host.get("hostname", ""), "reused": x.reused_artifact,
                 "download": f"{root}run/{r.run_id}/artifact/{x.target}/build",
                 "provenance": f"{root}run/{r.run_id}/provenance/{x.target}"}
                for x in sorted(records, key=lambda x: x.target)
                if x.kind == "build" and x.status == "passed" and x.artifact_key and x.artifact_sha256],
        target_timings=_target_timings(timings),
        timing_columns=[(k, label) for k, label in TIMING_LABELS.items() if any(k in x.timings for x in records)])
    per_target: dict[str, list[dict[str, Any]]] = {}
    for t in timings:
        per_target.setdefault(t["target"], []).append(t)
    # Each a part of its own, so a page reads only what it shows: the HTML neither the matrix
    # (its HTML is kept) nor more than one target's timings, the JSON none of them decoded.
    return {"page": page, "matrix": matrix, "timings": timings, "jobs": jobs,
            **{f"timings/{t}": rows for t, rows in per_target.items()}}


def _target_timings(timings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target, its jobs' timings summed (what a big night's page shows in place of one row
    per job): jobs, time, each stage, "other", and how many neither passed nor were skipped."""
    out: dict[str, dict[str, Any]] = {}
    for j in timings:
        # The columns every row shows, None (an empty cell) where no job of the target had any:
        # a job's "other" under 5 ms is None, and so was every job's of a quick target.
        t = out.setdefault(j["target"], {"target": j["target"], "jobs": 0, "not_passed": 0, "duration": None,
                                         "other": None})
        t["jobs"] += 1
        t["not_passed"] += j["status"] not in ("passed", "skipped")
        for k, v in j.items():
            if isinstance(v, float | int) and not isinstance(v, bool):
                t[k] = (t.get(k) or 0.0) + v
    return list(out.values())


def _curves(records: list[ResultRecord]) -> list[dict[str, Any]]:
    """Per perf job and curve, its lines: tonight's build and the baseline, one per split value."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rec in records:
        for c in rec.curves:
            entry = out.setdefault((rec.target, c.benchmark, c.title), {
                "target": rec.target, "benchmark": c.benchmark, "title": c.title, "x": c.x, "y": c.y,
                "baseline_rev": rec.baseline_rev, "lines": []})
            side = "tonight" if c.variant == "new" else f"baseline {(rec.baseline_rev or '')[:10]}"
            for key, pts in sorted(c.lines.items(), key=lambda kv: (len(kv[0]), kv[0])):
                entry["lines"].append({"name": f"{side}, {key} {c.split_name}" if key else side,
                                       "variant": c.variant, "split": key, "points": pts})
    return list(out.values())


def curve_charts(d: RunPage) -> list[tuple[dict[str, Any], str]]:
    return [(c, str(svgplot.lines([(ln["name"], ln["points"]) for ln in c["lines"]],
                                  title=f"{c['benchmark']} on {c['target']}: {c['title']}",
                                  x_label=c["x"], y_label=c["y"], css="chart curve")))
            for c in d.curves]


def _changes(cfg: Config, project: str, old: str, new: str) -> tuple[list[dict[str, Any]], str | None]:
    if old == new:
        return [], None
    try:
        repo = snapshot.local_repository(cfg, cfg.project(project))
    except ConfigError as e:  # a project no longer configured: say so on the page, never fail it
        return [], str(e)
    if repo is None:
        return [], f"the repository of {project} is not on this host"
    try:
        commits = _git_log(str(repo), old, new)
    except snapshot.SourceError as e:
        return [], str(e)
    return [{"rev": c.rev, "author": c.author, "at": c.at, "subject": c.subject} for c in commits], None


def _built(cfg: Config, project: str, rev: str) -> dict[str, Any] | None:
    """The built revision's author, time and subject, when this host has the repository."""
    try:
        repo = snapshot.local_repository(cfg, cfg.project(project))
    except ConfigError:
        return None
    if repo is None:
        return None
    try:
        c = _git_commit(str(repo), rev)
    except snapshot.SourceError:
        return None
    return {"rev": c.rev, "author": c.author, "at": c.at, "subject": c.subject}


@functools.lru_cache(maxsize=512)
def _git_commit(repo: str, rev: str) -> snapshot.Commit:
    return snapshot.commit(Path(repo), rev)  # a commit never changes: read once


@functools.lru_cache(maxsize=512)
def _git_log(repo: str, old: str, new: str) -> tuple[snapshot.Commit, ...]:
    # Revisions are immutable: the commits between two never change, so they are read once.
    return tuple(snapshot.changes(Path(repo), old, new))


def test(db: ResultsDB, name: str, project: str | None = None) -> dict[str, Any]:
    """One test across the newest TEST_RUNS runs and every target, newest first, with each
    result's verdict and how often it changed status (flakiness)."""
    rows = history.history_of(db, name, project=project, recent=TEST_RUNS)
    targets: dict[str, list[dict[str, Any]]] = {}
    for run_, target, suite, st, verdict in rows:
        targets.setdefault(f"{run_.project}:{target}", []).append({
            "run_id": run_.run_id, "project": run_.project, "rev": run_.rev, "created_at": run_.created_at,
            "target": target, "suite": suite, "status": st, "verdict": verdict})
    out = []
    for key, results in sorted(targets.items()):
        statuses = ["failed" if x["status"] in ("failed", "error") else "passed" for x in results]
        recent = statuses[-history.WINDOW:]
        fails = sum(s == "failed" for s in statuses)
        out.append({"project": key.split(":", 1)[0], "target": key.split(":", 1)[1], "runs": len(results),
                    "failures": fails, "fail_rate": fails / len(results) if results else 0.0,
                    "flips": history.flips(recent), "flaky": history.flips(recent) >= history.FLIP_LIMIT,
                    "results": list(reversed(results))})
    # The grid: a row per run, newest first, a column per target, each cell its result, time and
    # whether its status changed from the run before on that target.
    suite, _, case = name.partition("/")
    times = db.case_times(suite, case, list({r["run_id"] for t in out for r in t["results"]}))
    columns = [f"{t['project']}:{t['target']}" for t in out]
    grid: dict[str, dict[str, Any]] = {}
    for t in out:
        key = f"{t['project']}:{t['target']}"
        ordered = list(reversed(t["results"]))  # oldest first, to see each change
        for prev, r in zip([None, *ordered[:-1]], ordered, strict=True):
            row = grid.setdefault(r["run_id"], {"run_id": r["run_id"], "rev": r["rev"], "created_at": r["created_at"],
                                                "cells": {}})
            changed = prev is not None and _passing(prev["status"]) != _passing(r["status"])
            row["cells"][key] = {"status": r["status"], "verdict": r["verdict"], "changed": changed,
                                 "seconds": times.get((r["run_id"], t["target"]))}
    rows = sorted(grid.values(), key=lambda r: r["created_at"] or 0, reverse=True)
    return {"test": name, "project": project, "runs_read": TEST_RUNS, "targets": out, "columns": columns,
            "grid": rows}


def _passing(status: str) -> bool:
    return status not in ("failed", "error")


TESTS_RUNS = 30
TESTS_SHOWN = 500
# The tests page has a column per target up to this many; past it, each test's targets summed.
TESTS_COLUMNS = 16
# The most case results the page reads: whole runs, newest first, until this many (the newest
# run always whole). One read of 100,000 rows across all 30 runs, as it was, cut a 5,000-job
# night's 200,000 arbitrarily and called that the last 30 runs.
TESTS_ROWS = 100_000


def tests(db: ResultsDB, query: str | None = None, project: str | None = None,
          cache: PageCache | None = None, rows: bool = True) -> dict[str, Any]:
    """Every test of the newest runs (of ``project``: TESTS_RUNS, fewer when their cases pass
    TESTS_ROWS), those whose suite/name holds ``query`` when given: per target its last
    status, fail rate over those runs and mean time; the failing ones first. Made once per
    version of those runs when a ``cache`` is given and they have all ended (a 5,000-job
    night's 200,000 cases took 1.6 s to read and sum).

    Kept, the rows (4.5 MB of JSON on a 100-target lab) go to the API unread; without ``rows``
    (the HTML page, which keeps its table's HTML) they are not read at all, and "kept" holds
    the version and parts the table is made from."""
    newest = db.runs(limit=TESTS_RUNS, project=project)
    if cache is None or any(r.finished_at is None for r in newest):
        return _tests(db, newest, query, project)
    key, version = ("tests", query or "", project or ""), db.run_version([r.run_id for r in newest])
    made = cache.entry(key, version)
    if made is None:
        whole = _tests(db, newest, query, project)
        fresh = {"head": {k: v for k, v in whole.items() if k != "tests"}, "tests": whole["tests"]}
        cache.put(key, version, fresh)
        made = Parts(objects=fresh)
    head = made.load("head")
    if rows:
        return {**head, "tests": made.raw("tests")}
    return {**head, "kept": (version, made)}


def _tests(db: ResultsDB, newest: list[Run], query: str | None, project: str | None) -> dict[str, Any]:
    runs_, rows = [], []
    for r in newest:
        if len(rows) >= TESTS_ROWS:
            break
        runs_.append(r)
        rows += db.case_rows([r.run_id], query.strip() if query else None)
    order = {r.run_id: i for i, r in enumerate(runs_)}  # 0: the newest
    per: dict[str, dict[str, dict[str, Any]]] = {}
    targets: set[str] = set()
    for rid, target, suite, name, st, secs in rows:
        targets.add(target)
        cell = per.setdefault(f"{suite}/{name}", {}).setdefault(target, {
            "runs": 0, "failures": 0, "seconds": 0.0, "last": None, "last_at": len(order)})
        cell["runs"] += 1
        cell["failures"] += st in ("failed", "error")
        cell["seconds"] += secs or 0.0
        if order[rid] < cell["last_at"]:
            cell["last"], cell["last_at"] = st, order[rid]
    rows = []
    for test, cells in per.items():
        for c in cells.values():
            c["fail_rate"] = c["failures"] / c["runs"]
            c["mean_seconds"] = c["seconds"] / c["runs"]
            del c["last_at"], c["seconds"]
        worst = max(c["fail_rate"] for c in cells.values())
        failing_on = sorted(t for t, c in cells.items() if c["last"] in ("failed", "error"))
        rows.append({"test": test, "targets": cells, "worst_fail_rate": worst, "failing": bool(failing_on),
                     "failing_on": failing_on})
    rows.sort(key=lambda r: (not r["failing"], -r["worst_fail_rate"], r["test"]))
    return {"query": query or "", "project": project, "runs_read": len(runs_), "targets": sorted(targets),
            "tests": rows[:TESTS_SHOWN], "shown": min(len(rows), TESTS_SHOWN), "more": max(0, len(rows) - TESTS_SHOWN),
            "found": len(rows)}


def regressions(db: ResultsDB, project: str | None = None, state: str | None = None,
                kind: str | None = None) -> dict[str, Any]:
    return {"states": list(triage.STATES), "labels": triage.LABELS, "kinds": list(triage.KINDS),
            "filter": {"project": project, "state": state, "kind": kind},
            "regressions": [triage.as_dict(g) for g in triage.listing(db, project, state, kind)]}


def regression(db: ResultsDB, regression_id: int) -> dict[str, Any] | None:
    g = triage.get(db, regression_id)
    if g is None:
        return None
    return {"states": list(triage.STATES), "labels": triage.LABELS, "regression": triage.as_dict(g),
            "trail": [{"state": e.state, "who": e.who, "note": e.note, "at": e.at}
                      for e in triage.trail(db, regression_id)]}


# ------------------------------------------------------------------------------ performance

# Series measured in none of a project's last this-many runs are no longer on the index.
INDEX_RUNS = 30
SERIES_NIGHTS = 120


def perf_index(db: ResultsDB, project: str | None = None, target: str | None = None,
               benchmark: str | None = None) -> dict[str, Any]:
    """Every series measured in the newest INDEX_RUNS runs of each project (filtered by project,
    target, benchmark): its latest value with unit and direction, a sparkline of those nights,
    its last detected change and open regressions, and the machine it runs on by name."""
    runs_by_project = {p: db.runs(INDEX_RUNS, project=p) for p in ([project] if project else db.projects())}
    order = {r.run_id: (p, i) for p, rs in runs_by_project.items() for i, r in enumerate(reversed(rs))}
    latest_run = {p: rs[0] for p, rs in runs_by_project.items() if rs}
    catalogs = {p: db.catalog_of(r) for p, r in latest_run.items()}
    open_changes: dict[tuple[str, str, str], int] = {}
    last_change: dict[tuple[str, str, str], dict[str, Any]] = {}
    for g in triage.listing(db, project=project, kind="performance", limit=1000):
        key = (g.project, g.target, g.subject)
        if g.state in ("untriaged", "investigating"):
            open_changes[key] = open_changes.get(key, 0) + 1
        if key not in last_change or g.detected_at > last_change[key]["detected_at"]:
            last_change[key] = {"detected_at": g.detected_at, "change": (g.detail or {}).get("change"),
                                "first_bad_run": g.first_bad_run, "id": g.id, "state": g.state}
    nights: dict[tuple[str, str, str, str, str], dict[int, list[float]]] = {}
    for rid, t, hc, b, m, v in db.new_values(order):
        p, i = order[rid]
        nights.setdefault((p, t, hc, b, m), {}).setdefault(i, []).append(v)
    machines = _machine_names(db)
    series = []
    all_targets, all_benchmarks = set(), set()
    for (p, t, hc, b, m), by_night in sorted(nights.items()):
        all_targets.add(t)
        all_benchmarks.add(b)
        if (target and t != target) or (benchmark and b != benchmark):
            continue
        bench = catalogs[p].benchmarks.get(b) if catalogs.get(p) is not None else None
        values = [statistics.median(by_night[i]) if i in by_night else None for i in range(len(runs_by_project[p]))]
        subject = triage.perf_subject(b, m, hc)
        latest = next((v for v in reversed(values) if v is not None), None)
        series.append({"project": p, "target": t, "host_class": hc, "machine": machines.get(hc, hc or "unnamed"),
                       "benchmark": b, "metric": m, "latest": latest,
                       "unit": bench.units.get(m, "") if bench else "",
                       "higher_is_better": (bench.metrics.get(m, "higher") == "higher") if bench else True,
                       "trend": values, "open": open_changes.get((p, t, subject), 0),
                       "last_change": last_change.get((p, t, subject))})
    return {"project": project, "target": target, "benchmark": benchmark, "series": series,
            "projects": sorted(runs_by_project), "targets": sorted(all_targets), "benchmarks": sorted(all_benchmarks),
            "nights": INDEX_RUNS}


def _machine_names(db: ResultsDB) -> dict[str, str]:
    """Host class -> the machine as people name it (CPU and cores, and how many hosts share it),
    from the hosts' fingerprints: a class is the hash of what makes figures comparable."""
    seen: dict[str, list[Any]] = {}
    for h in db.hosts():
        if h.host_class:
            seen.setdefault(h.host_class, []).append(h)
    out = {}
    for cls, hosts_ in seen.items():
        h = hosts_[-1]
        what = h.cpu_model or h.machine or "a machine"
        if h.cores:
            what += f", {h.cores} cores"
        names = sorted({x.hostname for x in hosts_})
        out[cls] = f"{what} ({', '.join(names[:3])}{' …' if len(names) > 3 else ''})"
    return out


def _tip(run_id: str, rev: str, at: float | None, value: float | None, extra: str = "") -> str:
    when = time.strftime("%Y-%m-%d", time.gmtime(at)) if at else ""
    v = f"{value:.4g}" if value is not None else "no value"
    return f"{run_id} ({when})\nrev {rev[:12]}\n{v}{extra}"


def perf_series(db: ResultsDB, project: str, target: str, host_class: str, benchmark: str, metric: str,
                nights: int = SERIES_NIGHTS, root: str = "/") -> dict[str, Any]:
    """One series: per night the median of tonight's build and the range of its runs, the A/B
    estimate against the last good build with its 95 % interval, the changes detected in it
    (with their triage) and the changes annotated as expected."""
    rows = db.perf_series(project, target, host_class, benchmark, metric, time.time(), nights)
    when = db.run_times(rid for rid, _, _ in rows)
    latest = db.get_run(rows[-1][0]) if rows else None
    higher = perf.directions(db, latest).get((benchmark, metric), True) if latest is not None else True
    cat = db.catalog_of(latest) if latest is not None else None
    bench = cat.benchmarks.get(benchmark) if cat is not None else None
    points = []
    for i, (rid, rev, values) in enumerate(rows):
        new = values.get("new", [])
        night = Paired.of(values.get("ratio", []))
        ref = Paired.of(values.get("ref_ratio", []))
        ci = night.interval() if night.k else None
        points.append({
            "index": i, "run_id": rid, "rev": rev, "created_at": when.get(rid),
            "value": statistics.median(new) if new else None, "runs": len(new),
            "low": min(new) if new else None, "high": max(new) if new else None,
            "pairs": night.k, "ab_change": math.expm1(night.mean) if night.k else None,
            "ab_low": ci[0] if ci else None, "ab_high": ci[1] if ci else None,
            # Against the target's pinned reference build (gearfarm.perf.analysis), when it ran one.
            "ref_change": math.expm1(ref.mean) if ref.k else None})
    at = {p["run_id"]: p["index"] for p in points}
    by_rev = {p["rev"]: p["index"] for p in points}
    changes = [triage.as_dict(g) for g in triage.listing(
        db, project=project, kind="performance", subject=triage.perf_subject(benchmark, metric, host_class),
        target=target, limit=1000)]
    changes = [dict(c, index=at.get(c["first_bad_run"], by_rev.get(c["first_bad_rev"]))) for c in changes]
    expected = db.expected_changes().get((benchmark, metric, target), set())
    annotations = [{"rev": rev, "index": by_rev[rev]} for rev in sorted(expected) if rev in by_rev]
    return {"project": project, "target": target, "host_class": host_class, "benchmark": benchmark,
            "metric": metric, "higher_is_better": higher, "nights": points, "changes": changes,
            "annotations": annotations, "root": root, "unit": bench.units.get(metric, "") if bench else "",
            "machine": _machine_names(db).get(host_class, host_class)}


def series_charts(d: dict[str, Any]) -> tuple[str, str]:
    """The two charts of a series page as SVG: the nightly values, and the A/B estimates."""
    pts = d["nights"]
    labels = [(p["index"], time.strftime("%m-%d", time.gmtime(p["created_at"])))
              for p in pts[:: max(1, len(pts) // 8)] if p["created_at"]]
    marks = [svgplot.Mark(c["index"] - 0.5, f"#{c['id']} {c['detail'].get('direction', 'change')} "
                          f"{(c['detail'].get('change') or 0) * 100:+.1f} % ({c['state_label']})",
                          c["detail"].get("direction", "change"))
             for c in d["changes"] if c["index"] is not None]
    marks += [svgplot.Mark(a["index"] - 0.5, f"expected at {a['rev'][:10]}", "expected") for a in d["annotations"]]
    root = d["root"]
    values = [svgplot.Point(p["index"], p["value"], _tip(p["run_id"], p["rev"], p["created_at"], p["value"],
                                                          f" (median of {p['runs']})"),
                            p["low"], p["high"], f"{root}run/{p['run_id']}") for p in pts]
    direction = "higher is better" if d["higher_is_better"] else "lower is better"
    top = svgplot.chart(values, marks, title=f"{d['benchmark']} {d['metric']} on {d['target']} ({direction})",
                        y_label=f"{d['metric']} ({d['unit']})" if d.get("unit") else d["metric"], x_labels=labels,
                        css="chart series")
    if not any(p["ab_change"] is not None for p in pts):
        # No night has pairs yet (the first night has no last good build): no chart of nothing.
        return str(top), ""
    ab = [svgplot.Point(p["index"], None if p["ab_change"] is None else p["ab_change"] * 100,
                        _tip(p["run_id"], p["rev"], p["created_at"], None if p["ab_change"] is None
                             else p["ab_change"] * 100,
                             f" % against the last good build ({counted(p['pairs'], 'pair')}"
                             + (f", 95 % CI {p['ab_low'] * 100:+.1f} … {p['ab_high'] * 100:+.1f} %)"
                                if p["ab_low"] is not None else ")")),
                        None if p["ab_low"] is None else p["ab_low"] * 100,
                        None if p["ab_high"] is None else p["ab_high"] * 100, f"{root}run/{p['run_id']}")
          for p in pts]
    bottom = svgplot.chart(ab, marks, title="A/B: tonight's build against the last good build, % (95 % CI)",
                           y_label="%", reference=0.0, x_labels=labels, css="chart ab", connect=False)
    return str(top), str(bottom)


# A job's timings as the run page shows them, in the order they happen; a stage no job of the
# run has is not shown at all.
TIMING_LABELS = {"queue_wait": "queued", "admit": "admitted (checks, claim)", "host_wait": "waiting for the host",
                 "lookup": "artifact lookup",
                 "source": "source", "download": "download", "verify": "verify", "build": "build",
                 "upload": "upload", "test": "test", "cpu": "CPU"}
# The stages inside a job's clock (started_at to finished_at); the rest of it is "other".
_CLOCKED = ("lookup", "source", "download", "verify", "build", "upload", "test")


def _timing(rec: ResultRecord) -> dict[str, Any]:
    clocked = sum(v for k, v in rec.timings.items() if k in _CLOCKED)
    other = rec.duration - clocked if rec.duration is not None else None
    return {"target": rec.target, "step": rec.step, "status": rec.status, "duration": rec.duration,
            "host": rec.host.get("hostname", "") or rec.worker, "other": other if other and other > 0.005 else None,
            **rec.timings}


def compare(db: ResultsDB, a: str | None, b: str | None, choices: int = 30,
            cache: PageCache | None = None) -> dict[str, Any] | None:
    """Two runs side by side (like LNT's run comparison): every figure both measured with B's
    change from A, its 95 % interval and a verdict (same, different, not enough data:
    gearfarm.perf.compare.between); the tests whose status differs; the jobs' durations. Runs are
    named by id or by a revision (its latest run). With a run missing: the runs to pick from,
    B the latest and A the run of B's project before it. Two ended runs are compared once per
    version of their records when a ``cache`` is given (two 5,000-job nights' 400,000 cases
    joined took most of a second)."""
    recent = [_run_brief(r) for r in db.runs(limit=choices)]
    rb = _named_run(db, b) if b else (db.get_run(recent[0]["run_id"]) if recent else None)
    if b and rb is None:
        return None
    if a:
        ra = _named_run(db, a)
        if ra is None:
            return None
    else:
        before = db.runs_before(rb.created_at, rb.project, limit=1) if rb is not None else []
        ra = before[0] if before else None
    picked = {"choices": recent, "a": _run_brief(ra) if ra else None, "b": _run_brief(rb) if rb else None}
    if ra is None or rb is None or not (a and b):
        return {**picked, "figures": [], "tests": [], "jobs": [], "picking": True}
    if cache is None or ra.finished_at is None or rb.finished_at is None:
        return {**picked, **_compared(db, ra, rb)}
    key, version = ("compare", ra.run_id, rb.run_id), db.run_version([ra.run_id]) + db.run_version([rb.run_id])
    made = cache.get(key, version, ("compared",))
    if made is None:
        made = {"compared": _compared(db, ra, rb)}
        cache.put(key, version, made)
    return {**picked, **made["compared"]}


def _compared(db: ResultsDB, ra: Run, rb: Run) -> dict[str, Any]:
    """What compare shows of two runs: figures, tests and jobs, and the summary of verdicts."""
    # The builds (their binaries) and benchmarks (their figures) as records; every job's status
    # and times from its row: a 5,000-job night's records took a second to read.
    ja = {(r.target, r.step): r for r in db.jobs(ra.run_id, cases=False, kinds=("build", "perf"))}
    jb = {(r.target, r.step): r for r in db.jobs(rb.run_id, cases=False, kinds=("build", "perf"))}
    cells = {rid: {(t, step): (st, f - s if s is not None and f is not None else None)
                   for _r, t, step, st, s, f in db.job_cells([rid])} for rid in (ra.run_id, rb.run_id)}
    ka, kb = cells[ra.run_id], cells[rb.run_id]
    sa, sb = _new_samples(ja.values()), _new_samples(jb.values())
    higher = {**perf.directions(db, ra), **perf.directions(db, rb)}
    figures = []
    measured = sorted(set(sa) | set(sb))
    judgements = judge.between_all([(sa.get(k, []), sb.get(k, [])) for k in measured])
    for (target, benchmark, metric), judged in zip(measured, judgements, strict=True):
        va, vb = sa.get((target, benchmark, metric), []), sb.get((target, benchmark, metric), [])
        same_binary = ra.run_id == rb.run_id or (_binary(ja, target) is not None
                                                 and _binary(ja, target) == _binary(jb, target))
        # The same binary on both sides: whatever moved is the host, not the code (as LNT does).
        verdict = "same" if same_binary and va and vb else judged.verdict
        up = higher.get((benchmark, metric), True)
        figures.append({"target": target, "benchmark": benchmark, "metric": metric,
                        "a": statistics.median(va) if va else None, "b": statistics.median(vb) if vb else None,
                        "a_runs": len(va), "b_runs": len(vb), "change": judged.change, "ci_low": judged.ci_low,
                        "ci_high": judged.ci_high, "p_value": judged.p_value, "verdict": verdict,
                        "same_binary": same_binary, "higher_is_better": up,
                        "better": None if verdict != "different" or judged.change is None
                        else (judged.change > 0) == up})
    tests = [{"target": t, "test": f"{s}/{n}", "a": st_a, "b": st_b}
             for t, s, n, st_a, st_b in sorted(db.case_changes(ra.run_id, rb.run_id), key=lambda c: c[:3])]
    jobs = [{"target": k[0], "step": k[1], "a_status": ka[k][0] if k in ka else None,
             "b_status": kb[k][0] if k in kb else None,
             "a_seconds": ka[k][1] if k in ka else None, "b_seconds": kb[k][1] if k in kb else None}
            for k in sorted(set(ka) | set(kb), key=lambda k: (k[0], step_key(k[1])))]
    verdicts = [f["verdict"] for f in figures]
    return {"figures": figures, "tests": tests, "jobs": jobs, "jobs_shown": _jobs_shown(jobs), "picking": False,
            "summary": {v: verdicts.count(v) for v in ("different", "same", "not enough data")}}


def _jobs_shown(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs compare's page lists: every one up to TIMING_ROWS; past it, those whose status
    differs and the TIMING_ROWS // 10 whose time changed most (the JSON has every job)."""
    if len(jobs) <= TIMING_ROWS:
        return jobs
    timed = [j for j in jobs if j["a_seconds"] is not None and j["b_seconds"] is not None]
    moved = {id(j) for j in sorted(timed, key=lambda j: -abs(j["b_seconds"] - j["a_seconds"]))[:TIMING_ROWS // 10]}
    return [j for j in jobs if j["a_status"] != j["b_status"] or id(j) in moved]


def _named_run(db: ResultsDB, name: str) -> Run | None:
    """A run by its id, else the latest run at a revision that starts with ``name`` (7+ hex)."""
    run = db.get_run(name)
    if run is None and len(name) >= 7 and all(c in "0123456789abcdef" for c in name.lower()):
        run = db.latest_run_at(name.lower())
    return run


def _new_samples(records: Iterable[ResultRecord]) -> dict[tuple[str, str, str], list[float]]:
    out: dict[tuple[str, str, str], list[float]] = {}
    for rec in records:
        if rec.kind == "perf":
            for s in rec.samples:
                if s.variant == "new":
                    out.setdefault((rec.target, s.benchmark, s.metric), []).append(s.value)
    return out


def _binary(jobs: dict[tuple[str, str], ResultRecord], target: str) -> str | None:
    build = jobs.get((target, "build"))
    return build.artifact_sha256 if build is not None and build.status == "passed" else None


# ------------------------------------------------------------------------------------ a step's log

# ANSI escape sequences (colours, cursor moves) and the other C0 controls but tab: a log is shown
# as the text it says, never as the terminal it drove.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|[\x00-\x08\x0b-\x1f\x7f]")
_DROPPED = re.compile(r"^\*\*\* \d+ bytes of output dropped here \(log capped at ")
# A log longer than this many lines is shown to that line, with the rest a download away.
LOG_LINES = 50_000


def step_log(db: ResultsDB, run_id: str, target: str, step: str, text: str | None,
             refused: str = "") -> dict[str, Any] | None:
    """A step's log as a page: the step's record (status, host, duration, attempt, message), the
    commands it ran (the log's `$ ` lines), its lines numbered, where its output was capped, and
    the run's other steps on the same target. None when the run has neither a record of the step
    nor its log. ``refused``: why the log found is not shown (gearfarm.report.joblog.Altered)."""
    run = db.get_run(run_id)
    if run is None:
        return None
    records = db.jobs(run_id, target)  # the target's only: a big night's are thousands, with their cases
    rec = next((r for r in records if r.step == step), None)
    if rec is None and text is None and not refused:
        return None
    lines = _ANSI.sub("", text).split("\n") if text is not None else []
    if lines and lines[-1] == "":
        lines.pop()
    shown = lines[:LOG_LINES]
    return {
        "run": _run_brief(run), "target": target, "step": step,
        "record": None if rec is None else {
            "status": rec.status, "host": rec.host.get("hostname", ""), "worker": rec.worker,
            "attempt": rec.attempt, "duration": rec.duration, "started_at": rec.started_at,
            "finished_at": rec.finished_at, "message": rec.message},
        "commands": [(n, line[2:]) for n, line in enumerate(shown, 1) if line.startswith("$ ")],
        "capped": [n for n, line in enumerate(shown, 1) if _DROPPED.match(line)],
        "lines": shown, "more_lines": len(lines) - len(shown), "has_log": text is not None, "refused": refused,
        # A record from before files were bound to records gives no sha256: its log is shown unchecked.
        "unchecked": text is not None and rec is not None and "log.txt" not in rec.file_sums,
        "siblings": [{"step": r.step, "status": r.status}
                     for r in sorted(records, key=lambda r: step_key(r.step)) if r.step != step]}


# ------------------------------------------------------------------------------------ live

def gearmand(cfg: Config, timeout: float = 2.0) -> list[dict[str, Any]]:
    """Each job server's queues and workers per function (its admin protocol), or why not."""
    out = []
    for host, port in cfg.gearman.addresses():
        try:
            fns = admin.status(host, port, ssl_context=ssl_context(cfg), timeout=timeout)
            workers = admin.workers(host, port, ssl_context=ssl_context(cfg), timeout=timeout)
        except (OSError, GearmanError) as e:
            out.append({"server": f"{host}:{port}", "ok": False, "error": f"{e} (is the farm running?)",
                        "functions": []})
            continue
        # Who serves each function, in one pass over the workers: asked per function, it was
        # functions × workers × their functions (128 slots of 100 targets: 1.3 million looks).
        serving: dict[str, set[str]] = {}
        for w in workers:
            for fn in w.functions:
                serving.setdefault(fn, set()).add(w.client_id)
        out.append({"server": f"{host}:{port}", "ok": True, "error": None, "functions": [
            {"function": fn, "queued": st.queued, "running": st.running, "workers": st.workers,
             "worker_ids": sorted(serving.get(fn, ()))}
            for fn, st in sorted(fns.items())]})
    return out


def live(db: ResultsDB, cfg: Config) -> dict[str, Any]:
    """gearmand's queues and workers, and every run in progress with each job's state: its
    result when it has one, else what the nightly last saw (waiting for its build, queued,
    running) and since when, else pending."""
    runs_ = db.running_runs()
    done: dict[str, str] = {}
    for rid, target, step, st, _s, _f in db.job_cells([r.run_id for r in runs_]):
        done[f"{rid}:{target}:{step}"] = st
    seen = db.live(r.run_id for r in runs_)
    cancels = {r.run_id: db.cancellations(r.run_id) for r in runs_}
    out = []
    for r in runs_:
        jobs = []
        for jid in sorted(r.expected or [], key=lambda j: (j.split(":")[1], step_key(j.split(":")[2]))):
            _rid, target, step = jid.split(":")
            lj = seen.get(jid)
            state = done.get(jid) or (lj.state if lj else "pending")
            jobs.append({"job_id": jid, "target": target, "step": step, "state": state,
                         "attempt": lj.attempt if lj else 1, "since": lj.since if lj else None,
                         "finished": jid in done})
        out.append({**_run_brief(r), "jobs": jobs, "done": sum(j["finished"] for j in jobs),
                    "cancelled_by": [{"job_id": c.job_id, "who": c.who, "at": c.at} for c in cancels[r.run_id]]})
    return {"gearmand": gearmand(cfg), "runs": out, "generated_at": time.time()}


# A lease whose host has not beaten for this long is not shown as running: the worker beats
# every few seconds while it holds the job (gearfarm.formats.lease).
LEASE_FRESH = 120.0
HOST_NIGHTS = 14


def hosts(db: ResultsDB, cfg: Config, now: float | None = None) -> dict[str, Any]:
    """Every host that served the farm or may: its registered key (roles, targets, key id: the
    identity its records are signed with), its machine as last fingerprinted, when it was last
    seen, the workers it has connected to gearmand now with the functions they serve and the
    job each is running, and its jobs and infra failures over the last nights."""
    from gearfarm.db.registry import Registry

    now = time.time() if now is None else now
    names: dict[str, dict[str, Any]] = {}

    def host(name: str) -> dict[str, Any]:
        return names.setdefault(name, {"host": name, "keys": [], "certificates": [], "machine": None,
                                       "first_seen": None, "last_seen": None, "workers": [], "jobs": {}, "total": 0,
                                       "infra": 0})

    for e in Registry(db).entries():
        host(e.host)["keys"].append({"kid": e.kid, "roles": list(e.roles), "targets": list(e.targets),
                                     "added_at": e.added_at, "revoked_at": e.revoked_at})
    for m in db.hosts():  # oldest first: the newest fingerprint of a name wins
        h = host(m.hostname)
        h["machine"] = {"class": m.host_class, "cpu": m.cpu_model, "cores": m.cores, "memory_gib": m.memory_gib,
                        "kernel": m.kernel, "machine": m.machine}
        h["first_seen"] = min(x for x in (h["first_seen"], m.first_seen) if x is not None)
        h["last_seen"] = max(x for x in (h["last_seen"], m.last_seen) if x is not None)
    recent = db.runs(limit=HOST_NIGHTS)
    for name, status, n in db.host_jobs([r.run_id for r in recent]):
        h = host(name)
        h["jobs"][status] = h["jobs"].get(status, 0) + n
        h["total"] += n
        h["infra"] += n if status == "infra" else 0
    running: dict[str, list[dict[str, Any]]] = {}
    for lease in db.open_leases():
        if now - lease.beat_at > LEASE_FRESH:
            continue
        h = host(lease.host)
        h["last_seen"] = max(x for x in (h["last_seen"], lease.beat_at) if x is not None)
        running.setdefault(lease.host, []).append({"job_id": lease.job_id, "worker": lease.worker,
                                                   "since": lease.claimed_at, "step": _job_step(lease.job_id)})
    certs, cert_note = _certificates(cfg)
    for name, issued in certs.items():
        host(name)["certificates"] = issued
    connected, unreachable = _workers(cfg)
    for w in connected:
        jobs = [j for j in running.get(w["host"], []) if _same_worker(j["worker"], w["worker"])]
        host(w["host"])["workers"].append({**w, "running": jobs})
    for name, jobs in running.items():  # a job whose worker gearmand does not list (it may be away)
        listed = {id(j) for w in names[name]["workers"] for j in w["running"]}
        for j in jobs:
            if id(j) not in listed:
                names[name]["workers"].append({"worker": j["worker"], "host": name, "roles": [], "targets": [],
                                               "running": [j], "connected": False})
    return {"hosts": sorted(names.values(), key=lambda h: h["host"]), "nights": len(recent),
            "unreachable": unreachable, "certificates_note": cert_note, "generated_at": now}


def _certificates(cfg: Config) -> tuple[dict[str, list[dict[str, Any]]], str | None]:
    """Each host's TLS identity: the client certificates the farm CA issued in its name (the
    common name stunnel admits it by), from the CA's index beside ``[gearman] tls_ca``; and,
    when that index cannot be read here, why (a dashboard on a host without the CA)."""
    if not cfg.gearman.tls_ca:
        return {}, None  # a farm without TLS: no identity but the signing key
    ca_dir = Path(cfg.gearman.tls_ca).parent
    try:
        issued = tls.issued(ca_dir)
    except (OSError, tls.TLSError) as e:
        return {}, f"The farm CA's index of certificates could not be read ({e})."
    if not issued and not (ca_dir / tls.INDEX_FILE).exists():
        return {}, (f"No index of the farm CA's certificates beside {cfg.gearman.tls_ca}: run the dashboard "
                    "where 'gearfarm tls' keeps the CA to see each host's certificate.")
    out: dict[str, list[dict[str, Any]]] = {}
    for c in issued:
        if c.kind == "client":
            out.setdefault(c.name, []).append({"common_name": c.name, "serial": f"{c.serial:x}",
                                               "not_after": c.not_after, "revoked": c.revoked or None})
    return out, None


def _job_step(job_id: str) -> dict[str, str] | None:
    try:
        jid = JobId.parse(job_id)
    except ValueError:
        return None
    return {"run_id": jid.run_id, "target": jid.target, "step": jid.step}


def _same_worker(lease_worker: str, client_id: str) -> bool:
    """A lease names one role's worker (host-build-PID), gearmand the process's connection
    (host-build+test-PID): the same process when host and PID agree."""
    lw, cw = lease_worker.rsplit("-", 2), client_id.rsplit("-", 2)
    return len(lw) == 3 and len(cw) == 3 and lw[0] == cw[0] and lw[2] == cw[2]


def _workers(cfg: Config, timeout: float = 2.0) -> tuple[list[dict[str, Any]], list[str]]:
    """The workers (not plain clients) connected to the job servers: name, host, roles,
    targets; and the job servers that did not answer, each with why."""
    rows: list[dict[str, Any]] = []
    unreachable = []
    for address in cfg.gearman.addresses():
        try:
            listed = admin.workers(*address, ssl_context=ssl_context(cfg), timeout=timeout)
        except (OSError, GearmanError) as e:
            unreachable.append(f"gearmand at {address[0]}:{address[1]}: {e} (is the farm running?)")
            continue
        for w in listed:
            fns = [f for f in w.functions if ":" in f]
            if not fns:
                continue
            parts = w.client_id.rsplit("-", 2)
            rows.append({"worker": w.client_id, "host": parts[0] if len(parts) == 3 else w.client_id,
                         "roles": sorted({f.split(":", 1)[0] for f in fns}),
                         "targets": sorted({f.split(":", 1)[1] for f in fns}), "connected": True})
    return rows, unreachable


def farm_down(cfg: Config) -> str | None:
    """Why a self-service run cannot start now: the farm's gearmand or S3 does not answer
    (the embedded farm's stop with its nightly unless it ran with --keep), saying how to start
    them; None when both answer."""
    down = reach.check(cfg)
    return None if down is None else f"Runs started here need the farm running: {down}."


def submit_form(db: ResultsDB, cfg: Config) -> dict[str, Any]:
    """What a self-service run can choose, per configured project: the targets, suites and
    benchmarks of the catalog its newest run was planned from (the run itself re-reads the
    catalog at the chosen revision and refuses names it does not have); and, when the farm is
    not running, why no run can start."""
    projects = []
    for p in cfg.project_list():
        newest = db.runs(1, project=p.name)
        cat = db.catalog_of(newest[0]) if newest else None
        projects.append({"project": p.name, "branch": p.branch,
                         "targets": sorted(cat.targets) if cat else [], "suites": sorted(cat.suites) if cat else [],
                         "benchmarks": sorted(cat.benchmarks) if cat else []})
    return {"projects": projects, "farm_down": farm_down(cfg)}
