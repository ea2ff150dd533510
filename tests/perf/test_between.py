"""Two runs' figures of one metric judged side by side (gearfarm.perf.compare.between, the
dashboard's compare): the verdict is "same" only where no change of the size sought fits,
"different" only where one must be there, and "not enough data" otherwise; the interval holds
the change."""

from __future__ import annotations

import random

from gearfarm.perf.compare import SOUGHT, between


def test_identical_figures_are_the_same_and_a_10_percent_slowdown_is_different() -> None:
    rng = random.Random(7)
    a = [1000 * rng.gauss(1, 0.02) for _ in range(5)]
    slow = [0.9 * 1000 * rng.gauss(1, 0.02) for _ in range(5)]
    got = between(a, slow)
    assert got.verdict == "different" and got.ci_high is not None and got.ci_low is not None
    assert got.ci_low < got.change < got.ci_high < -SOUGHT and abs(got.change + 0.1) < 0.03
    counts = [2.66e8] * 3  # instruction counts repeat exactly: three a side decide
    assert between(counts, counts).verdict == "same" and between(counts, counts).change == 0
    assert between(counts, [c * 1.2 for c in counts]).verdict == "different"
    assert between(counts, [c * 1.005 for c in counts]).verdict == "same"  # within the 2 % sought


def test_noise_alone_is_rarely_called_different_and_one_run_is_not_enough() -> None:
    rng = random.Random(11)
    for n in (3, 5):
        calls = [between([rng.gauss(1, 0.02) for _ in range(n)], [rng.gauss(1, 0.02) for _ in range(n)]).verdict
                 for _ in range(1000)]
        assert calls.count("different") <= 20, (n, calls.count("different"))  # 2 % at most; 0.65 % measured
    one = between([1.0], [0.5, 0.5])
    assert one.verdict == "not enough data" and one.change == -0.5 and one.ci_low is None
    assert between([], [1.0, 1.0]).change is None
