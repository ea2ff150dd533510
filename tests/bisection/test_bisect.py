"""The bisection search (gearfarm/bisection/search.py) with revisions judged by rule: every culprit
position is found within log2 probes, unbuildable commits are skipped like `git bisect skip`,
the budget stops it with the range so far, and a flaky verdict stops it saying so."""

from __future__ import annotations

import math

import pytest

from gearfarm.bisection.search import Budget, Probe, judge_test, search

REVS = [f"c{i:02d}" + "0" * 37 for i in range(1, 17)]  # c01 (last good) .. c16 (first bad)


def _judge(culprit: int, unbuildable: frozenset[int] = frozenset(), flaky: frozenset[int] = frozenset(),
           built: list[str] | None = None):
    def judge(rev: str) -> Probe:
        i = REVS.index(rev)
        if built is not None:
            built.append(rev)
        if i in unbuildable:
            return Probe(rev, "skip", built=True, jobs=1)
        if i in flaky:
            return Probe(rev, "flaky", built=True, jobs=2)
        return Probe(rev, "bad" if i >= culprit else "good", built=True, jobs=2)
    return judge


@pytest.mark.parametrize("culprit", range(1, 16))
def test_every_culprit_position_is_found_within_log2_of_the_suspects(culprit: int) -> None:
    judged: list[str] = []
    out = search(REVS, _judge(culprit, built=judged))
    assert out.state == "found" and out.culprit == REVS[culprit], out.message
    assert out.suspects == [REVS[culprit]]
    # Both ends, then at most ceil(log2(15)) = 4 middles.
    assert len(judged) - 2 <= math.ceil(math.log2(len(REVS) - 1))
    assert len(set(judged)) == len(judged), "a revision was judged twice"


def test_ends_judged_by_the_caller_are_not_judged_again() -> None:
    judged: list[str] = []
    ends = (Probe(REVS[0], "good"), Probe(REVS[-1], "bad"))
    out = search(REVS, _judge(10, built=judged), ends=ends)
    assert out.culprit == REVS[10] and REVS[0] not in judged and REVS[-1] not in judged
    assert out.builds == len(judged) <= 4


def test_an_unbuildable_middle_is_skipped_and_the_culprit_still_found() -> None:
    out = search(REVS, _judge(10, unbuildable=frozenset({7, 8})))
    assert out.state == "found" and out.culprit == REVS[10], out.message
    assert {p.rev for p in out.probes if p.verdict == "skip"} == {REVS[7], REVS[8]}


def test_when_only_unbuildable_commits_are_left_the_answer_is_their_range() -> None:
    # c06..c09 do not build and c10 is the culprit: it cannot be told from c06..c09.
    out = search(REVS, _judge(10, unbuildable=frozenset({6, 7, 8, 9})), budget=Budget(builds=20))
    assert out.state == "unbuildable" and out.culprit is None
    assert out.suspects == REVS[6:11], out.message
    assert "do not build" in out.message


def test_the_budget_stops_the_search_with_the_range_so_far() -> None:
    out = search(REVS, _judge(10), budget=Budget(builds=4))
    assert out.state == "budget" and out.culprit is None
    assert out.builds == 4 and REVS[10] in out.suspects and len(out.suspects) > 1
    assert "4 builds of 4" in out.message


def test_a_flaky_verdict_stops_the_search_and_names_the_revision() -> None:
    out = search(REVS, _judge(10, flaky=frozenset({7})))  # c08, the first middle
    assert out.state == "flaky" and out.culprit is None and REVS[7][:12] in out.message


@pytest.mark.parametrize("good, bad, state", [("good", "good", "no_culprit"), ("flaky", "bad", "flaky"),
                                              ("good", "flaky", "flaky"), ("bad", "bad", "flaky")])
def test_ends_that_do_not_disagree_are_not_bisected(good: str, bad: str, state: str) -> None:
    judged: list[str] = []
    out = search(REVS, _judge(10, built=judged), ends=(Probe(REVS[0], good), Probe(REVS[-1], bad)))  # type: ignore[arg-type]
    assert out.state == state and out.culprit is None and judged == []


def test_a_test_is_judged_by_all_its_repetitions() -> None:
    assert judge_test(["passed"] * 3) == "good"
    assert judge_test(["failed", "error", "failed"]) == "bad"
    assert judge_test(["failed", "passed", "failed"]) == "flaky"
    assert judge_test([]) == "skip" and judge_test(["skipped"]) == "skip"


def test_a_test_failure_that_does_not_come_back_is_flaky_not_no_culprit() -> None:
    out = search(REVS, _judge(10), ends=(Probe(REVS[0], "good"), Probe(REVS[-1], "good", jobs=4)), unreproduced="flaky")
    assert out.state == "flaky" and out.culprit is None and "did not come back in 4 runs" in out.message
