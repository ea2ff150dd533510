"""Change-point detection for nightly performance series (issue #6).

One series is one (benchmark, metric, target, host class) with one value per night (the caller
aggregates a night's repetitions, e.g. their median). `detect` finds the nights where the level of
the series moved, says whether that is a regression or an improvement for this metric, how big the
move is with a confidence interval, and how sure it is (a p-value corrected for having searched
all split positions). `find_changes` maps that onto revisions and drops changes a user annotated
as expected.

Method (docs/performance.md has the why and the comparison with Apache Otava):

* Work on log(values): a step is then a relative change, the same for rates and latencies.
* Noise scale from first differences (trimmed at 3 robust SDs, then root-mean-square): a level
  shift moves one difference and an outlier two, so the estimate stays honest on series that do
  change (unlike the plain SD) and nearly as efficient as the SD (unlike the bare MAD).
* Isolated single-night outliers (a point far from both neighbours, the neighbours agreeing) are
  replaced by their neighbours' mean: one bad night is not a new regime.
* Binary segmentation: the split of a segment maximising the standardised mean difference; its
  p-value is that of the *maximum over all positions searched*, from a seeded Monte Carlo null
  (Gaussian noise, noise scale estimated the same way), so the search over positions does not
  manufacture alarms (Otava tests the chosen split as if it had not been chosen). Accepted splits
  are re-tested against their final neighbours (a merge step like Otava's).
* A new regime at the end of the series must persist `min_persist` nights, unless the night's
  paired A/B ratio (same host, tonight's build vs last good build) confirms the direction.
* Only changes of at least `min_change` (relative) are reported: significant but negligible moves
  are real, yet not worth a mail.

Everything is deterministic: the Monte Carlo null is seeded and cached per segment length.
scipy (Student-t quantile of the interval) comes with the pinned apache-otava.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

DEFAULT_MIN_CHANGE = 0.015
DEFAULT_ALPHA = 0.01
DEFAULT_MIN_PERSIST = 2

# 1.4826 * MAD estimates the SD of a normal sample; first differences have SD sigma*sqrt(2).
_MAD_TO_SD = 1.4826
# Simulated noise series per (length, persistence) for the null distribution of the statistic.
_NULL_SIMS = 4000
_NULL_SEED = 6
# E[d^2 | |d| <= 3 SD] / SD^2 for a normal d: undoes the trimming bias of the noise estimate.
_TRIM3 = 0.97334
# A point must be this many noise-SDs of a difference away from both neighbours to be an outlier.
_OUTLIER_Z = 3.0
# The newest night is held back when it jumps this many SDs of a difference from the night before.
_HOLD_Z = 2.5
# Floor for the noise scale (log units): exactly constant synthetic series must not divide by 0.
_SIGMA_FLOOR = 1e-6


@dataclass(frozen=True)
class ChangePoint:
    index: int  # first index of the new regime (in the input sequence)
    before_mean: float
    after_mean: float
    change: float  # relative change, after_mean / before_mean - 1
    ci_low: float  # relative, 95 % interval of `change`
    ci_high: float
    p_value: float  # corrected for the positions searched
    direction: Literal["regression", "improvement"]


@dataclass(frozen=True)
class RevisionChange(ChangePoint):
    first_bad_rev: str = ""  # first revision of the new regime ("bad" also for improvements)
    last_good_rev: str | None = None  # last revision of the old regime


def detect(values: Sequence[float | None], higher_is_better: bool = True, *,
           min_change: float = DEFAULT_MIN_CHANGE, alpha: float = DEFAULT_ALPHA,
           paired_ratios: Sequence[float | None] | None = None,
           min_persist: int = DEFAULT_MIN_PERSIST) -> list[ChangePoint]:
    """Change points of `values` (oldest first, one per night), oldest first.

    None/NaN nights are skipped (indices still refer to `values`). Values must be positive.
    `paired_ratios[i]`, when given and not None, is night i's A/B ratio (value of tonight's build /
    value of the last good build, measured alternately on one host): a change starting at i is
    dropped if that ratio does not agree in direction, and a change on the very last night(s) is
    accepted before `min_persist` nights when the ratio confirms it.
    """
    if min_persist < 1:
        raise ValueError("min_persist must be >= 1")
    raw = [math.nan if v is None else float(v) for v in values]
    idx = [i for i, v in enumerate(raw) if math.isfinite(v)]
    x = np.array([raw[i] for i in idx], dtype=float)
    if np.any(x <= 0):
        raise ValueError("performance values must be positive")
    n = len(x)
    if n < 4:
        return []
    ratios = None
    if paired_ratios is not None:
        ratios = [paired_ratios[i] if i < len(paired_ratios) else None for i in idx]

    y = np.log(x)
    sigma = float(_noise(y))
    y = _clean_outliers(y, sigma)

    def confirmed(pos: int, delta: float) -> bool | None:
        """True/False if a paired ratio at `pos` agrees/disagrees with `delta`, None if unknown."""
        if ratios is None or ratios[pos] is None or not ratios[pos] > 0:
            return None
        r = math.log(ratios[pos])
        # Agree in sign and be not ~1: half the reportable change is the least we take as a move.
        return r * delta > 0 and abs(r) >= math.log1p(min_change) / 2

    # Persistence: the newest night, if it jumps away from the night before, may be a one-night
    # spike or the first night of a new regime; hold it back until tomorrow tells which (unless a
    # paired A/B ratio already says it is real). Without it a spike would pass as a 2-night regime.
    if min_persist >= 2 and abs(y[-1] - y[-2]) > _HOLD_Z * sigma * math.sqrt(2) \
            and not confirmed(n - 1, y[-1] - y[-2]):
        n -= 1
        y = y[:n]

    def min_right(b: int) -> int:
        # Interior regimes need two nights (one night is an outlier); the newest one min_persist.
        return max(2, min_persist) if b == n else 2

    def stat(a: int, b: int, fresh: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Split positions of y[a:b], their standardised mean differences z and differences."""
        cs = np.concatenate(([0.0], np.cumsum(y[a:b])))
        length = b - a
        taus = np.arange(2, length)  # left size >= 2, right size >= 1
        right_n = length - taus
        diff = (cs[length] - cs[taus]) / right_n - cs[taus] / taus
        ok = right_n >= min_right(b)
        if ratios is not None:
            for j, t in enumerate(taus):
                c = confirmed(a + t, diff[j])
                if c is False:
                    ok[j] = False  # the paired measurement contradicts a step here
                elif c and fresh and b == n:
                    ok[j] = True  # confirmed by the A/B ratio: no need to wait for persistence
        z = np.abs(diff) / (sigma * np.sqrt(1 / taus + 1 / right_n))
        return taus[ok], z[ok], diff[ok]

    def split(a: int, b: int) -> tuple[int, float] | None:
        """Best split of y[a:b] as (position, p-value), or None if no position is allowed."""
        taus, z, diff = stat(a, b, fresh=True)
        if not len(taus):
            return None
        conf = np.array([bool(confirmed(a + int(t), d)) for t, d in zip(taus, diff, strict=True)])
        if conf.any():
            # The A/B ratios, an independent measurement, say where the step is: test only those
            # nights, each as a single position (Bonferroni over the few confirmed ones).
            j = int(np.argmax(np.where(conf, z, -1.0)))
            r = b - a - int(taus[j])
            p = min(1.0, int(conf.sum()) * _p_max(float(z[j]), b - a, r, r))
            if p <= alpha or conf.all():
                return a + int(taus[j]), p
            taus, z = taus[~conf], z[~conf]
        best = int(np.argmax(z))
        # The null covers the positions actually searched (a confirmed 1-night regime included).
        return a + int(taus[best]), _p_max(float(z[best]), b - a, b - a - int(taus.max()), b - a - 2)

    # Binary segmentation.
    cps: list[int] = []
    todo = [(0, n)]
    while todo:
        a, b = todo.pop()
        found = split(a, b)
        if found is None or found[1] > alpha:
            continue
        cps.append(found[0])
        todo += [(a, found[0]), (found[0], b)]
    cps.sort()

    # Merge: re-test every change point against its final neighbours; drop the weakest that no
    # longer holds, recompute, repeat (a split found early may be explained by later ones).
    def retest(k: int) -> float:
        a = cps[k - 1] if k > 0 else 0
        b = cps[k + 1] if k + 1 < len(cps) else n
        t = cps[k]
        left, right = y[a:t], y[t:b]
        d = right.mean() - left.mean()
        z = abs(d) / (sigma * math.sqrt(1 / len(left) + 1 / len(right)))
        if confirmed(t, d):
            return _p_max(z, b - a, b - t, b - t)
        return _p_max(z, b - a, min(min_right(b), b - t), b - a - 2)

    while cps:
        ps = [retest(k) for k in range(len(cps))]
        worst = int(np.argmax(ps))
        if ps[worst] <= alpha:
            break
        del cps[worst]
    if not cps:
        return []

    # Estimates: regime means, and a t interval of the log ratio with the pooled residual SD of
    # the final segmentation (more efficient than the robust scale once the regimes are known).
    bounds = [0, *cps, n]
    resid = np.concatenate([y[s:e] - y[s:e].mean() for s, e in zip(bounds, bounds[1:], strict=False)])
    dof = n - (len(bounds) - 1)
    pooled = max(float(np.sqrt(np.sum(resid**2) / dof)), _SIGMA_FLOOR) if dof > 0 else float(sigma)
    tq = float(stats.t.ppf(0.975, max(dof, 1)))
    xc = np.exp(y)
    out: list[ChangePoint] = []
    for k, t in enumerate(cps):
        a, b = bounds[k], bounds[k + 2]
        before, after = float(xc[a:t].mean()), float(xc[t:b].mean())
        change = after / before - 1
        if abs(change) < min_change:
            continue
        if confirmed(t, math.log(after / before)) is False:
            continue
        half = tq * pooled * math.sqrt(1 / (t - a) + 1 / (b - t))
        worse = (change < 0) == higher_is_better
        out.append(ChangePoint(
            index=idx[t], before_mean=before, after_mean=after, change=change,
            ci_low=(after / before) * math.exp(-half) - 1, ci_high=(after / before) * math.exp(half) - 1,
            p_value=retest(k), direction="regression" if worse else "improvement"))
    return out


def find_changes(series: Sequence[tuple[str, float | None]], higher_is_better: bool,
                 expected: set[str] | frozenset[str] = frozenset(), **kw) -> list[RevisionChange]:
    """`detect` over [(revision, value)] oldest first; changes whose first bad revision is in
    `expected` (annotations: "this change was intended") are dropped. `kw` goes to `detect`."""
    revs = [r for r, _ in series]
    values = [v for _, v in series]
    out = []
    for cp in detect(values, higher_is_better, **kw):
        if revs[cp.index] in expected:
            continue
        # The last good revision is the newest earlier night that has a value.
        good = next((revs[i] for i in range(cp.index - 1, -1, -1) if _present(values[i])), None)
        out.append(RevisionChange(**{f: getattr(cp, f) for f in ChangePoint.__dataclass_fields__},
                                  first_bad_rev=revs[cp.index], last_good_rev=good))
    return out


def _present(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _noise(y: np.ndarray) -> np.ndarray:
    """Noise SD of y (last axis) from first differences: a step moves one difference and an
    outlier two. Differences beyond 3 robust SDs are trimmed and the rest averaged in squares:
    nearly as efficient as the SD (the MAD alone wastes 60 % of the data and costs nights)."""
    d = np.diff(y, axis=-1)
    d = d - np.median(d, axis=-1, keepdims=True)
    s0 = _MAD_TO_SD * np.median(np.abs(d), axis=-1, keepdims=True)
    keep = np.abs(d) <= 3 * s0
    var = np.sum(np.where(keep, d * d, 0.0), axis=-1) / np.maximum(np.sum(keep, axis=-1), 1) / _TRIM3
    return np.maximum(np.sqrt(var / 2), _SIGMA_FLOOR)


def _p_max(z: float, length: int, right_min: int, right_max: int) -> float:
    """P(the largest standardised difference over the split positions of a pure-noise segment of
    `length` whose new regime has right_min..right_max nights is >= z)."""
    if right_min == right_max:
        # One position: z is N(0,1) * sigma / estimated sigma wherever it is, so one table per length.
        right_min = right_max = 1
    null = _null_max(length, right_min, right_max)
    return (1 + int(len(null) - np.searchsorted(null, z, side="left"))) / (len(null) + 1)


@functools.lru_cache(maxsize=1024)
def _null_max(length: int, right_min: int, right_max: int) -> np.ndarray:
    """Sorted null distribution of the largest standardised mean difference over all allowed split
    positions of a Gaussian-noise segment of `length`, with the noise scale estimated the way
    `detect` does. Monte Carlo, seeded, so `detect` stays deterministic. This replaces a Bonferroni
    bound: neighbouring positions are strongly correlated, Bonferroni would wait nights longer."""
    rng = np.random.default_rng([_NULL_SEED, length, right_min, right_max])
    taus = np.arange(max(2, length - right_max), length - right_min + 1)
    if not len(taus):
        return np.array([np.inf])
    out = []
    for _ in range(_NULL_SIMS // 1000):
        y = rng.standard_normal((1000, length))
        cs = np.concatenate((np.zeros((1000, 1)), np.cumsum(y, axis=1)), axis=1)
        diff = (cs[:, [length]] - cs[:, taus]) / (length - taus) - cs[:, taus] / taus
        z = np.abs(diff) / np.sqrt(1 / taus + 1 / (length - taus)) / _noise(y)[:, None]
        out.append(z.max(axis=1))
    return np.sort(np.concatenate(out))


def _clean_outliers(y: np.ndarray, sigma: float) -> np.ndarray:
    """Replace single-night spikes by their neighbours' mean. The newest night is never touched:
    whether it is a spike or the start of a new regime is for the persistence rule to decide."""
    y = y.copy()
    lim = _OUTLIER_Z * sigma * math.sqrt(2)
    for i in range(1, len(y) - 1):
        dl, dr = y[i] - y[i - 1], y[i] - y[i + 1]
        if dl * dr > 0 and min(abs(dl), abs(dr)) > lim and abs(y[i - 1] - y[i + 1]) < min(abs(dl), abs(dr)) / 2:
            y[i] = (y[i - 1] + y[i + 1]) / 2
    return y
