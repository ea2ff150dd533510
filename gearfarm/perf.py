"""Performance analysis of a run: the series of every (benchmark, metric, target, host class)
it measured, their change points, and the report's performance section with plots. Figures are
compared only within one project and one host class; a night's value is the median of its
repetitions; whether higher is better comes from the catalog stored with the run."""

from __future__ import annotations

import base64
import math
import statistics
from typing import Any

from scipy import stats

from gearfarm.changepoint import RevisionChange, find_changes
from gearfarm.perfplot import plot
from gearfarm.store import ResultsDB, Run

WINDOW = 60
# A night's own A/B test must be this sure, and the change this large, to alarm: strict,
# because it judges one night without the series' support.
PAIRED_ALPHA = 0.001
PAIRED_MIN_CHANGE = 0.05
# A change is an alarm in the report of each of the first runs that can see it, not forever.
ALARM_RUNS = 5


def directions(db: ResultsDB, run: Run) -> dict[tuple[str, str], bool]:
    """(benchmark, metric) -> higher is better, from the catalog stored with the run (empty when
    it has none: every metric is then taken as higher is better)."""
    cat = db.catalog_of(run)
    if cat is None:
        return {}
    return {(b, m): d == "higher" for b, bench in cat.benchmarks.items() for m, d in bench.metrics.items()}


def series_changes(db: ResultsDB, run: Run, target: str, host_class: str, benchmark: str, metric: str,
                   higher: bool, expected: set[str]) -> tuple[list[tuple[str, float]], list[RevisionChange], list[str]]:
    """The nightly series of ``run``'s project (median of each night's repetitions), its
    changes, and the run id of each night. Changes come from two detectors: change points over
    the series, confirmed by the nights' paired ratios, and each night's own A/B test (see
    paired_changes)."""
    rows = [r for r in db.perf_series(run.project, target, host_class, benchmark, metric, run.created_at, WINDOW)
            if r[2].get("new")]
    series = [(rev, statistics.median(v["new"])) for _, rev, v in rows]
    ratios = [statistics.median(v["ratio"]) if v.get("ratio") else None for _, _, v in rows]
    run_ids = [rid for rid, _, _ in rows]
    changes = find_changes(series, higher, expected=expected, paired_ratios=ratios)
    seen = {c.index for c in changes}
    for c in paired_changes(series, [v.get("ratio", []) for _, _, v in rows], higher):
        if c.index not in seen and c.first_bad_rev not in expected:
            changes.append(c)
    return series, sorted(changes, key=lambda c: c.index), run_ids


def paired_changes(series: list[tuple[str, float]], pair_ratios: list[list[float]], higher: bool,
                   alpha: float = PAIRED_ALPHA, min_change: float = PAIRED_MIN_CHANGE) -> list[RevisionChange]:
    """Nights whose A/B pairs alone show a change: a one-sample t-test of the pairs' log
    ratios (tonight's build / the last good build, run alternately on one host) against 0.

    This is what pairing buys on a shared machine: the host's drift between nights, which
    can move absolute figures by tens of percent here, is the same for both sides of a pair
    and cancels, so a step shows on its first night with no history needed."""
    out = []
    for i, ratios in enumerate(pair_ratios):
        logs = [math.log(r) for r in ratios if r > 0]
        if i == 0 or len(logs) < 3:
            continue
        mean, sd = statistics.fmean(logs), statistics.stdev(logs)
        if sd == 0 or abs(math.expm1(mean)) < min_change:
            continue
        res = stats.ttest_1samp(logs, 0.0)
        if not res.pvalue < alpha:
            continue
        half = stats.t.ppf(0.975, len(logs) - 1) * sd / math.sqrt(len(logs))
        worse = (mean < 0) == higher
        before = series[i - 1][1]
        out.append(RevisionChange(
            index=i, before_mean=before, after_mean=before * math.exp(mean), change=math.expm1(mean),
            ci_low=math.expm1(mean - half), ci_high=math.expm1(mean + half), p_value=float(res.pvalue),
            direction="regression" if worse else "improvement",
            first_bad_rev=series[i][0], last_good_rev=series[i - 1][0]))
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
