"""One repetition of the wall-clock scenario of issue #12 (tests/scenario.py; ten of them, with
figures, are bench/perf_scenario.py): on a real embedded farm, quiet nightlies whose commits
change the binary but not its speed, a commit that makes iiBench's insert loop take 5 % longer
in wall-clock time, a quiet night, the revert. The slowdown must be alarmed on its first night,
at its revision, as a regression, and no quiet night may raise an alarm."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy import stats

from gearfarm.perf.pairs import TRIM
from tests.scenario import Scenario, describe


# Longer than the suite's 900 s: its nights measure until the host's noise allows a 0.75 % error
# or 400 pairs, and on a noisy 2-core VM they reach the 400 (measured November 26 on the code
# before and after issue #33 alike: nights 2-5 took 663 s and 755 s), so the two repetitions
# the test may need outlast 900 s.
@pytest.mark.timeout(1800)
def test_a_5_percent_wall_clock_slowdown_is_flagged_on_its_first_night_and_no_quiet_night_alarms(
        tmp_path: Path) -> None:
    sc = Scenario(tmp_path)
    sc.start()
    try:
        res = sc.repetition(quiet=3, after=1)
        story = "\n".join(describe(n) for n in res["nights"])
        if not res["flagged"]:
            # The goal is 9 flagged in 10 (bench/perf_scenario.py measures it): one miss in a
            # single repetition is within it, two in a row are not (and no quiet night of
            # either may alarm).
            assert not res["false_alarms"], story
            res = sc.repetition(quiet=2, after=1)
            story += "\n(missed; a second repetition)\n" + "\n".join(describe(n) for n in res["nights"])
    finally:
        sc.stop()
    print(story)
    assert res["flagged"], story
    assert not res["false_alarms"], story
    slow = res["slow"].figure
    assert slow and sc.pairs <= slow["pairs"] <= sc.most_pairs and slow["ci_high"] < 0, story
    for n in res["nights"]:
        # Measured alone: no other farm job on the host while any night's pairs ran.
        assert n.figure and n.figure["quietness"]["other_jobs_max"] == 0, story
        # Adaptive pairs: each night ran pairs until its estimate was as precise as asked.
        k = n.figure["pairs"]
        if k and k < sc.most_pairs:
            half = (math.log1p(n.figure["ci_high"]) - math.log1p(n.figure["ci_low"])) / 2
            assert half <= stats.t.ppf(0.975, k - 2 * int(TRIM * k) - 1) * sc.precision * 1.0001, story
