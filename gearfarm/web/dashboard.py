"""What each dashboard page shows, as plain data: the web layer (gearfarm.web.app) renders these
dicts as HTML and serves them unchanged as JSON under /api/, so the page and its API can never
disagree. Everything here reads the results database (and the project's repository for change
sets); nothing here knows about HTTP."""

from __future__ import annotations

import functools
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

from gearfarm.config import Config, ConfigError
from gearfarm.db import history, triage
from gearfarm.db.results import ResultsDB, Run
from gearfarm.formats.job import JobId
from gearfarm.formats.result import PRODUCT_FAILURES, ResultRecord
from gearfarm.formats.words import counted
from gearfarm.gearman import GearmanError, admin
from gearfarm.hosts import reach
from gearfarm.hosts.connection import ssl_context
from gearfarm.perf import analysis as perf
from gearfarm.perf.pairs import Paired
from gearfarm.report import document as report
from gearfarm.report.links import DashboardLinks
from gearfarm.run import snapshot
from gearfarm.web import svgplot

log = logging.getLogger(__name__)

NIGHTS = 10
# A test's page reads this many of the newest runs.
TEST_RUNS = 200
# Worst first: the state a target shows for a run is the worst of its jobs'.
SEVERITY = ("failed", "infra", "cancelled", "running", "missing", "passed")


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


def status(db: ResultsDB, nights: int = NIGHTS) -> dict[str, Any]:
    """Projects × targets for each project's latest nightly, and the last ``nights`` per target."""
    projects = []
    for project in db.projects():
        runs = db.runs(limit=nights, project=project)  # newest first
        if not runs:
            continue
        cells: dict[tuple[str, str], dict[str, str]] = {}
        for rid, target, step, st, _s, _f in db.job_cells([r.run_id for r in runs]):
            cells.setdefault((rid, target), {})[step] = st
        targets: list[str] = []
        for r in runs:
            targets += [t for t in r.targets or [] if t not in targets]
        rows = []
        for t in targets:
            strip = []
            for r in reversed(runs):
                if t not in (r.targets or []):
                    continue
                state, stage = target_state(cells.get((r.run_id, t), {}), _expected_steps(r).get(t, []),
                                            r.state == "running")
                strip.append({"run_id": r.run_id, "rev": r.rev, "created_at": r.created_at, "state": state,
                              "stage": stage})
            latest = strip[-1] if strip else None
            rows.append({"target": t, "latest": latest, "strip": strip})
        projects.append({"project": project, "latest": _run_brief(runs[0]), "targets": rows})
    return {"generated_at": time.time(), "nights": nights, "projects": projects}


def runs(db: ResultsDB, project: str | None = None, limit: int = 100) -> dict[str, Any]:
    out = []
    rows = db.runs(limit=limit, project=project)
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for rid, target, step, st, _s, _f in db.job_cells([r.run_id for r in rows]):
        cells.setdefault((rid, target), {})[step] = st
    for r in rows:
        exp = _expected_steps(r)
        states = [target_state(cells.get((r.run_id, t), {}), exp.get(t, []), r.state == "running")[0]
                  for t in r.targets or []]
        worst = min(states, key=SEVERITY.index) if states else "missing"
        out.append({**_run_brief(r), "targets": r.targets, "result": worst})
    return {"project": project, "runs": out}


class RunPage(report.Report):
    """A run on the dashboard: its report, with links into the dashboard, and what only the
    dashboard shows beside it."""

    state: str
    parent_run_id: str | None
    previous: dict[str, Any] | None
    changes: list[dict[str, Any]]
    changes_error: str | None
    regressions: list[dict[str, Any]]
    curves: list[dict[str, Any]]
    builds: list[dict[str, Any]]
    job_timings: list[dict[str, Any]]


def run(db: ResultsDB, cfg: Config, run_id: str, root: str = "/") -> RunPage | None:
    """One run: the report's matrix, failures and classification with links into the
    dashboard, the change set since the previous run of its project, the night's performance
    figures and what it was the first to show (its regressions)."""
    r = db.get_run(run_id)
    if r is None:
        return None
    records = db.jobs(run_id)
    reruns = [rec for rid in db.reruns_of([run_id]).get(run_id, []) for rec in db.jobs(rid)]
    stored = (r.notes or {}).get("verdicts")
    verdicts = ([history.CaseVerdict.from_dict(v) for v in stored] if isinstance(stored, list)
                else history.classify_run(db, r, records))  # not reported yet (or by an older gearfarm)
    rep = report.build(r, records, DashboardLinks(root), verdicts, reruns)
    prev = db.runs_before(r.created_at, r.project, limit=1)
    changes, changes_error = (_changes(cfg, r.project, prev[0].rev, r.rev) if prev
                              else ([], "no earlier run of this project"))
    return RunPage(
        **rep.with_bisections(db.bisections(origin_run_ids=[run_id])).as_dict(),
        perf_figures=perf.figures(db, r, records), state=r.state, parent_run_id=r.parent_run_id,
        previous=_run_brief(prev[0]) if prev else None, changes=changes, changes_error=changes_error,
        regressions=[triage.as_dict(g) for g in triage.listing(db, run_id=run_id)], curves=_curves(records),
        builds=[{"target": x.target, "sha256": x.artifact_sha256, "manifest_sha256": x.manifest_sha256,
                 "host": x.host.get("hostname", ""), "reused": x.reused_artifact,
                 "download": f"{root}run/{run_id}/artifact/{x.target}/build",
                 "provenance": f"{root}run/{run_id}/provenance/{x.target}"}
                for x in sorted(records, key=lambda x: x.target)
                if x.kind == "build" and x.status == "passed" and x.artifact_key and x.artifact_sha256],
        job_timings=sorted(({"target": x.target, "step": x.step, "status": x.status,
                             "duration": x.duration, **x.timings} for x in records),
                           key=lambda d: (d["target"], step_key(d["step"]))))


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
    return {"test": name, "project": project, "runs_read": TEST_RUNS, "targets": out}


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


def perf_index(db: ResultsDB, project: str | None = None) -> dict[str, Any]:
    """Every series measured lately, grouped by project, with its open regressions."""
    run_ids = [r.run_id for p in ([project] if project else db.projects()) for r in db.runs(INDEX_RUNS, project=p)]
    open_changes: dict[tuple[str, str, str], int] = {}
    for g in triage.listing(db, project=project, kind="performance", limit=1000):
        if g.state in ("untriaged", "investigating"):
            key = (g.project, g.target, g.subject)
            open_changes[key] = open_changes.get(key, 0) + 1
    series = [{"project": p, "target": t, "host_class": hc, "benchmark": b, "metric": m,
               "open": open_changes.get((p, t, triage.perf_subject(b, m, hc)), 0)}
              for p, t, hc, b, m in db.series_keys(run_ids)]
    return {"project": project, "series": series}


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
            "annotations": annotations, "root": root}


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
                        y_label=d["metric"], x_labels=labels, css="chart series")
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


def compare(db: ResultsDB, a: str, b: str) -> dict[str, Any] | None:
    """Two runs side by side (like LNT's run comparison): every figure both measured with the
    change from A to B, the tests whose status differs, and the jobs' durations."""
    ra, rb = db.get_run(a), db.get_run(b)
    if ra is None or rb is None:
        return None
    ja = {(r.target, r.step): r for r in db.jobs(a)}
    jb = {(r.target, r.step): r for r in db.jobs(b)}
    fa = {(f["target"], f["benchmark"], f["metric"]): f for f in perf.figures(db, ra, list(ja.values()))}
    fb = {(f["target"], f["benchmark"], f["metric"]): f for f in perf.figures(db, rb, list(jb.values()))}
    figures = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = (fa.get(key) or {}).get("value"), (fb.get(key) or {}).get("value")
        higher = (fb.get(key) or fa.get(key) or {}).get("higher_is_better", True)
        change = vb / va - 1 if va and vb is not None else None
        better = None if change is None else (change > 0) == higher
        figures.append({"target": key[0], "benchmark": key[1], "metric": key[2], "a": va, "b": vb,
                        "change": change, "better": better})
    sa = {(t, s, n): st for _r, t, s, n, st in db.cases_in([a])}
    sb = {(t, s, n): st for _r, t, s, n, st in db.cases_in([b])}
    tests = [{"target": t, "test": f"{s}/{n}", "a": sa.get((t, s, n)), "b": sb.get((t, s, n))}
             for (t, s, n) in sorted(set(sa) | set(sb)) if sa.get((t, s, n)) != sb.get((t, s, n))]
    jobs = [{"target": k[0], "step": k[1], "a_status": ja[k].status if k in ja else None,
             "b_status": jb[k].status if k in jb else None,
             "a_seconds": ja[k].duration if k in ja else None, "b_seconds": jb[k].duration if k in jb else None}
            for k in sorted(set(ja) | set(jb), key=lambda k: (k[0], step_key(k[1])))]
    return {"a": _run_brief(ra), "b": _run_brief(rb), "figures": figures, "tests": tests, "jobs": jobs}


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
        out.append({"server": f"{host}:{port}", "ok": True, "error": None, "functions": [
            {"function": fn, "queued": st.queued, "running": st.running, "workers": st.workers,
             "worker_ids": sorted({w.client_id for w in workers if fn in w.functions})}
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
