"""The search of a group of failures (issue #35): the new failures of one project and target
in one range (last good .. first bad) are bisected together, because one bad commit often
breaks many tests and bisecting each alone judges the same revisions over and over.

Pure, like gearfarm.bisection.search, whose rules it applies to each failure: judging a
revision judges every failure of the group at once (the caller runs their suites together),
and a judgement is kept and reused for every failure. The failures are then searched one
after another over those judgements: the first narrows the range by `git bisect`'s middles;
each next one starts from the tightest range the judgements so far give it (its last good and
first bad judged revision), so a failure with the same culprit needs no new revision, and one
with another culprit (two bad commits in the range) goes on only in its own sub-range. The
budget is the group's: everything the group spent, whichever failure it was judged for.
"""

from __future__ import annotations

from collections.abc import Callable

from gearfarm.bisection.search import Probe, SearchResult, end_check, narrow, result

# Every failure's verdict at one revision, by the failure's name ("suite/case").
Verdicts = dict[str, Probe]
# Judge every failure of the group at a revision; ``end``: it is an end of the range (judged
# with more repetitions).
GroupJudge = Callable[[str, bool], Verdicts]


def search_group(revs: list[str], failures: list[str], judge: GroupJudge,
                 over: Callable[[], str | None]) -> dict[str, SearchResult]:
    """Each failure's search over ``revs`` (last good first, first bad last), judging each
    revision at most once for the whole group. A failure not judged good at the first end and
    bad at the last (flaky there, or not reproduced) is flaky, as when bisected alone."""
    if len(revs) < 2:
        raise ValueError("a bisection needs the last good and the first bad revision")
    judged: dict[str, Verdicts] = {}

    def at(rev: str, end: bool = False) -> Verdicts:
        if rev not in judged:
            judged[rev] = judge(rev, end)
        return judged[rev]

    good, bad = at(revs[0], True), at(revs[-1], True)
    out: dict[str, SearchResult] = {}
    for f in failures:
        ended = end_check(good[f], bad[f], "flaky")
        if ended is not None:
            out[f] = result(revs, 0, len(revs) - 1, [good[f], bad[f]], *ended)
    for f in failures:
        if f not in out:
            out[f] = _one(revs, f, judged, at, over)
    # Each failure's evidence: its verdict at every revision the group judged, also those
    # judged after its own search ended.
    for f, r in out.items():
        r.probes = _evidence(revs, f, judged)
    return out


def _one(revs: list[str], f: str, judged: dict[str, Verdicts], at: Callable[[str], Verdicts],
         over: Callable[[], str | None]) -> SearchResult:
    """Failure ``f``'s search, from the tightest range the judgements so far give it."""
    index = {rev: i for i, rev in enumerate(revs)}
    mine = {index[rev]: v[f] for rev, v in judged.items()}
    flaky = [mine[i] for i in sorted(mine) if mine[i].verdict == "flaky"]
    if flaky:
        # It passed and failed at one revision (judged for another failure's search, maybe):
        # its first bad revision would be wherever chance put it.
        return result(revs, 0, len(revs) - 1, [], "flaky",
                      f"{flaky[0].rev[:12]} both passes and fails: the failure is flaky, not bisected")
    hi = min(i for i, p in mine.items() if p.verdict == "bad")
    lo = max(i for i, p in mine.items() if p.verdict == "good" and i < hi)
    skipped = {i for i, p in mine.items() if p.verdict == "skip" and lo < i < hi}
    probes: list[Probe] = []
    state, lo, hi, message = narrow(revs, lo, hi, lambda rev: at(rev)[f], over, probes, skipped)
    return result(revs, lo, hi, probes, state, message)


def _evidence(revs: list[str], f: str, judged: dict[str, Verdicts]) -> list[Probe]:
    """Every judgement of ``f``, oldest revision first (whichever failure's search made it)."""
    return [judged[rev][f] for rev in revs if rev in judged]
