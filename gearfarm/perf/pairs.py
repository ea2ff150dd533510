"""A night's A/B pairs of one metric (tonight's build against its baseline, interleaved on one
host): the paired estimate with its interval, and the test of "no change" that judges a night
on its pairs. Below the analysis (gearfarm.perf.analysis) so the perf worker can use the same estimate
to decide when it has measured enough pairs."""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

# Earlier nights whose pairs' scatter is pooled with tonight's (see paired_test).
POOL_NIGHTS = 10
# The share of pairs trimmed from each end of a night's pairs (see Paired).
TRIM = 0.2


@dataclass(frozen=True)
class Paired:
    """One night's A/B pairs of one metric: log ratios of tonight's build over its baseline.

    The night's estimate is the 20 % trimmed mean of the log ratios, with Yuen's standard
    error from the winsorized variance. Why not the plain mean: on a shared VM the host's speed
    jumps by 20-40 % for a second or two at a time, so a pair whose two sides straddle such a
    jump is wild while most pairs agree within a few percent (measured: pair SD 8-12 %, robust
    SD 5 %). The trimmed mean ignores the wild pairs and halves the standard error; with fewer
    than five pairs nothing is trimmed and it is the plain mean and t interval. By hand rather
    than scipy.stats.mstats.trimmed_stde (which it equals, tests/perf/test_paired.py): scipy rounds
    the trimmed count, so 4 pairs would lose 2, and pooling needs the variance itself."""

    logs: tuple[float, ...]

    @classmethod
    def of(cls, ratios: list[float]) -> Paired:
        return cls(tuple(math.log(r) for r in ratios if r > 0))

    @property
    def k(self) -> int:
        return len(self.logs)

    @property
    def _trimmed(self) -> int:
        return int(TRIM * self.k)

    @property
    def mean(self) -> float:
        g = self._trimmed
        return statistics.fmean(sorted(self.logs)[g:self.k - g])

    @property
    def dof(self) -> int:
        """Degrees of freedom of the night's own t statistic (Yuen: kept pairs - 1)."""
        return self.k - 2 * self._trimmed - 1

    @property
    def var(self) -> float:
        """Per-pair variance on the scale of the estimate: se**2 == var / k (what pooling
        averages). The winsorized variance, scaled by (k / kept)**2 as Yuen's test does."""
        g, k = self._trimmed, self.k
        s = sorted(self.logs)
        w = [min(max(x, s[g]), s[k - g - 1]) for x in s]
        m = statistics.fmean(w)
        return sum((x - m) ** 2 for x in w) / (k - 1) * (k / (k - 2 * g)) ** 2

    def interval(self, level: float = 0.95) -> tuple[float, float] | None:
        """The night's paired estimate's interval (relative change), from its own pairs."""
        if self.k < 2:
            return None
        half = _t_quantile(0.5 + level / 2, self.dof) * math.sqrt(self.var / self.k)
        return math.expm1(self.mean - half), math.expm1(self.mean + half)

    @property
    def se(self) -> float | None:
        """Standard error of the estimate from the night's own pairs (None below 3)."""
        return math.sqrt(self.var / self.k) if self.k >= 3 else None


@functools.lru_cache(maxsize=1024)
def _t_quantile(q: float, dof: int) -> float:
    """Student's t quantile, once per (q, dof): a series page asks for hundreds of nights' and
    scipy takes 0.1 ms each."""
    from scipy import stats  # here, not at the top: it is half of a perf worker's start

    return float(stats.t.ppf(q, dof))


def paired_test(night: Paired, earlier: list[Paired]) -> float | None:
    """p-value of "tonight's build performs like its baseline", from the night's pairs.

    The scatter of the pairs is estimated from tonight's pairs pooled with those of up to
    POOL_NIGHTS earlier nights (the pairs' scatter does not depend on whether the code
    changed): five pairs alone give a t-test with 4 degrees of freedom, which cannot see a 5 %
    step under this host's pair noise, pooled they give ~40. But a VM's noise comes in
    regimes. A night noisier than its history would make the pooled test overconfident, so
    then the night is judged by its own t-test alone. A night quieter than its history is
    judged by whichever test is surer: the pooled one (many degrees of freedom, the history's
    larger scatter) or its own (its own scatter, its own degrees of freedom); with the pooled
    test alone, a night that measured a 4.8 % slowdown to a 0.75 % standard error over 38
    pairs after noisier nights scored p = 3e-4 and was not alarmed (CI, November 26), where its
    own test gives 1e-6. Each test is exact at its level, so the false-alarm rate is at most
    twice the level."""
    if night.k < 2:
        return None
    pool = [n for n in earlier[-POOL_NIGHTS:] if n.k >= 2] + [night]
    dof = sum(n.dof for n in pool)
    pooled_var = sum(n.var * n.dof for n in pool) / dof
    if night.var >= pooled_var:
        # (no scatter at all: identical figures on both sides, a counter; nothing to test against)
        return _t_p(night.mean, night.var, night.k, night.dof) if night.var > 0 else None
    pooled = _t_p(night.mean, pooled_var, night.k, dof)
    return min(pooled, _t_p(night.mean, night.var, night.k, night.dof)) if night.var > 0 else pooled


def _t_p(mean: float, var: float, k: int, dof: int) -> float:
    """Two-sided p-value of a mean of k pairs with per-pair variance var against no change."""
    from scipy import stats  # here, not at the top: it is half of a perf worker's start

    return float(2 * stats.t.sf(abs(mean / math.sqrt(var / k)), dof))
