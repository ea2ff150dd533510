"""Same or different: the comparison that judges one revision's benchmark figures against the
known-good build's, in the way Chromium's Pinpoint does (catapult, pinpoint/models/compare).

p = min(Kolmogorov-Smirnov p, Mann-Whitney U p) over the two samples. At or below the low
threshold (0.01) they differ. Above the high threshold they are the same: the threshold is the
p-value that samples differing by the change sought would exceed only 1 % of the time, so a
p-value above it says the change is not there. In between, more samples are needed. The high
threshold falls as the samples grow, so the number of repetitions is bounded. The change
sought is measured in interquartile ranges (IQR) of the figures: a 5 % change under 1 % noise
takes a few pairs, under 5 % noise many.

Pinpoint ships its high thresholds as a table made by a simulation script; here the same kind of
simulation (normal samples shifted by the magnitude, 4,000 draws, a fixed seed) runs on first
use for each (magnitude, size) and is cached, so any size the farm's cap allows is covered.
"""

from __future__ import annotations

import functools
import statistics
import warnings
from dataclasses import dataclass
from typing import Any, Literal

LOW_THRESHOLD = 0.01
# The probability that samples differing by the change sought give a p-value above the high
# threshold (calling them "same" wrongly).
MISS = 0.01
# A normal distribution's IQR in standard deviations.
_IQR_SD = 1.3489795
_DRAWS = 4000

Result = Literal["different", "same", "unknown"]


@dataclass(frozen=True)
class Comparison:
    result: Result
    p_value: float
    high_threshold: float
    # The change sought, in IQRs of the known-good figures (rounded to tenths, as looked up).
    magnitude: float
    # Relative change of the medians: sample over known-good.
    change: float
    size: int


def p_value(a: list[float], b: list[float]) -> float:
    from scipy import stats  # a second to import: only where figures are compared

    with warnings.catch_warnings():
        # Ties make KS's exact p-value fall back to the asymptotic one, as intended here.
        warnings.filterwarnings("ignore", message="ks_2samp: Exact calculation unsuccessful")
        ks = stats.ks_2samp(a, b).pvalue
    mwu = stats.mannwhitneyu(a, b, alternative="two-sided").pvalue
    return float(min(ks, mwu))


@functools.lru_cache(maxsize=512)
def high_threshold(magnitude_tenths: int, size: int) -> float:
    """The p-value that two samples of ``size`` values, differing by ``magnitude_tenths``/10
    IQRs, exceed with probability MISS (simulated with normal figures)."""
    import numpy as np
    from scipy import stats

    if size < 2:
        return 1.0
    rng = np.random.default_rng(20261124 + 1000 * magnitude_tenths + size)
    a = rng.standard_normal((_DRAWS, size))
    b = rng.standard_normal((_DRAWS, size)) + magnitude_tenths / 10 * _IQR_SD
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="ks_2samp: Exact calculation unsuccessful")
        ks = stats.ks_2samp(a, b, axis=1).pvalue
    mwu = stats.mannwhitneyu(a, b, alternative="two-sided", axis=1).pvalue
    return float(np.quantile(np.minimum(ks, mwu), 1.0 - MISS))


def iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def compare(sample: list[float], good: list[float], change: float) -> Comparison:
    """Is ``sample`` (a revision's figures) the same as ``good`` (the known-good build's,
    interleaved with them on one host), looking for a relative change of ``change``?"""
    n = min(len(sample), len(good))
    med = statistics.median(good)
    spread = iqr(good) if len(good) >= 2 else 0.0
    est = statistics.median(sample) / med - 1.0 if med else 0.0
    if n < 2:
        return Comparison("unknown", 1.0, 1.0, 0.0, est, n)
    # A spread of nothing (figures that are counts) makes any change huge: capped at 10 IQRs.
    magnitude = min(abs(change) * abs(med) / spread, 10.0) if spread > 0 else 10.0
    tenths = max(1, round(magnitude * 10))
    p = p_value(sample, good)
    high = high_threshold(tenths, n)
    result: Result = "different" if p <= LOW_THRESHOLD else "same" if p > high else "unknown"
    return Comparison(result, p, high, tenths / 10, est, n)


# The change a comparison of two runs looks for: the size the nightly's own A/B test alarms on
# (gearfarm.perf.analysis.PAIRED_MIN_CHANGE), so "same" means "no change the farm would report".
SOUGHT = 0.02
_RESAMPLES = 2000
VERDICTS = {"different": "different", "same": "same", "unknown": "not enough data"}


@dataclass(frozen=True)
class Between:
    """Two runs' figures of one metric, side by side (the dashboard's compare): B's median over
    A's less one, its 95 % bootstrap interval, and the verdict of ``compare`` for that change:
    "different", "same" or "not enough data"."""

    verdict: str
    change: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None


def between(a: list[float], b: list[float], sought: float = SOUGHT) -> Between:
    """Judge run B's figures against run A's. Unlike a night's A/B pairs these were measured on
    different nights, so the host's drift is in them too: the verdict says whether the figures
    differ, the interval by how much, and a figure needs at least two runs on each side. The
    interval wholly beyond +-``sought`` is "different", wholly within it "same"; ``p_value`` is
    the rank tests' (KS, Mann-Whitney), shown beside it."""
    return between_all([(a, b)], sought)[0]


def between_all(pairs: list[tuple[list[float], list[float]]], sought: float = SOUGHT) -> list[Between]:
    """``between`` for many figures at once (a compare page judges every figure two runs have):
    figures with as many values a side are judged together, one array operation for all, since
    scipy's per-call overhead, not the arithmetic, is what a hundred separate calls cost."""
    out: list[Between] = []
    changes: list[float | None] = []
    groups: dict[tuple[int, int, bool], list[int]] = {}
    for i, (a, b) in enumerate(pairs):
        ma = statistics.median(a) if a else None
        mb = statistics.median(b) if b else None
        changes.append(mb / ma - 1.0 if ma and mb is not None else None)
        out.append(Between(VERDICTS["unknown"], changes[i], None, None, None))  # judged below if it can be
        if changes[i] is None or len(a) < 2 or len(b) < 2:
            continue
        # Ties decide whether Mann-Whitney's p is exact or asymptotic for a whole batch: a
        # figure's p must not depend on its neighbours, so tied figures are a batch of their own.
        groups.setdefault((len(a), len(b), len(set(a) | set(b)) < len(a) + len(b)), []).append(i)
    for idx in groups.values():
        a2 = [pairs[i][0] for i in idx]
        b2 = [pairs[i][1] for i in idx]
        intervals = _intervals(a2, b2)
        ps = _p_values(a2, b2)
        for i, (low, high), p in zip(idx, intervals, ps, strict=True):
            # The interval decides: an interval wholly beyond the change sought is a change, one
            # wholly within it none. Pinpoint's rank test (``compare``) cannot say this for two
            # runs' figures: with three a side its p-value never falls to 0.01, and figures that
            # repeat exactly (instruction counts) have no spread for its thresholds; its
            # simulation per noise level would also cost a page a second.
            verdict = VERDICTS["unknown"]
            if low is not None and high is not None:
                if low > sought or high < -sought:
                    verdict = VERDICTS["different"]
                elif -sought <= low and high <= sought:
                    verdict = VERDICTS["same"]
            out[i] = Between(verdict, changes[i], low, high, p)
    return out


def _p_values(a: list[list[float]], b: list[list[float]]) -> list[float]:
    """``p_value`` of each row pair (rows of one length a side), in one call per test."""
    import numpy as np
    from scipy import stats

    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="ks_2samp: Exact calculation unsuccessful")
        ks = np.atleast_1d(stats.ks_2samp(xa, xb, axis=1).pvalue)
    mwu = np.atleast_1d(stats.mannwhitneyu(xa, xb, alternative="two-sided", axis=1).pvalue)
    return [float(x) for x in np.minimum(ks, mwu)]


def _intervals(a: list[list[float]], b: list[list[float]]) -> list[tuple[float | None, float | None]]:
    """95 % percentile-bootstrap interval of median(B)/median(A) - 1 for each row pair (rows of
    one length a side). A fixed seed: a page shows the same interval every time, and every
    figure of a size is resampled with the same draws, as it would be alone."""
    import numpy as np

    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rng = np.random.default_rng(20261126)
    ia = rng.integers(0, xa.shape[1], (_RESAMPLES, xa.shape[1]))
    ib = rng.integers(0, xb.shape[1], (_RESAMPLES, xb.shape[1]))
    ma, mb = _medians(xa[:, ia]), _medians(xb[:, ib])  # (figures, resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(ma != 0, mb / ma - 1.0, np.nan)
    whole = ~np.isnan(ratios).any(axis=1)
    bounds = np.quantile(ratios[whole], [0.025, 0.975], axis=1) if whole.any() else np.empty((2, 0))
    out: list[tuple[float | None, float | None]] = []
    k = 0
    for row, full in zip(ratios, whole, strict=True):
        if full:  # the usual figure: its bounds came from the one call above
            out.append((float(bounds[0, k]), float(bounds[1, k])))
            k += 1
            continue
        ok = row[~np.isnan(row)]  # resamples whose A median is 0 have no ratio
        out.append((float(np.quantile(ok, 0.025)), float(np.quantile(ok, 0.975))) if ok.size else (None, None))
    return out


def _medians(x: Any) -> Any:
    """The median along the last axis, by sorting: for the few values a side a figure has, a
    sort is half the time of numpy's general median."""
    import numpy as np

    s = np.sort(x, axis=-1)
    n = s.shape[-1]
    return s[..., n // 2] if n % 2 else (s[..., n // 2 - 1] + s[..., n // 2]) / 2
