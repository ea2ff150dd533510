"""changepoint.detect against its recorded output: every change point it finds in seeded
bench series (bench/series.py, the series bench/otava_compare.py scores), with and without the
farm's side information and at several nights of each series, compared with
tests/fixtures/changepoint_bench.json. The fixture was written by the detector as it was
before it was split into named parts (issue #34), so a refactoring that finds another change
point, or moves a figure by more than a billionth of itself, fails here. Not bit for bit: numpy
picks its sums' SIMD kernels by the CPU, and on an AVX-512 machine 38 of the 1,200 calls came
out different in their last bits (at most 2.3e-13 of the figure; an AMD EPYC, November 28).
Regenerate it only for a deliberate change of the detector:
`.venv/bin/python tests/perf/test_changepoint_fixture.py --write`, and say why in the commit."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench/ when run as a script

from bench.series import KINDS, NOISES, STEPS, make_series  # noqa: E402
from gearfarm.perf.changepoint import detect  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "changepoint_bench.json"
SEEDS = ((34, 1), (34, 2))
NIGHTS = (59, 60, 62, 65, 79)  # the last night each call sees: before, at and after the step
MODES = ("values", "nightly", "info")


def _call(s: Any, t: int, mode: str) -> list[dict[str, Any]]:
    kw: dict[str, Any] = {}
    if mode in ("nightly", "info"):
        kw.update(paired_ratios=s.ratios[: t + 1], paired_se=s.ratio_se[: t + 1], unchanged=s.unchanged[: t + 1])
    if mode == "info":
        kw.update(reference_ratios=s.ref_ratios[: t + 1], reference_se=s.ref_se[: t + 1],
                  reference=s.reference[: t + 1])
    higher = (t + len(mode)) % 2 == 0  # both directions of "better", spread over the calls
    return [{k: (v.hex() if isinstance(v, float) else v) for k, v in vars(c).items()}
            for c in detect(s.values[: t + 1], higher, **kw)]


def outputs() -> dict[str, list[dict[str, Any]]]:
    out = {}
    for seed in SEEDS:
        for kind in KINDS:
            for noise in NOISES:
                for step in (0.0, *STEPS):
                    s = make_series(kind, noise, step, seed)
                    for t in NIGHTS:
                        for mode in MODES:
                            out[f"{seed}/{kind}/{noise}/{step}/{t}/{mode}"] = _call(s, t, mode)
    return out


# How far a figure may be from its recorded value, relative to it (see the header).
RELATIVE = 1e-9


def _same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    """The same change points, every figure within RELATIVE of the recorded one (figures are
    recorded as float.hex strings), everything else equal."""

    def figure(v: Any) -> float | None:
        return float.fromhex(v) if isinstance(v, str) and v.lstrip("-").startswith("0x") else None

    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g.keys() != w.keys():
            return False
        for k, wv in w.items():
            a, b = figure(g[k]), figure(wv)
            if b is None or a is None:
                if g[k] != wv:
                    return False
            elif abs(a - b) > RELATIVE * abs(b):
                return False
    return True


def test_detect_finds_exactly_the_recorded_change_points_on_the_bench_series() -> None:
    want = json.loads(FIXTURE.read_text())
    got = outputs()
    assert got.keys() == want.keys()
    differ = [k for k in want if not _same(got[k], want[k])]
    assert not differ, f"{len(differ)} of {len(want)} calls differ, first {differ[0]}: " \
                       f"{got[differ[0]]} != {want[differ[0]]}"
    # The fixture is not empty: it holds change points of every direction and of both kinds
    # of series, so a detector that found nothing would fail above.
    found = [c for v in want.values() for c in v]
    assert {c["direction"] for c in found} == {"regression", "improvement"} and len(found) > 100


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        FIXTURE.write_text(json.dumps(outputs(), indent=0, sort_keys=True) + "\n")
        print(f"wrote {FIXTURE}")
