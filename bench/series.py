"""Seeded synthetic nightly series for bench/otava_compare.py (and the detector's tests).

One series is 80 nights of one benchmark metric: 60 nights before a step and 20 after it (the step,
when there is one, is on night STEP_AT = 60), with the farm's side information for every night:

* values: 100 x level x exp(noise x e), e of unit variance, where the kind of noise is
  - "gaussian": e ~ N(0, 1);
  - "heavy":    Student-t with 3 degrees of freedom scaled to unit variance (t3 / sqrt 3);
  - "outliers": Gaussian, plus 2-4 single-night spikes of 10-20 % (either sign) at random,
                non-adjacent nights; in half the series one of them falls within 3 nights of
                night 60 (the step night in step series);
  - "drift":    Gaussian, on a level that drifts slowly: a linear trend of up to +-2 % over the 80
                nights plus a random walk of 0.08 % a night (about 0.7 % after 80 nights), so the
                whole drift stays within about 3 %: nobody would call it a step.
  The noise level is the row's relative SD (1 % or 3 %); the step multiplies the level from night
  60 on by 1 +- step (sign at random).
* unchanged[t]: night t's build is identical to night t-1's (no engine commit that night). Each
  night 1..79 independently with probability 0.3, never night 60 (a step needs a new build).
* ratios[t]: the farm's paired A/B measurement, night t's build against the previous night's build,
  run interleaved on one host, so the host's noise cancels and what is left is the builds'
  difference times the pairs' own noise: ratio_t = level_t / level_{t-1} x exp(u_t) (the level
  includes the drift, whose night-to-night part is below 0.1 %),
  u_t ~ N(0, se), se per series uniform in [1 %, 3 %] (measured on the farm's 2-core VM: a night's
  5 A/B pairs of a wall-clock benchmark give a trimmed-mean standard error of the log ratio around
  2-3 %; 1 % is a quieter host or a steadier metric). On an unchanged night the true ratio is
  exactly 1 (the same binary on both sides); only u_t is left. A spike in the values is a bad
  night of the host and does not show in the ratio. Night 0 has no ratio (None).
* ratio_se[t]: se, the standard error of log(ratios[t]) the farm reports with it.
* ref_ratios[t]: the third side of the night's runs (issue #12): night t's build against the
  target's reference build, a build the farm pins and keeps for REF_NIGHTS nights (Chromium's perf
  bots run a pinned reference build beside every test for the same reason), then re-pins to the
  last good build of that night. The pins fall every REF_NIGHTS nights from a phase drawn per
  series (a re-pin is not aligned with anything the code does). reference[t] is the night whose
  build was the reference (the series' first build before the first re-pin). The same runs of
  night t's build serve both sides, so the ratio's noise shares their part with ratios[t]: with
  per-side run noise of variance se^2/2, log ref_ratio_t = B_t - B_ref + e_T - e_R (B the build's
  level: it moves only on nights whose build changed) has standard error se and correlation 1/2
  with log ratio_t. ref_se[t] = se. Night 0 has none.
* pairs[t]: the night's PAIRS A/B pairs themselves (log ratios), which the nightly's own paired
  test (gearfarm/perf/analysis.py: paired_changes) judges: their mean is log ratios[t] and their scatter
  that of PAIRS pairs whose mean has standard error se (each pair's noise N(0, se^2 PAIRS),
  centred on the night's mean, which for normal noise leaves the scatter independent of it).
  Night 0 has none.

Everything is a pure function of the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LENGTH = 80
STEP_AT = 60
KINDS = ("gaussian", "heavy", "outliers", "drift")
NOISES = (0.01, 0.03)
STEPS = (0.02, 0.03, 0.05, 0.10)
UNCHANGED_P = 0.3
REF_NIGHTS = 28
PAIRS = 5


@dataclass(frozen=True)
class Series:
    kind: str
    noise: float
    step: float  # signed relative step at STEP_AT, 0.0 for a step-free series
    values: list[float]
    unchanged: list[bool]
    ratios: list[float | None]
    ratio_se: list[float | None]
    ref_ratios: list[float | None]
    ref_se: list[float | None]
    reference: list[int | None]
    pairs: list[tuple[float, ...] | None]

    @property
    def step_at(self) -> int | None:
        return STEP_AT if self.step else None


def make_series(kind: str, noise: float, step: float, seed: tuple[int, ...]) -> Series:
    """One series of `kind` with relative noise `noise` and a step of |step| (0 = none) at STEP_AT."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    rng = np.random.default_rng([*seed, KINDS.index(kind), int(round(noise * 1e4)), int(round(abs(step) * 1e4))])
    n = LENGTH
    log_level = np.zeros(n)
    signed = 0.0
    if step:
        signed = float(rng.choice([-1.0, 1.0])) * abs(step)
        log_level[STEP_AT:] += np.log1p(signed)
    drift = np.zeros(n)
    if kind == "drift":
        drift = rng.uniform(-0.02, 0.02) * np.arange(n) / (n - 1)
        drift += np.concatenate(([0.0], np.cumsum(rng.normal(0.0, 0.0008, n - 1))))
    if kind == "heavy":
        e = rng.standard_t(3, n) / np.sqrt(3.0)
    else:
        e = rng.standard_normal(n)
    y = np.log(100.0) + log_level + drift + noise * e
    if kind == "outliers":
        k = int(rng.integers(2, 5))
        nights: list[int] = []
        if rng.random() < 0.5:
            nights.append(int(rng.integers(STEP_AT - 3, STEP_AT + 4)))
        while len(nights) < k:
            t = int(rng.integers(1, n))
            if all(abs(t - u) >= 2 for u in nights):
                nights.append(t)
        for t in nights:
            y[t] += np.log1p(float(rng.choice([-1.0, 1.0])) * rng.uniform(0.10, 0.20))
    unchanged = [False] + [bool(u) for u in rng.random(n - 1) < UNCHANGED_P]
    unchanged[STEP_AT] = False
    se = float(rng.uniform(0.01, 0.03))
    true_log_ratio = np.diff(log_level + drift)
    u = rng.normal(0.0, se, n - 1)
    ratios: list[float | None] = [None]
    for t in range(1, n):
        ratios.append(float(np.exp(u[t - 1] + (0.0 if unchanged[t] else true_log_ratio[t - 1]))))
    # The reference side draws from a stream of its own, so values, unchanged and ratios stay
    # what they were before it existed (and with them Otava's figures).
    ref_rng = np.random.default_rng([*seed, 1 + KINDS.index(kind), int(round(noise * 1e4)),
                                     int(round(abs(step) * 1e4)), 2])
    build = log_level + drift
    for t in range(1, n):
        if unchanged[t]:
            build[t] = build[t - 1]
    phase = int(ref_rng.integers(1, REF_NIGHTS + 1))
    reference: list[int | None] = [None]
    ref_ratios: list[float | None] = [None]
    for t in range(1, n):
        pins = [p for p in range(phase, t + 1, REF_NIGHTS)]
        ref = pins[-1] - 1 if pins else 0
        # e_T given e_T - e_G = u (both of variance se^2/2): mean u/2, variance se^2/4.
        e_t = u[t - 1] / 2 + ref_rng.normal(0.0, se / 2)
        e_r = ref_rng.normal(0.0, se / math.sqrt(2))
        reference.append(ref)
        ref_ratios.append(float(np.exp(build[t] - build[ref] + e_t - e_r)))
    # The pairs draw from a stream of their own too, so everything above stays as it was.
    pair_rng = np.random.default_rng([*seed, 1 + KINDS.index(kind), int(round(noise * 1e4)),
                                      int(round(abs(step) * 1e4)), 3])
    pairs: list[tuple[float, ...] | None] = [None]
    for t in range(1, n):
        e = pair_rng.normal(0.0, se * math.sqrt(PAIRS), PAIRS)
        pairs.append(tuple(float(x) for x in math.log(ratios[t] or 1.0) + e - e.mean()))
    return Series(kind=kind, noise=noise, step=signed, values=np.exp(y).tolist(), unchanged=unchanged,
                  ratios=ratios, ratio_se=[None] + [se] * (n - 1), ref_ratios=ref_ratios,
                  ref_se=[None] + [se] * (n - 1), reference=reference, pairs=pairs)
