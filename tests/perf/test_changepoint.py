"""Behaviour of the performance change-point detector (gearfarm/perf/changepoint.py) and its plots
(gearfarm/perf/plot.py), issue #6. Seeded series, so every assertion is deterministic."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gearfarm.perf.changepoint as changepoint
from gearfarm.perf.changepoint import detect, find_changes
from gearfarm.perf.plot import plot


def noisy(n: int = 60, noise: float = 0.01, seed: int = 1, level: float = 1000.0) -> np.ndarray:
    return level * (1 + noise * np.random.default_rng(seed).standard_normal(n))


def test_20pct_drop_in_a_rate_is_found_at_its_night_as_a_regression():
    v = noisy()
    v[30:] *= 0.8
    [cp] = detect(v.tolist(), higher_is_better=True)
    assert cp.index == 30
    assert cp.direction == "regression"
    assert cp.ci_low <= -0.20 <= cp.ci_high
    assert cp.ci_low <= cp.change <= cp.ci_high and cp.p_value <= 0.01


def test_rise_in_a_rate_is_an_improvement():
    v = noisy(seed=2)
    v[40:] *= 1.08
    [cp] = detect(v.tolist(), higher_is_better=True)
    assert (cp.index, cp.direction) == (40, "improvement")
    assert cp.ci_low <= 0.08 <= cp.ci_high


def test_latency_direction_flips_the_classification():
    v = noisy(seed=3)
    v[25:] *= 1.10  # latency up: worse
    [cp] = detect(v.tolist(), higher_is_better=False)
    assert (cp.index, cp.direction) == (25, "regression")
    [cp] = detect(v[::-1].tolist(), higher_is_better=False)  # latency down: better
    assert cp.direction == "improvement"


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("noise", [0.01, 0.03])
def test_pure_noise_yields_no_change(seed, noise):
    assert detect(noisy(noise=noise, seed=100 + seed).tolist()) == []


@pytest.mark.parametrize("where", [5, 30, 58])
def test_a_single_outlier_yields_no_change(where):
    v = noisy(seed=7)
    v[where] *= 0.7
    assert detect(v.tolist()) == []


def test_newest_night_spike_waits_for_a_second_night():
    v = noisy(n=41, seed=8)
    v[40] *= 0.8
    assert detect(v.tolist()) == []  # one night: could be a spike
    v = np.append(v, noisy(n=1, seed=9) * 0.8)
    assert [c.index for c in detect(v.tolist())] == [40]  # two nights: a new regime


def test_paired_ratio_confirms_on_the_first_night_and_vetoes_a_contradiction():
    v = noisy(n=41, seed=8)
    v[40] *= 0.8
    ratios = [1.0] * 40 + [0.8]
    assert [c.index for c in detect(v.tolist(), paired_ratios=ratios)] == [40]
    v = noisy(seed=10)
    v[30:] *= 0.9
    assert [c.index for c in detect(v.tolist(), paired_ratios=[1.0] * 60)] == []
    assert [c.index for c in detect(v.tolist(), paired_ratios=[None] * 60)] == [30]


def test_small_changes_below_min_change_are_not_reported():
    v = noisy(noise=0.001, seed=11)
    v[30:] *= 0.99
    assert detect(v.tolist()) == []
    assert [c.index for c in detect(v.tolist(), min_change=0.005)] == [30]


def test_two_changes_and_missing_nights():
    v = noisy(seed=12).tolist()
    v = [x * (0.85 if 20 <= i < 45 else 1.0) for i, x in enumerate(v)]
    v[10] = None
    cps = detect(v)
    assert [(c.index, c.direction) for c in cps] == [(20, "regression"), (45, "improvement")]


def test_find_changes_names_revisions_and_honours_expected():
    v = noisy(seed=13)
    v[30:] *= 0.8
    series = [(f"r{i:03d}", float(x)) for i, x in enumerate(v)]
    [ch] = find_changes(series, higher_is_better=True)
    assert (ch.first_bad_rev, ch.last_good_rev, ch.direction) == ("r030", "r029", "regression")
    assert find_changes(series, higher_is_better=True, expected={"r030"}) == []


def test_replayed_nightly_no_alarm_before_the_bad_commit():
    # The lead's iiBench scenario in miniature: 20 % slower from night 35; replay night by night.
    v = noisy(n=45, noise=0.02, seed=14)
    v[35:] *= 0.8
    first = None
    for t in range(5, 45):
        cps = detect(v[: t + 1].tolist())
        if t < 35:
            assert cps == []
        elif cps and first is None:
            first = (t, [c.index for c in cps])
    assert first == (36, [35])


def test_plot_returns_png_and_svg():
    v = noisy(n=80, seed=15)
    v[60:] *= 0.8
    series = [(f"rev{i:03d}", float(x)) for i, x in enumerate(v)]
    changes = find_changes(series, higher_is_better=True)
    png = plot(series, changes, "iiBench inserts/s, gcc-x86_64, host class A", "png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    svg = plot(series, changes, "iiBench inserts/s", "svg")
    assert b"<svg" in svg[:2000] and svg.rstrip().endswith(b"</svg>")
    with pytest.raises(ValueError):
        plot(series, changes, "x", "gif")  # type: ignore[arg-type]


def test_a_night_whose_build_did_not_change_cannot_start_a_regime():
    # issue #12: an unchanged build (no engine commit that night) is the same binary as the night
    # before; the move belongs to the nearest night whose build did change.
    v = noisy(seed=21)
    v[30:] *= 0.9
    assert [c.index for c in detect(v.tolist())] == [30]
    unchanged = [False] * 60
    unchanged[30] = True
    assert [c.index for c in detect(v.tolist(), unchanged=unchanged)] == [31]


@pytest.mark.parametrize("seed", [31, 34])
def test_unchanged_nights_make_a_young_regime_more_significant(seed):
    # A regime 12 nights old is searched among 12 positions; 7 unchanged nights leave 8 that could
    # start it, so the maximum over them is less surprising under the null: a smaller p-value.
    v = noisy(n=72, noise=0.02, seed=seed)
    v[60:] *= 0.95
    unchanged = [False] * 72
    for i in (50, 52, 55, 57, 63, 66, 69):
        unchanged[i] = True
    [plain] = detect(v.tolist())
    [informed] = detect(v.tolist(), unchanged=unchanged)
    assert plain.index == informed.index == 60
    assert informed.p_value < plain.p_value


def test_bench_series_paired_se_spans_the_farm_measurement():
    # bench/series.py: a night's 5 A/B pairs of a wall-clock benchmark on the farm's VM give a
    # standard error of the log ratio around 2-3 %, so the bench draws it uniformly in [1 %, 3 %].
    from bench.series import make_series

    ses = [make_series("gaussian", 0.01, 0.0, (6, 0, i)).ratio_se[1] for i in range(60)]
    assert 0.01 <= min(ses) < 0.012 and 0.028 < max(ses) <= 0.03
    s = make_series("gaussian", 0.01, 0.05, (6, 1, 0))
    assert s.ratio_se[0] is None and s.ratios[0] is None
    assert not s.unchanged[60] and s.step_at == 60


@pytest.mark.parametrize("seed", [47, 52])
def test_a_young_regime_needs_its_first_nights_ratio_not_against_it(seed):
    # issue #12: a 3-night regime found by the 2-4 night search is not believed when the paired
    # ratio of its first night points the other way by more than a standard error (though within
    # the veto's 2.5 standard errors of the difference): the builds did not make that move. A
    # ratio within a standard error of 1 says nothing either way and does not veto.
    v = noisy(n=60, noise=0.02, seed=seed)
    v[57:] *= 0.96
    se = [None] + [0.03] * 59
    cases = [(0.96, [57]), (1.035, [])]
    if seed == 47:
        # Here the values' step is strong enough for a ratio a sixth of a standard error the
        # other way (it weakens the combined step; on seed 52 below the search's level).
        cases.append((1.005, [57]))
    for r57, found in cases:
        ratios = [None] + [1.0] * 59
        ratios[57] = r57
        assert [c.index for c in detect(v.tolist(), paired_ratios=ratios, paired_se=se)] == found


def test_a_slow_drift_is_not_a_step_but_a_step_on_it_is(monkeypatch):
    # issue #12: a level drifting by 3 % over 60 nights under 1 % noise. Without the trend veto the
    # 2-4 night search takes the drift's last nights for a new regime; with it, the step must stand
    # out of a straight line through its window, and a real 4 % step on the drift still does.
    v = noisy(n=60, noise=0.01, seed=207) * np.exp(0.0005 * np.arange(60))
    assert detect(v.tolist()) == []
    w = v.copy()
    w[50:] *= 0.96
    assert [c.index for c in detect(w.tolist())] == [50]
    monkeypatch.setattr(changepoint, "_TREND_Z", 0.0)
    assert [c.index for c in detect(v.tolist())] == [55]


@pytest.mark.parametrize("seed", [43, 51])
def test_a_young_step_the_paired_ratio_does_not_show_is_vetoed(monkeypatch, seed):
    # issue #12: the values drop 3.5 % for 3 nights, but the paired ratio of the first night (the
    # builds side by side, se 1 %) says 0.5 %: more than 2.5 standard errors of the difference
    # apart, so the builds did not make that move. A ratio that agrees confirms the same step.
    v = noisy(n=60, noise=0.01, seed=seed)
    v[57:] *= 0.965
    se = [None] + [0.01] * 59
    ratios = [None] + [1.0] * 59
    ratios[57] = 0.995
    assert detect(v.tolist(), paired_ratios=ratios, paired_se=se) == []
    agree = ratios.copy()
    agree[57] = 0.965
    assert [c.index for c in detect(v.tolist(), paired_ratios=agree, paired_se=se)] == [57]
    monkeypatch.setattr(changepoint, "_VETO_Z", 3.0)  # the looser veto let it through
    assert [c.index for c in detect(v.tolist(), paired_ratios=ratios, paired_se=se)] == [57]


def _reference_series(step: float, seed: int, repin: int | None = None, offset: float = 0.0):
    """60 nights of 3 % host noise with a step at night 50, and the nights' ratios against a
    reference build (1.5 % noise: the host's noise cancels in them), re-pinned at `repin` to a
    build `offset` away from the first reference."""
    rng = np.random.default_rng(seed)
    level = np.where(np.arange(60) >= 50, np.log1p(step), 0.0)
    values = np.exp(np.log(1000.0) + level + 0.03 * rng.standard_normal(60))
    refs = [None] + [0 if repin is None or t < repin else repin for t in range(1, 60)]
    q = level - np.where([r == repin and repin is not None for r in refs], offset, 0.0)
    ratios = [None] + [float(np.exp(q[t] + 0.015 * rng.standard_normal())) for t in range(1, 60)]
    return values.tolist(), ratios, [None] + [0.015] * 59, refs


@pytest.mark.parametrize("seed", [4, 5, 6, 7])
def test_a_reference_series_finds_a_small_step_that_the_host_noise_hides(seed):
    # issue #12: a 4 % step under 3 % host noise is lost in the values for days, but every
    # night's ratio against the same reference build measures it again with the host's noise
    # cancelled: found on its night (within one) four nights after it.
    values, ratios, se, refs = _reference_series(-0.04, seed)
    assert not [c for c in detect(values[:54]) if c.index >= 45]
    [cp] = [c for c in detect(values[:54], reference_ratios=ratios[:54], reference_se=se[:54], reference=refs[:54])
            if c.index >= 45]
    assert abs(cp.index - 50) <= 1 and cp.direction == "regression"


@pytest.mark.parametrize("seed", [4, 5, 6, 7])
def test_a_new_reference_is_not_a_change_and_a_step_is_measured_against_one_reference(seed):
    # Re-pinning the reference to a build 4 % faster moves every later ratio by 4 %; the builds'
    # level did not move.
    values, ratios, se, refs = _reference_series(0.0, seed, repin=30, offset=0.04)
    assert detect(values, reference_ratios=ratios, reference_se=se, reference=refs) == []
    # A step four nights after a re-pin is measured against the new reference only.
    values, ratios, se, refs = _reference_series(-0.04, seed, repin=46, offset=0.04)
    found = detect(values[:58], reference_ratios=ratios[:58], reference_se=se[:58], reference=refs[:58])
    assert [abs(c.index - 50) <= 1 for c in found] == [True]
    if seed in (5, 7):
        # Read as one reference, the re-pin's 4 % leaks into the step: the test can fail.
        one = [None] + [0] * 57
        assert [abs(c.index - 50) <= 1 for c in detect(values[:58], reference_ratios=ratios[:58],
                                                       reference_se=se[:58], reference=one)] != [True]


def test_a_nights_own_pairs_count_beside_the_reference_series():
    # issue #12: where a night has both, its pairs and the reference series measure one step;
    # the detector combines them (GLS: they share tonight's build's runs). A 3 % step under 3 %
    # host noise on its second night, 120 seeded bench series of three kinds: found in 16 (the
    # reference step replacing the night's pairs, as before: 6), and no alarm before the step.
    from bench.series import make_series

    found = early = 0
    for kind in ("gaussian", "heavy", "drift"):
        for i in range(40):
            s = make_series(kind, 0.03, 0.03, (11, 1, i))
            t = 62
            cps = detect(s.values[:t], paired_ratios=s.ratios[:t], paired_se=s.ratio_se[:t],
                         unchanged=s.unchanged[:t], reference_ratios=s.ref_ratios[:t],
                         reference_se=s.ref_se[:t], reference=s.reference[:t])
            found += any(abs(c.index - 60) <= 1 for c in cps)
            early += any(c.index < 55 for c in cps)
    assert found >= 13 and early == 0


# The parts of `detect` (issue #34), each fed a series whose answer is known: 0.1 % noise around
# 1000 (too small to matter), with a step where one is made.


def _steady(n: int, step_at: int | None = None, step: float = 0.9) -> list[float]:
    v = noisy(n, noise=0.001, seed=34)
    if step_at is not None:
        v[step_at:] *= step
    return v.tolist()


def _ctx(values: list[float], min_persist: int = 2, **builds: Any) -> changepoint._Search:
    """The searches' view of `values` with every night taking part (no newest night held back)."""
    keys = ("paired_ratios", "paired_se", "unchanged", "reference_ratios", "reference_se", "reference")
    series = changepoint._prepare(values, **{k: builds.get(k) for k in keys})
    assert series is not None
    return changepoint._Search.of(series, len(values), min_persist, changepoint.DEFAULT_ALPHA)


def test_line_step_separates_a_step_from_the_drift_it_sits_on() -> None:
    k = np.arange(12)
    for step in (0.05, 0.0):
        y = 0.1 + 0.01 * k + step * (k >= 6)
        cs, ck = np.concatenate(([0.0], np.cumsum(y))), np.concatenate(([0.0], np.cumsum(k * y)))
        d, v = changepoint._line_step(cs, ck, np.array([0]), np.array([12]), np.array([6]))
        # The plain difference of the means would also count the line's 0.06 as a step.
        assert d[0] == pytest.approx(step, abs=1e-12)
        x = np.stack([np.ones(12), k, k >= 6], axis=1)
        assert v[0] == pytest.approx(np.linalg.inv(x.T @ x)[2, 2], rel=1e-9)


def test_pooled_sd_is_the_residual_sd_around_each_segments_mean() -> None:
    y = np.array([0.0, 0.02, 0.0, 0.02, 1.0, 1.02, 1.0, 1.02])
    pooled, tq = changepoint._pooled_sd(y, [0, 4, 8], sigma=0.5)
    assert pooled == pytest.approx(np.sqrt(8 * 0.01**2 / 6), rel=1e-9)  # 8 residuals of 0.01, 6 dof
    assert tq == pytest.approx(2.446912, rel=1e-6)  # Student t, 97.5 %, 6 dof
    # No degree of freedom left: the series' noise scale instead.
    assert changepoint._pooled_sd(y[:2], [0, 1, 2], sigma=0.5)[0] == 0.5


def test_a_paired_ratio_confirms_only_a_move_its_own_way_on_a_changed_build() -> None:
    ratios = [None, 1.0, 1.0, 1.0, 0.9]
    se = [None, 0.01, 0.01, 0.01, 0.01]
    builds = changepoint._Builds.of(list(range(5)), 0.01, ratios, se, None, None, None, None)
    assert builds.confirmed(4, -0.1)
    assert not builds.confirmed(4, 0.1)  # the builds moved the other way
    assert not builds.confirmed(3, -0.1)  # the builds did not move
    unchanged = changepoint._Builds.of(list(range(5)), 0.01, ratios, se, [False] * 4 + [True], None, None, None)
    assert not unchanged.confirmed(4, -0.1)  # the same binary as the night before


def test_the_newest_nights_jump_is_held_back_unless_the_builds_confirm_it() -> None:
    values = _steady(30, step_at=29)
    series = changepoint._prepare(values, None, None, None, None, None, None)
    assert series is not None
    assert changepoint._nights(series, min_persist=2) == 29
    assert changepoint._nights(series, min_persist=1) == 30
    confirmed = changepoint._prepare(values, [None] + [1.0] * 28 + [0.9], None, None, None, None, None)
    assert confirmed is not None and changepoint._nights(confirmed, min_persist=2) == 30


def test_stat_vetoes_a_step_the_builds_side_by_side_did_not_make() -> None:
    def stat(night_ratio: float | None) -> tuple[float, float, bool]:
        ratios: list[float | None] = [None] + [1.0] * 15
        ratios[10] = night_ratio
        ctx = _ctx(_steady(16, step_at=10), paired_ratios=ratios, paired_se=[None] + [0.005] * 15)
        z, d, veto, from_ref = changepoint._stat(ctx, 0, 16, np.array([10]), 0, 0, True)
        assert not from_ref[0]
        return float(z[0]), float(d[0]), bool(veto[0])

    z, values_step, veto = stat(None)  # no ratio that night: the values' step alone
    assert z < -10 and values_step == pytest.approx(np.log(0.9), abs=2e-3) and not veto
    z, d, veto = stat(0.9)  # the builds made the same move
    assert z < -10 and d == pytest.approx(np.log(0.9), abs=2e-3) and not veto
    z, d, veto = stat(1.0)  # the builds did not move: 20 standard errors off
    assert veto and values_step < d < 0  # weighed in, the ratio pulls toward no change


def test_span_gives_each_search_its_ages_and_caps() -> None:
    ctx = _ctx(_steady(60))
    assert changepoint._span(ctx, 0, 60, 0) == (2, 4, 40, 0)  # 2-4 nights old
    assert changepoint._span(ctx, 0, 60, 1) == (5, 8, 40, 0)  # 5-8
    assert changepoint._span(ctx, 0, 60, -1) == (2, 58, 30, 30)  # every position
    assert changepoint._span(ctx, 0, 3, -1) is None  # no split leaves 2 nights a side
    assert changepoint._span(_ctx(_steady(60), min_persist=3), 0, 60, -1)[0] == 3


def test_segmentation_finds_the_step_and_the_merge_drops_a_split_it_explains() -> None:
    ctx = _ctx(_steady(40, step_at=20))
    assert changepoint._segment(ctx) == [20]
    assert changepoint._merge(ctx, [10, 20]) == [20]
    assert changepoint._segment(_ctx(_steady(40))) == []


def test_report_estimates_the_levels_around_a_change_and_drops_a_negligible_one() -> None:
    values = _steady(40, step_at=20)
    ctx = _ctx(values)
    [cp] = changepoint._report(ctx, [20], higher_is_better=True, min_change=0.015)
    assert (cp.index, cp.direction) == (20, "regression")
    # Each level is the mean of (at most _LEFT) nights of its own regime.
    assert cp.before_mean == pytest.approx(np.mean(values[:20]), rel=1e-12)
    assert cp.after_mean == pytest.approx(np.mean(values[20:]), rel=1e-12)
    assert (cp.before_mean, cp.after_mean) == pytest.approx((1000.0, 900.0), abs=1)
    assert cp.change == pytest.approx(-0.1, abs=2e-3) and cp.ci_low < cp.change < cp.ci_high
    assert changepoint._report(ctx, [20], higher_is_better=False, min_change=0.015)[0].direction == "improvement"
    assert changepoint._report(ctx, [20], higher_is_better=True, min_change=0.2) == []
