"""The bisection search (gearfarm/bisection/search.py) with revisions judged by rule: every culprit
position is found within log2 probes, unbuildable commits are skipped like `git bisect skip`,
the budget stops it with the range so far, and a flaky verdict stops it saying so. The search
of a group of failures (gearfarm/bisection/grouped.py): each revision judged once for all, every
failure's own culprit found (two culprits in one range, at every pair of positions), a flaky or
unreproduced member said so while the others go on, and one budget for the group."""

from __future__ import annotations

import math

import pytest

from gearfarm.bisection.grouped import search_group
from gearfarm.bisection.search import Budget, Probe, group_evidence, judge_test, search

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


# ------------------------------------------------------------------ a group of failures (issue #35)

def _group_judge(culprits: dict[str, int], judged: list[str], flaky: frozenset[tuple[str, int]] = frozenset(),
                 unbuildable: frozenset[int] = frozenset()):
    """Every failure's verdict at a revision, by rule: bad from its culprit on."""
    def judge(rev: str, end: bool) -> dict[str, Probe]:
        judged.append(rev)
        i = REVS.index(rev)
        out = {}
        for name, c in culprits.items():
            verdict = ("skip" if i in unbuildable else "flaky" if (name, i) in flaky
                       else "bad" if i >= c else "good")
            out[name] = Probe(rev, verdict, built=True, jobs=4 if end else 2)  # type: ignore[arg-type]
        return out
    return judge


def test_seven_failures_of_one_culprit_judge_each_revision_once_for_all() -> None:
    names = [f"tap/t{k}" for k in range(7)]
    judged: list[str] = []
    out = search_group(REVS, names, _group_judge(dict.fromkeys(names, 8), judged), lambda: None)
    assert {n: (r.state, r.culprit) for n, r in out.items()} == dict.fromkeys(names, ("found", REVS[8]))
    # One search for the seven: both ends, then the middles of one bisection.
    assert len(judged) == len(set(judged)) <= 2 + math.ceil(math.log2(len(REVS) - 1)), judged


@pytest.mark.parametrize("first, second", [(a, b) for a in range(1, 16) for b in range(1, 16) if a < b])
def test_a_group_with_two_culprits_names_each_failures_own(first: int, second: int) -> None:
    judged: list[str] = []
    culprits = {"tap/mul": first, "tap/add": second, "tap/sub": first}
    out = search_group(REVS, list(culprits), _group_judge(culprits, judged), lambda: None)
    assert {n: r.culprit for n, r in out.items()} == {n: REVS[c] for n, c in culprits.items()}
    assert len(judged) == len(set(judged)), "a revision was judged twice"
    # Never more than two searches of their own would judge (ends once, middles of each).
    assert len(judged) - 2 <= 2 * math.ceil(math.log2(len(REVS) - 1))
    # Each failure's evidence is its verdict at every revision the group judged.
    assert all(sorted(p.rev for p in r.probes) == sorted(judged) for r in out.values())


def test_a_flaky_member_is_said_flaky_and_the_others_still_found() -> None:
    judged: list[str] = []
    culprits = {"tap/add": 10, "chance/coin": 10, "tap/mul": 10}
    out = search_group(REVS, list(culprits), _group_judge(culprits, judged, flaky=frozenset({("chance/coin", 7)})),
                       lambda: None)
    assert out["chance/coin"].state == "flaky" and out["chance/coin"].culprit is None
    assert REVS[7][:12] in out["chance/coin"].message
    assert out["tap/add"].culprit == out["tap/mul"].culprit == REVS[10]


def test_a_member_whose_failure_does_not_come_back_is_flaky_at_the_ends() -> None:
    judged: list[str] = []
    culprits = {"tap/add": 10, "tap/gone": 99}  # never bad: not reproduced at the first bad end
    out = search_group(REVS, list(culprits), _group_judge(culprits, judged), lambda: None)
    assert out["tap/gone"].state == "flaky" and "did not come back in 4 runs" in out["tap/gone"].message
    assert out["tap/add"].culprit == REVS[10]


def test_the_budget_is_the_groups_and_stops_what_is_not_narrowed_yet() -> None:
    judged: list[str] = []
    culprits = {"tap/mul": 4, "tap/add": 11, "tap/sub": 11}
    # Room for three middles in all, for the whole group.
    out = search_group(REVS, list(culprits), _group_judge(culprits, judged),
                       lambda: None if len(judged) < 5 else "spent")
    assert len(judged) == 5
    states = {n: r.state for n, r in out.items()}
    assert "budget" in states.values(), states
    for r in out.values():
        assert r.state in ("found", "budget")
        assert r.state == "budget" or len(r.suspects) == 1


def test_unbuildable_middles_are_skipped_for_the_whole_group() -> None:
    judged: list[str] = []
    culprits = {"tap/add": 10, "tap/mul": 10}
    out = search_group(REVS, list(culprits), _group_judge(culprits, judged, unbuildable=frozenset({7, 8})),
                       lambda: None)
    assert all(r.culprit == REVS[10] for r in out.values())
    assert len(judged) == len(set(judged))


def test_group_evidence_says_each_revision_once_with_every_failures_verdict() -> None:
    revs = REVS[:3]
    details = [(name, {"revs": revs, "probes": [
        {"rev": revs[0], "verdict": "good", "statuses": ["passed"] * 4, "built": False},
        {"rev": revs[1], "verdict": v, "statuses": ["passed" if v == "good" else "failed"] * 2, "built": True},
        {"rev": revs[2], "verdict": "bad", "statuses": ["failed"] * 4}]})
        for name, v in (("tap/add", "good"), ("tap/mul", "bad"), ("tap/sub", "bad"))]
    lines = group_evidence(details)
    assert [(e["rev"], e["verdict"], e["figures"], e["built"]) for e in lines] == [
        (revs[0], "good", "all 3: passed, passed, passed, passed", False),
        (revs[1], "mixed", "good: tap/add; bad: tap/mul, tap/sub", True),
        (revs[2], "bad", "all 3: failed, failed, failed, failed", False)]
    # A bisection alone: its own evidence lines, as before groups.
    assert [e["figures"] for e in group_evidence(details[:1])] == ["passed, passed, passed, passed",
                                                                  "passed, passed", "failed, failed, failed, failed"]
