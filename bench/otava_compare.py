"""Compare gearfarm's change-point detector (gearfarm/changepoint.py) with Apache Otava's defaults.

Both detectors see the same seeded synthetic nightly series, replayed night by night the way the
farm uses them: on night t the detector gets nights 0..t and whatever it reports that was not
reported before (within +-TOL nights) is that morning's alarm. Series:

* step:  60 nights, 1-3 % Gaussian noise, one step of 2-10 % (either sign) at night 30-45;
* noise: the same noise and no step;
* spike: noise plus one single-night spike of 10-20 % (either sign) at night 15-55.

Measured: detection rate (the step alarmed within +-TOL of its night by the last night), nights
until detected (nights of the new regime seen when it was first alarmed, 1 = on the first bad
night), how often the alarmed index is exactly the first bad night, and false alarms (any other
alarm) per series and per night evaluated. Otava's defaults are `compute_change_points(values)`:
window 50, max p-value 0.001, min magnitude 0.

Run: .venv/bin/python bench/otava_compare.py [--series N] [--jobs J] [--seed S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gearfarm.changepoint import detect  # noqa: E402

LENGTH = 60
FIRST_NIGHT = 10  # nights before this are history only: nobody alarms on a 5-night series
TOL = 2


def make_series(kind: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    noise = rng.uniform(0.01, 0.03)
    level = np.ones(LENGTH)
    step_at = None
    if kind == "step":
        step_at = int(rng.integers(30, 46))
        level[step_at:] *= 1 + rng.choice([-1, 1]) * rng.uniform(0.02, 0.10)
    values = 100 * level * (1 + noise * rng.standard_normal(LENGTH))
    if kind == "spike":
        values[int(rng.integers(15, 56))] *= 1 + rng.choice([-1, 1]) * rng.uniform(0.10, 0.20)
    # Paired A/B ratio of each night's build against the last good (old-regime) build on one host:
    # host noise cancels, so only a small residual (0.5 %) is left, and a spike does not show.
    ratios = level / level[0] * (1 + 0.005 * rng.standard_normal(LENGTH))
    return {"kind": kind, "values": values.tolist(), "step_at": step_at, "ratios": ratios.tolist()}


def otava(values: list[float], ratios: list[float]) -> list[int]:
    from otava.analysis import compute_change_points

    cps, _weak = compute_change_points(values)
    return [int(c.index) for c in cps]


def gearfarm(values: list[float], ratios: list[float]) -> list[int]:
    return [c.index for c in detect(values)]


def gearfarm_paired(values: list[float], ratios: list[float]) -> list[int]:
    return [c.index for c in detect(values, paired_ratios=ratios)]


DETECTORS = {"Otava 0.8.0 defaults": otava, "gearfarm": gearfarm, "gearfarm + paired A/B": gearfarm_paired}


def replay(name: str, s: dict) -> dict:
    """Night-by-night replay of one series through one detector."""
    fn = DETECTORS[name]
    alarmed: list[int] = []
    detected_after = exact = None
    false_alarms = 0
    for t in range(FIRST_NIGHT, LENGTH):
        for j in fn(s["values"][: t + 1], s["ratios"][: t + 1]):
            if any(abs(j - a) <= TOL for a in alarmed):
                continue
            alarmed.append(j)
            if s["step_at"] is not None and abs(j - s["step_at"]) <= TOL and t >= s["step_at"]:
                if detected_after is None:
                    detected_after, exact = t - s["step_at"] + 1, j == s["step_at"]
            else:
                false_alarms += 1
    return {"kind": s["kind"], "detected_after": detected_after, "exact": exact, "false_alarms": false_alarms}


def _job(args: tuple[str, dict]) -> tuple[str, dict]:
    return args[0], replay(*args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=200, help="series of each kind (default 200)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=6)
    args = ap.parse_args()
    kinds = ("step", "noise", "spike")
    series = [make_series(k, args.seed * 1_000_003 + i * 3 + n) for i in range(args.series)
              for n, k in enumerate(kinds)]
    started = time.time()
    jobs = [(name, s) for name in DETECTORS for s in series]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_job, jobs, chunksize=20))
    nights = LENGTH - FIRST_NIGHT
    print(f"{args.series} series of each kind, {LENGTH} nights, replayed from night {FIRST_NIGHT}; "
          f"seed {args.seed}; {time.time() - started:.0f} s\n")
    print("| detector | detection rate | median nights to detect | mean nights | exact first bad night "
          "| false alarms: step series | noise series w/ alarm | per night | spike series w/ alarm | per night |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    delays_by: dict[str, list] = {}
    for name in DETECTORS:
        rs = [r for n, r in results if n == name]
        step = [r for r in rs if r["kind"] == "step"]
        hits = [r for r in step if r["detected_after"] is not None]
        delays_by[name] = [r["detected_after"] for r in step]
        cells = [name, f"{len(hits) / len(step):.1%}",
                 f"{statistics.median(r['detected_after'] for r in hits):g}" if hits else "-",
                 f"{statistics.mean(r['detected_after'] for r in hits):.2f}" if hits else "-",
                 f"{sum(bool(r['exact']) for r in hits) / max(1, len(hits)):.1%}",
                 f"{sum(r['false_alarms'] > 0 for r in step) / len(step):.1%}"]
        for kind in ("noise", "spike"):
            group = [r for r in rs if r["kind"] == kind]
            cells += [f"{sum(r['false_alarms'] > 0 for r in group) / len(group):.1%}",
                      f"{sum(r['false_alarms'] for r in group) / (len(group) * nights):.2%}"]
        print("| " + " | ".join(cells) + " |")
    # Head to head on the steps both found: is gearfarm ever later than Otava?
    base = delays_by["Otava 0.8.0 defaults"]
    print("\nOn step series both detected (nights until detected, gearfarm vs Otava):\n")
    print("| detector | series both found | median (gearfarm) | median (Otava) | earlier | same night | later |")
    print("|---|---|---|---|---|---|---|")
    for name in DETECTORS:
        if name == "Otava 0.8.0 defaults":
            continue
        both = [(g, o) for g, o in zip(delays_by[name], base, strict=True) if g is not None and o is not None]
        if not both:
            continue
        print(f"| {name} | {len(both)} | {statistics.median(g for g, _ in both):g} | "
              f"{statistics.median(o for _, o in both):g} | {sum(g < o for g, o in both)} | "
              f"{sum(g == o for g, o in both)} | {sum(g > o for g, o in both)} |")


if __name__ == "__main__":
    main()
