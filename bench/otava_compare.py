"""Compare gearfarm's change-point detector (gearfarm/perf/changepoint.py) with Apache Otava's defaults.

Every detector sees the same seeded synthetic nightly series (bench/series.py: 80 nights, a step
of 2, 3, 5 or 10 % on night 60 or none, four kinds of noise at 1 % and 3 %, and the farm's side
information), replayed night by night the way the farm uses it: on night t (from night 10 on) the
detector gets nights 0..t, and an index it reports that is not within +-TOL nights of an index it
already alarmed on is that morning's alarm.

Detectors:

* "Otava 0.8.0 defaults": `otava.analysis.compute_change_points(values)` (window 50, max p-value
  0.001, min magnitude 0), values only;
* "gearfarm": `detect(values)`, values only;
* "gearfarm + farm info": `detect(values, paired_ratios=..., paired_se=..., unchanged=...)`: also
  which nights' builds were identical to the night before's, and the nightly paired A/B ratio of
  each night's build against the previous night's with its standard error;
* "gearfarm + farm info + night test": what the nightly's report alarms on, the change points of
  "gearfarm + farm info" and the nights whose own A/B pairs alone show a change (the night's
  paired test, gearfarm/perf/analysis.py: paired_changes, on the series' PAIRS pairs a night). Its false
  alarms are the farm's: the paired test judges every night of every metric on its own.

One table row per (kind, noise, step size), with per detector: detections (the step alarmed within
+-TOL of night 60 by the last night, out of N step series), the median delay over the detected
series (nights of the new regime seen when first alarmed, 1 = on the first bad night), and the
false alarms on the step-free series of the row's kind and noise (every alarm there is false:
alarm count, and series with any). A gearfarm variant dominates Otava in a row when it detects at
least as many steps, with a median delay no longer than Otava's, and raises at most a quarter of
Otava's false alarms (none when Otava raises none).

Run: .venv/bin/python bench/otava_compare.py [--series N] [--null-series M] [--jobs J] [--seed S]
     [--kinds gaussian,drift] [--noises 0.03]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.series import KINDS, LENGTH, NOISES, STEP_AT, STEPS, Series, make_series  # noqa: E402
from gearfarm.hosts.hostlock import HostLock  # noqa: E402
from gearfarm.perf.analysis import paired_changes  # noqa: E402
from gearfarm.perf.changepoint import detect  # noqa: E402
from gearfarm.perf.pairs import Paired  # noqa: E402

FIRST_NIGHT = 10  # nights before this are history only: nobody alarms on a 5-night series
TOL = 2
CACHE = Path(os.environ.get("GEARFARM_CACHE", Path.home() / ".cache" / "gearfarm")) / "otava-compare"
OTAVA = "Otava 0.8.0 defaults"
GEARFARM = "gearfarm"
GEARFARM_NIGHTLY = "gearfarm + nightly ratios"
GEARFARM_INFO = "gearfarm + farm info"
GEARFARM_FARM = "gearfarm + farm info + night test"


def otava_version() -> str:
    from importlib.metadata import version

    return version("apache-otava")


def otava(s: Series, t: int) -> list[int]:
    from otava.analysis import compute_change_points

    cps, _weak = compute_change_points(s.values[: t + 1])
    return [int(c.index) for c in cps]


def gearfarm(s: Series, t: int) -> list[int]:
    return [c.index for c in detect(s.values[: t + 1])]


def gearfarm_nightly(s: Series, t: int) -> list[int]:
    return [c.index for c in detect(s.values[: t + 1], paired_ratios=s.ratios[: t + 1],
                                    paired_se=s.ratio_se[: t + 1], unchanged=s.unchanged[: t + 1])]


def gearfarm_info(s: Series, t: int) -> list[int]:
    return [c.index for c in detect(s.values[: t + 1], paired_ratios=s.ratios[: t + 1],
                                    paired_se=s.ratio_se[: t + 1], unchanged=s.unchanged[: t + 1],
                                    reference_ratios=s.ref_ratios[: t + 1], reference_se=s.ref_se[: t + 1],
                                    reference=s.reference[: t + 1])]


def paired_nights(s: Series) -> set[int]:
    """The nights whose own pairs alone alarm in the nightly (a night's test reads only that
    night's pairs and earlier nights' scatter, so judging the whole series at once is its replay)."""
    nights = [Paired(p or ()) for p in s.pairs]
    return {c.index for c in paired_changes([(str(t), v) for t, v in enumerate(s.values)], nights, True,
                                            unchanged=s.unchanged)}


DETECTORS: dict[str, Callable[[Series, int], list[int]]] = {
    OTAVA: otava, GEARFARM: gearfarm, GEARFARM_NIGHTLY: gearfarm_nightly, GEARFARM_INFO: gearfarm_info}
# Detectors made of others: their reports each night, plus the nightly's paired test that night.
UNIONS = {GEARFARM_FARM: GEARFARM_INFO}
DEFAULT = (OTAVA, GEARFARM, GEARFARM_INFO, GEARFARM_FARM)


def reports(name: str, s: Series) -> list[list[int]]:
    """What one detector reports on each night of the replay (night t sees nights 0..t)."""
    fn = DETECTORS[name]
    return [fn(s, t) for t in range(FIRST_NIGHT, LENGTH)]


def alarms(nightly: list[list[int]]) -> list[tuple[int, int]]:
    """The alarms of a replay's reports as (night, index): an index not within +-TOL of one
    already alarmed on is that morning's alarm."""
    out: list[tuple[int, int]] = []
    for t, found in enumerate(nightly, FIRST_NIGHT):
        for j in found:
            if not any(abs(j - a) <= TOL for _, a in out):
                out.append((t, j))
    return out


def replay(name: str, s: Series) -> list[tuple[int, int]]:
    """Night-by-night replay of one series through one detector: its alarms as (night, index)."""
    return alarms(reports(name, s))


def delay(alarms: list[tuple[int, int]]) -> int | None:
    """Nights of the new regime seen when the step was first alarmed (None: never)."""
    for t, j in alarms:
        if t >= STEP_AT and abs(j - STEP_AT) <= TOL:
            return t - STEP_AT + 1
    return None


def _job(args: tuple[tuple[str, ...], tuple]) -> dict[str, list[tuple[int, int]]]:
    names, (kind, noise, step, seed) = args
    s = make_series(kind, noise, step, seed)
    # The bench is a build-like job on the host: it holds the host lock shared, one series (a few
    # seconds) at a time, so a farm perf job that wants the host to itself (exclusive) waits at
    # most one series per process and then measures alone, not beside this CPU-bound replay.
    with HostLock().shared("detector bench"):
        raw = {name: reports(name, s) for name in {UNIONS.get(n, n) for n in names}}
        if any(n in UNIONS for n in names):
            paired = paired_nights(s)
            for n in names:
                if n in UNIONS:
                    raw[n] = [found + ([t] if t in paired else [])
                              for t, found in enumerate(raw[UNIONS[n]], FIRST_NIGHT)]
        return {name: alarms(raw[name]) for name in names}


def _dominates(det: int, med: float | None, fa: int, o_det: int, o_med: float | None, o_fa: int) -> str:
    fails = []
    if det < o_det:
        fails.append(f"detections {det} < {o_det}")
    if o_med is not None and med is not None and med > o_med:
        fails.append(f"median {med:g} > {o_med:g}")
    if 4 * fa > o_fa:
        fails.append(f"false alarms {fa} > {o_fa}/4")
    return "yes" if not fails else "no: " + ", ".join(fails)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=20, help="step series per row (default 20)")
    ap.add_argument("--null-series", type=int, default=40,
                    help="step-free series per (kind, noise) for the false alarms (default 40)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--detectors", default=",".join(DEFAULT),
                    help="comma-separated subset of: " + ", ".join([*DETECTORS, *UNIONS]))
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of: " + ", ".join(KINDS))
    ap.add_argument("--noises", default=",".join(f"{x:g}" for x in NOISES),
                    help="comma-separated subset of: " + ", ".join(f"{x:g}" for x in NOISES))
    args = ap.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    asked = {v.strip() for v in args.noises.split(",") if v.strip()}
    noises = [x for x in NOISES if f"{x:g}" in asked]
    bad = [k for k in kinds if k not in KINDS] + sorted(asked - {f"{x:g}" for x in NOISES})
    if bad or not kinds or not noises:
        ap.error(f"--kinds/--noises: unknown or empty {', '.join(bad) or 'selection'}; choose from "
                 f"{', '.join(KINDS)} and {', '.join(f'{x:g}' for x in NOISES)}")
    names = tuple(n.strip() for n in args.detectors.split(",") if n.strip())
    for n in names:
        if n not in DETECTORS and n not in UNIONS:
            ap.error(f"unknown detector {n!r}")
    specs = [(k, noise, step, (args.seed, 1, i)) for k in kinds for noise in noises for step in STEPS
             for i in range(args.series)]
    specs += [(k, noise, 0.0, (args.seed, 0, i)) for k in kinds for noise in noises for i in range(args.null_series)]
    started = time.time()
    # Otava's replay depends on the values alone, which the seed fixes: it is kept between runs
    # (it is most of a run's time), keyed by everything it depends on.
    cache_file = CACHE / f"otava-{otava_version()}-{args.seed}.json"
    cached: dict[str, list[list[int]]] = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    todo = [(tuple(n for n in names if n != OTAVA or repr(sp) not in cached), sp) for sp in specs]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_job, todo, chunksize=4))
    for (_, sp), res in zip(todo, results, strict=True):
        if OTAVA in names:
            res[OTAVA] = cached.setdefault(repr(sp), res.get(OTAVA))  # type: ignore[arg-type]
    if OTAVA in names:
        CACHE.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps(cached))
    elapsed = time.time() - started
    by_spec = dict(zip([sp[:3] + (sp[3][1:],) for sp in specs], results, strict=True))

    def fa(name: str, kind: str, noise: float) -> tuple[int, int]:
        runs = [by_spec[(kind, noise, 0.0, (0, i))][name] for i in range(args.null_series)]
        return sum(len(r) for r in runs), sum(bool(r) for r in runs)

    print(f"{args.series} step series per row, {args.null_series} step-free series per kind and noise, "
          f"{LENGTH} nights (step on night {STEP_AT}), replayed from night {FIRST_NIGHT}, detection within "
          f"+-{TOL} nights; seed {args.seed}; {elapsed:.0f} s on {args.jobs} processes\n")
    head = ["kind", "noise", "step"]
    for n in names:
        head += [f"{n}: found", "median delay", "false alarms (series)"]
    gf = [n for n in names if n != OTAVA]
    if OTAVA in names:
        head += [f"{n} dominates Otava?" for n in gf]
        # Information, not part of the verdict: a detector that finds more steps finds harder
        # ones, later, which lengthens its median over what it found; on the series both found
        # the two delays are compared on the same steps.
        head += [f"median delay on the series both found (Otava / {n})" for n in gf]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    dominated = dict.fromkeys(gf, 0)
    rows = 0
    for kind in kinds:
        for noise in noises:
            fas = {n: fa(n, kind, noise) for n in names}
            for step in STEPS:
                rows += 1
                cells = [kind, f"{noise:.0%}", f"{step:.0%}"]
                stat = {}
                delays = {}
                for n in names:
                    ds = delays[n] = [delay(by_spec[(kind, noise, step, (1, i))][n]) for i in range(args.series)]
                    hit = [d for d in ds if d is not None]
                    med = statistics.median(hit) if hit else None
                    stat[n] = (len(hit), med, fas[n][0])
                    cells += [f"{len(hit)}/{args.series}", "-" if med is None else f"{med:g}",
                              f"{fas[n][0]} ({fas[n][1]}/{args.null_series})"]
                if OTAVA in names:
                    for n in gf:
                        verdict = _dominates(*stat[n], *stat[OTAVA])
                        dominated[n] += verdict == "yes"
                        cells.append(verdict)
                    for n in gf:
                        both = [(o, g) for o, g in zip(delays[OTAVA], delays[n], strict=True)
                                if o is not None and g is not None]
                        cells.append(f"{statistics.median(o for o, _ in both):g} / "
                                     f"{statistics.median(g for _, g in both):g} ({len(both)})" if both else "-")
                print("| " + " | ".join(cells) + " |")
    if OTAVA in names:
        print()
        for n in gf:
            print(f"{n} dominates Otava in {dominated[n]} of {rows} rows")
    print(f"\nelapsed: {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
