"""The search of a bisection: given the commits of a range (last good revision first, first bad
last) and a way to judge one revision, narrow the range to the commit that changed the verdict.

Pure: judging a revision (building it or reusing its stored build, running the test or the
benchmark on the farm) is the caller's (gearfarm.bisection.driver). What this decides:

* which revision to judge next: the middle of the commits still suspect, like `git bisect`;
  a revision that does not build is skipped and the nearest suspect to the middle is judged
  instead, like `git bisect skip`; when only unbuildable commits stand between the last good
  and the first bad, the answer is that range, not one of its commits;
* when to stop: one suspect left (the culprit), or the budget spent (the range so far);
* how a failing test is judged: by repetitions (``judge_test``). A test that both passes and
  fails at one revision is flaky there, and a flaky test is not bisected as a regression: its
  "first bad" commit would be wherever chance put it.

Its parts (the ends' check, narrowing a range) serve the search of a group of failures too
(gearfarm.bisection.grouped), and the evidence lines every report of a bisection shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gearfarm.formats.words import counted

ProbeVerdict = Literal["good", "bad", "skip", "flaky"]
# How a bisection ended: one culprit; no culprit (the bad end does not differ from the good
# end after all); flaky (the verdict is chance); budget (builds, jobs or hours spent: the range
# so far); unbuildable (only commits that do not build are left between good and bad).
State = Literal["found", "no_culprit", "flaky", "budget", "unbuildable"]
# The order a revision's verdicts are said in, when a group's failures disagree there.
_VERDICTS = ("good", "bad", "flaky", "skip")


@dataclass(frozen=True)
class Budget:
    """What one bisection (or one group of failures bisected together) may spend. Reused
    builds are free: the farm keeps every build."""

    builds: int = 8
    jobs: int = 60
    seconds: float = 4 * 3600.0

    def spent(self, builds: int, jobs: int, seconds: float) -> str | None:
        """Why no further revision may be judged after spending this much; None while some is left."""
        if builds < self.builds and jobs < self.jobs and seconds < self.seconds:
            return None
        return (f"budget spent ({counted(builds, 'build')} of {self.builds}, {counted(jobs, 'job')} of {self.jobs}, "
                f"{seconds:.0f}s of {self.seconds:.0f}s)")


@dataclass
class Probe:
    """One revision judged: its verdict, whether a build was made for it (not reused), how many
    jobs it ran, and the evidence (figures, per-repetition statuses) for the report."""

    rev: str
    verdict: ProbeVerdict
    built: bool = False
    jobs: int = 0
    evidence: dict[str, object] = field(default_factory=dict)


@dataclass
class SearchResult:
    state: State
    # The culprit (state "found"), else None.
    culprit: str | None
    # The commits still suspect, oldest first (the culprit alone when found).
    suspects: list[str]
    last_good: str
    first_bad: str
    probes: list[Probe]
    message: str = ""

    @property
    def builds(self) -> int:
        return sum(p.built for p in self.probes)

    @property
    def jobs(self) -> int:
        return sum(p.jobs for p in self.probes)


Judge = Callable[[str], Probe]


def search(revs: list[str], judge: Judge, budget: Budget | None = None, ends: tuple[Probe, Probe] | None = None,
           clock: Callable[[], float] = time.monotonic, unreproduced: State = "no_culprit") -> SearchResult:
    """Bisect ``revs`` (the last good revision first, then every later commit up to the first bad
    one). ``ends``: the verdicts of both ends when the caller judged them already (a confirmed
    pair: good, then bad); otherwise both ends are judged first, and the search stops unless
    the first is good and the last bad. ``unreproduced``: the state when the first bad end is
    judged good after all: no culprit for a benchmark that did not move, flaky for a test that
    was seen failing there."""
    if len(revs) < 2:
        raise ValueError("a bisection needs the last good and the first bad revision")
    budget = budget or Budget()
    start = clock()
    good, bad = ends if ends is not None else (judge(revs[0]), judge(revs[-1]))
    ended = end_check(good, bad, unreproduced)
    if ended is not None:
        return result(revs, 0, len(revs) - 1, [good, bad], *ended)
    probes = [good, bad]

    def over() -> str | None:
        return budget.spent(sum(p.built for p in probes), sum(p.jobs for p in probes), clock() - start)

    state, lo, hi, message = narrow(revs, 0, len(revs) - 1, judge, over, probes)
    return result(revs, lo, hi, probes, state, message)


def result(revs: list[str], lo: int, hi: int, probes: list[Probe], state: State, message: str) -> SearchResult:
    """How a search over ``revs`` ended with revs[lo] the last good and revs[hi] the first bad."""
    suspects = revs[lo + 1:hi + 1]
    return SearchResult(state, suspects[0] if state == "found" else None, suspects, revs[lo], revs[hi], probes,
                        message)


def end_check(good: Probe, bad: Probe, unreproduced: State) -> tuple[State, str] | None:
    """Why the range cannot be bisected, from the verdicts of its ends (the first must be good,
    the last bad, neither flaky); None when it can."""
    for end, want in ((good, "good"), (bad, "bad")):
        if end.verdict == "flaky":
            return "flaky", f"{end.rev[:12]} both passes and fails: the failure is flaky, not bisected"
        if end.verdict != want:
            state: State = unreproduced if end is bad else "flaky"
            if end is bad and state == "flaky":
                return state, (f"the failure at {end.rev[:12]} did not come back in {counted(end.jobs, 'run')}: "
                               "flaky, not bisected")
            return state, (f"{end.rev[:12]} ({'first bad' if end is bad else 'last good'}) judged "
                           f"{end.verdict} on repetition: nothing to bisect")
    return None


def narrow(revs: list[str], lo: int, hi: int, judge: Judge, over: Callable[[], str | None], probes: list[Probe],
           skipped: set[int] | None = None) -> tuple[State, int, int, str]:
    """Narrow revs[lo] (good) .. revs[hi] (bad) by judging middles, appending each judgement to
    ``probes``; ``over`` says when the budget is spent, ``skipped`` the suspects known not to
    build. Returns how it ended, the last good and first bad index, and the message."""
    skipped = set(skipped or ())
    while hi - lo > 1:
        spent = over()
        if spent is not None:
            return "budget", lo, hi, f"{spent} with {counted(hi - lo, 'commit')} still suspect"
        middle = _pick(lo, hi, skipped)
        if middle is None:
            return "unbuildable", lo, hi, (f"the {counted(hi - lo - 1, 'commit')} between {revs[lo][:12]} and "
                                           f"{revs[hi][:12]} do not build: the culprit is one of them or the first bad")
        p = judge(revs[middle])
        probes.append(p)
        if p.verdict == "good":
            lo = middle
        elif p.verdict == "bad":
            hi = middle
        elif p.verdict == "skip":
            skipped.add(middle)
        else:
            return "flaky", lo, hi, f"{p.rev[:12]} both passes and fails: the failure is flaky, not bisected"
    return "found", lo, hi, f"{revs[hi][:12]} is the first bad commit"


def _pick(lo: int, hi: int, skipped: set[int]) -> int | None:
    """The suspect nearest the middle of (lo, hi) that was not skipped; None if all were."""
    mid = (lo + hi) // 2
    for d in range(hi - lo):
        for i in (mid - d, mid + d):
            if lo < i < hi and i not in skipped:
                return i
    return None


def judge_test(statuses: list[str]) -> ProbeVerdict:
    """A test's verdict from its repetitions at one revision: all passed is good, all failed is
    bad, both is flaky; no repetition that ran (the build failed, the case is missing) is skip."""
    ran = [s for s in statuses if s in ("passed", "failed", "error")]
    if not ran:
        return "skip"
    failed = sum(s != "passed" for s in ran)
    if failed == 0:
        return "good"
    return "bad" if failed == len(ran) else "flaky"


def ordered_evidence(detail: dict[str, Any]) -> list[dict[str, Any]]:
    """A bisection's judged revisions (its detail's probes), oldest revision first."""
    order = {rev: i for i, rev in enumerate(detail.get("revs", []))}
    return sorted(detail.get("probes", []), key=lambda p: order.get(p["rev"], -1))


def evidence_line(ev: dict[str, object]) -> str:
    """One revision's evidence as a person reads it (report, mail, command line): the test's
    statuses, or the benchmark's change against the known-good build over its pairs."""
    if "statuses" in ev:
        return ", ".join(str(s) for s in ev["statuses"]) or str(ev.get("why", ""))  # type: ignore[attr-defined]
    if "change" in ev:
        interval = ev.get("interval")
        within = f"95 % interval {float(interval[0]):+.2%} to {float(interval[1]):+.2%}, " if interval else ""  # type: ignore[index]
        return (f"{float(ev['change']):+.2%} over {counted(ev['pairs'], 'pair')} against the known-good build "  # type: ignore[arg-type]
                f"({within}p={float(ev['p']):.3g}, {ev['result']})")  # type: ignore[arg-type]
    return "the known-good build" if ev.get("known_good") else str(ev.get("why", ""))


def group_evidence(members: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The revisions a group judged (its members' details: name, detail), oldest first, each
    with its verdicts in one line: a member alone gives its own evidence line; a group "all N"
    when its failures agree there, else each verdict with the failures that got it ("mixed")."""
    order: dict[str, int] = {}
    seen: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, detail in members:
        for i, rev in enumerate(detail.get("revs", [])):
            order.setdefault(rev, i)
        for p in detail.get("probes", []):
            seen.setdefault(p["rev"], []).append((name, p))
    out = []
    for rev in sorted(seen, key=lambda r: order.get(r, -1)):
        by: dict[str, list[str]] = {}
        for name, p in seen[rev]:
            by.setdefault(p["verdict"], []).append(name)
        lines = {evidence_line(p) for _, p in seen[rev]}
        if len(seen[rev]) == 1:
            verdict, figures = seen[rev][0][1]["verdict"], lines.pop()
        elif len(by) == 1:
            verdict = next(iter(by))
            figures = f"all {len(seen[rev])}" + (f": {lines.pop()}" if len(lines) == 1 else "")
        else:
            verdict = "mixed"
            figures = "; ".join(f"{v}: {', '.join(by[v])}" for v in sorted(by, key=_VERDICTS.index))
        out.append({"rev": rev, "verdict": verdict, "figures": figures,
                    "built": any(p.get("built") for _, p in seen[rev])})
    return out
