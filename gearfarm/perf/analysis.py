"""Performance analysis of a run: the series of every (benchmark, metric, target, host class)
it measured, their change points, and the report's performance section with plots. Figures are
compared only within one project and one host class; a night's series value is the median of
its runs of tonight's build, and its figure the paired estimate against the last good build
(pairs of runs interleaved on one host) with its interval; whether higher is better comes from
the catalog stored with the run."""

from __future__ import annotations

import base64
import dataclasses
import math
import statistics
from typing import TYPE_CHECKING, Any

from gearfarm.db.results import ResultsDB, Run
from gearfarm.formats.job import step_name
from gearfarm.formats.result import ResultRecord
from gearfarm.perf.pairs import Paired, paired_test

if TYPE_CHECKING:
    from gearfarm.perf.changepoint import RevisionChange

# The change-point detector (scipy) and the plots (matplotlib) are imported where a series is
# analysed: a run with no benchmarks never needs them, and `gearfarm report RUN` of such a run
# took twice as long loading them (the nightly loads them early, gearfarm.night.sequence).

WINDOW = 60
# A night's own A/B test must be this sure to alarm: strict, because it judges one night
# without the series' support, every night, for every metric, and its alarms add to the
# change-point detector's (which reads the same pairs' ratio already). Measured on
# bench/otava_compare.py with each night's 5 pairs judged as here (seeds 6/7/8, 40 step-free
# series of 70 nights per kind and noise): at 0.001 it raised 2-10 false alarms per 40 series
# on its own, and the farm's alarms dominated Otava in 49 of 96 rows (the detector alone: 81);
# at 1e-4, 78; at 1e-5, 81, no row lost. A real step the night test must flag on its first
# night has the pairs for it: a 5 % slowdown measured to 0.75 % (the wall-clock scenario's
# precision) is p ~ 1e-8.
PAIRED_ALPHA = 1e-5
# ... and the change it estimates at least this large: smaller moves are real but not worth a
# mail (a code layout change alone moves wall-clock figures by 1-2 %).
PAIRED_MIN_CHANGE = 0.02
# A change is an alarm in the report of each of the first runs that can see it, not forever.
ALARM_RUNS = 5
# Nights in each figure's trend in the report and the mail.
TREND_NIGHTS = 14


def directions(db: ResultsDB, run: Run) -> dict[tuple[str, str], bool]:
    """(benchmark, metric) -> higher is better, from the catalog stored with the run (empty when
    it has none: every metric is then taken as higher is better)."""
    cat = db.catalog_of(run)
    if cat is None:
        return {}
    return {(b, m): d == "higher" for b, bench in cat.benchmarks.items() for m, d in bench.metrics.items()}


def series_changes(db: ResultsDB, run: Run, target: str, host_class: str, benchmark: str, metric: str,
                   higher: bool, expected: set[str]) -> tuple[list[tuple[str, float]], list[RevisionChange], list[str]]:
    """The nightly series of ``run``'s project (median of each night's runs of tonight's
    build), its changes, and the run id of each night. Changes come from two detectors: change
    points over the series, told by each night's paired estimate where the change cannot be
    (an identical binary) or is not (pairs that contradict it), and each night's own A/B test
    (paired_changes). A change found by both is reported once."""
    from gearfarm.perf.changepoint import find_changes

    rows = [r for r in db.perf_series(run.project, target, host_class, benchmark, metric, run.created_at, WINDOW)
            if r[2].get("new")]
    series = [(rev, statistics.median(v["new"])) for _, rev, v in rows]
    run_ids = [rid for rid, _, _ in rows]
    nights = [Paired.of(v.get("ratio", [])) for _, _, v in rows]
    records = db.step_records(run_ids, target, step_name("perf", benchmark))
    unchanged = [i > 0 and (series[i][0] == series[i - 1][0] or (
        records.get(rid) is not None and records[rid].baseline_identical is True
        and records[rid].baseline_rev == series[i - 1][0])) for i, rid in enumerate(run_ids)]
    # Each night's build against the target's pinned reference: nights that share one form a
    # second series of the build's level with the host's noise cancelled (gearfarm.perf.changepoint).
    refs = [Paired.of(v.get("ref_ratio", [])) for _, _, v in rows]
    pinned = [records[rid].reference_rev if rid in records and refs[i].k else None for i, rid in enumerate(run_ids)]
    changes = [c for c in find_changes(series, higher, expected=expected,
                                       paired_ratios=[math.exp(n.mean) if n.k else None for n in nights],
                                       paired_se=[n.se for n in nights], unchanged=unchanged,
                                       reference_ratios=[math.exp(r.mean) if r.k else None for r in refs],
                                       reference_se=[r.se for r in refs], reference=pinned)
               if not _contradicted(c, nights[c.index])]
    seen = {c.index for c in changes}
    revs = [rev for rev, _ in series]
    for c in paired_changes(series, nights, higher, unchanged):
        if c.index in seen or c.first_bad_rev in expected:
            continue
        # The night's pairs measured tonight's build against the last good build, which is not
        # the night before when builds in between failed their tests: the pairs then span those
        # nights too, and a change already found among them is not a second change tonight.
        rec = records.get(run_ids[c.index])
        base = rec.baseline_rev if rec is not None else None
        start = max((i for i in range(c.index) if revs[i] == base), default=c.index - 1) if base else c.index - 1
        if any(start < other.index < c.index for other in changes):
            continue
        if start < c.index - 1:
            c = dataclasses.replace(c, last_good_rev=revs[start])
        changes.append(c)
    return series, sorted(changes, key=lambda c: c.index), run_ids


def _contradicted(c: RevisionChange, night: Paired) -> bool:
    """Whether the night's own pairs rule the series' change out: on a shared VM absolute
    figures move by 10-20 % between nights with the host's noise regime, while the pairs,
    measured side by side, show whether tonight's build moved at all."""
    if night.se is None:
        return False
    return abs(math.log1p(c.change) - night.mean) > 4 * night.se


def paired_changes(series: list[tuple[str, float]], nights: list[Paired], higher: bool,
                   unchanged: list[bool] | None = None, alpha: float = PAIRED_ALPHA,
                   min_change: float = PAIRED_MIN_CHANGE) -> list[RevisionChange]:
    """Nights whose A/B pairs alone show a change (paired_test at ``alpha``, an estimate of
    at least ``min_change``, and most pairs agreeing in direction; the trimmed estimate
    already keeps a few wild pairs from carrying a night). A night whose binary is the
    baseline's, byte for byte, is never one.

    This is what pairing buys on a shared machine: the host's drift between nights, which
    can move absolute figures by tens of percent here, is the same for both sides of a pair
    and cancels, so a step shows on its first night with no history needed."""
    from gearfarm.perf.changepoint import RevisionChange

    out = []
    for i, night in enumerate(nights):
        if i == 0 or night.k < 2 or (unchanged and unchanged[i]):
            continue
        mean = night.mean
        if abs(math.expm1(mean)) < min_change or 2 * sum((x > 0) == (mean > 0) for x in night.logs) <= night.k:
            continue
        p = paired_test(night, nights[:i])
        if p is None or not p < alpha:
            continue
        lo, hi = night.interval() or (math.expm1(mean), math.expm1(mean))
        worse = (mean < 0) == higher
        before = series[i - 1][1]
        out.append(RevisionChange(
            index=i, before_mean=before, after_mean=before * math.exp(mean), change=math.expm1(mean),
            ci_low=lo, ci_high=hi, p_value=p, direction="regression" if worse else "improvement",
            first_bad_rev=series[i][0], last_good_rev=series[i - 1][0]))
    return out


def figures(db: ResultsDB, run: Run, records: list[ResultRecord] | None = None) -> list[dict[str, Any]]:
    """The night's figures, one per (target, benchmark, metric) the run measured: the median
    of tonight's build, and the paired estimate against its baseline with its 95 % interval
    (the night's figure: what the code change did, the host's state cancelled), with how
    quiet the host was while it measured."""
    keys = db.perf_keys(run.run_id)
    if not keys:  # nothing measured: no record to read (a night's are many, with every case)
        return []
    higher_is_better = directions(db, run)
    if records is None:  # its perf jobs' only: a night's tests are thousands, with every case
        records = db.jobs(run.run_id, cases=False, kinds=["perf"])
    recs = {(r.target, r.name): r for r in records if r.kind == "perf"}
    out = []
    trends = db.perf_trends(run.project, keys, run.created_at, TREND_NIGHTS)
    for target, host_class, benchmark, metric in keys:
        rec = recs.get((target, benchmark))
        if rec is None:
            continue
        new = [s.value for s in rec.samples if s.metric == metric and s.variant == "new"]
        night = Paired.of([s.value for s in rec.samples if s.metric == metric and s.variant == "ratio"])
        fig: dict[str, Any] = {
            "target": target, "benchmark": benchmark, "metric": metric, "host_class": host_class,
            "higher_is_better": higher_is_better.get((benchmark, metric), True),
            "value": statistics.median(new) if new else None, "runs": len(new), "pairs": night.k,
            "baseline_rev": rec.baseline_rev, "baseline_identical": rec.baseline_identical,
            "quietness": dict(rec.quietness),
            # The series' last nights up to this one (median of each night's runs of its build).
            "trend": [statistics.median(v) for v in trends.get((target, host_class, benchmark, metric), [])]}
        if night.k:
            fig["change"] = math.expm1(night.mean)
            fig["ci_low"], fig["ci_high"] = night.interval() or (None, None)
        ref = Paired.of([s.value for s in rec.samples if s.metric == metric and s.variant == "ref_ratio"])
        if ref.k and rec.reference_rev:
            fig["reference_rev"] = rec.reference_rev
            fig["reference_change"] = math.expm1(ref.mean)
        out.append(fig)
    return out


def analyze(db: ResultsDB, run: Run) -> list[dict[str, Any]]:
    """The run's performance section: changes whose first bad night is among the last
    ALARM_RUNS nights of their series, regressions first, each with PNG and SVG plots."""
    keys = db.perf_keys(run.run_id)
    if not keys:
        return []  # nothing measured: no catalog to read (nor to warn about)
    higher_is_better = directions(db, run)
    expected = db.expected_changes()
    out: list[dict[str, Any]] = []
    for target, host_class, benchmark, metric in keys:
        higher = higher_is_better.get((benchmark, metric), True)
        series, changes, run_ids = series_changes(db, run, target, host_class, benchmark, metric, higher,
                                                  expected.get((benchmark, metric, target), set()))
        recent = [c for c in changes if c.index >= len(series) - ALARM_RUNS]
        if not recent:
            continue
        from gearfarm.perf.plot import plot

        title = f"{benchmark} {metric} on {target}"
        png = plot(series, changes, title, "png")
        svg = plot(series, changes, title, "svg").decode()
        for c in recent:
            out.append({
                "benchmark": benchmark, "metric": metric, "target": target, "host_class": host_class,
                "direction": c.direction, "higher_is_better": higher, "change": c.change,
                "ci_low": c.ci_low, "ci_high": c.ci_high, "p_value": c.p_value,
                "before": c.before_mean, "after": c.after_mean,
                "first_bad_rev": c.first_bad_rev, "last_good_rev": c.last_good_rev,
                "first_bad_run": run_ids[c.index], "nights": len(series),
                "svg": svg, "png_b64": base64.b64encode(png).decode(),
            })
    out.sort(key=lambda e: (e["direction"] != "regression", -abs(e["change"])))
    return out
