"""One performance regression bisected alone: its judgement is an A/B comparison against the
known-good build, so two benchmarks share no judgement and each is a search of its own (a
group of one; gearfarm.bisection.failures groups the failing tests instead).

A benchmark is judged against the known-good build (the last good revision's, built or reused
first) by the perf job's interleaved A/B pairs on one host; a probe run adds the catalog's
`repetitions` pairs until the revision is judged, or ``max_pairs`` are measured. The first bad
end is judged first, by gearfarm.perf.compare (Pinpoint's rule: KS and Mann-Whitney U, a high
threshold that depends on the change sought and the number of pairs), looking for ``change``;
if it is the same as the good build there is no culprit. Either way the end is measured until
its estimate is settled (a wild pair among five once doubled a 4.8 % slowdown). Afterwards the
change sought is the one measured there, and a middle revision is asked which end it is like:
bad when the 95 % interval of its paired estimate lies beyond half the change sought, good when
it lies short of it. "Different from the known-good build" is the wrong question there: the host's noise makes
an unchanged revision differ by 2 % now and then (CI, November 28: -2.20 % over 10 pairs,
p=0.007, an unchanged build blamed), while half of a 4 % change is several standard errors
from either end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gearfarm.bisection import search as bisect
from gearfarm.bisection.probing import Bisector, built_of
from gearfarm.bisection.subject import PerfSubject, perf_confidence
from gearfarm.db.results import Bisection
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import Artifact
from gearfarm.formats.result import ResultRecord
from gearfarm.perf import compare
from gearfarm.perf.pairs import Paired
from gearfarm.run import nightly

# Pairs before a revision may be called the same as the known-good build (Pinpoint starts with
# 10 repetitions): with 5 a side, one outlier lifts the rank tests' p from 0.008 to 0.08, above
# the high threshold of a change of several IQRs (measured: a -5.2 % revision called "same").
# A middle revision is judged on at least as many: 5 pairs keep 3 after trimming, whose scatter
# can be small by chance.
MIN_PAIRS = 10
# The paired estimate's interval that must lie on one side of half the change sought.
LEVEL = 0.95
# How well the first bad end's change must be known before it is the one sought: its interval's
# half-width at most a quarter of it, so half of it (the line between the ends) is within an
# eighth of the change. In CI on November 29 five pairs with a wild one put a 4.8 % slowdown at
# -9.97 % (interval -27.9 % to +12.4 %): every later revision, 4.2-4.7 % slower, was then short
# of half of it, "good", and commit 14 was blamed for commit 6.
SETTLED = 0.25


class BenchmarkBisector(Bisector):
    """One benchmark's metric (the only subject, a PerfSubject) bisected on one target."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if len(self.subjects) != 1 or not isinstance(self.subjects[0], PerfSubject):
            raise ValueError("a benchmark is bisected alone")
        self.subject: PerfSubject = self.subjects[0]
        self.good_build: Artifact | None = None
        self.evidence: list[dict[str, Any]] = []

    def _check(self, cat: catalog_mod.Catalog) -> None:
        self._select(cat)

    def _select(self, cat: catalog_mod.Catalog) -> nightly.Selection:
        bench = cat.benchmark(self.subject.benchmark)
        if not cat.target(self.target).perf:
            raise catalog_mod.CatalogError(f"target {self.target} runs no benchmarks (its catalog entry has "
                                           "perf = false)")
        if self.subject.metric not in bench.metrics:
            raise catalog_mod.CatalogError(f"benchmark {self.subject.benchmark} has no metric "
                                           f"{self.subject.metric!r}; its metrics: {', '.join(sorted(bench.metrics))}")
        return nightly.select(cat, [self.target], [], [self.subject.benchmark])

    def _bisect(self, revs: list[str]) -> list[Bisection]:
        st = self.settings
        self.good_build, built = self._build(revs[0])
        good = bisect.Probe(revs[0], "good", built=built, evidence={"known_good": True})
        self._record({"rev": revs[0], "verdict": "good", "built": built, "known_good": True}, "the known-good build")
        bad = self._judge(revs[-1], st.change, either=True)
        sought = float(bad.evidence["change"]) if bad.verdict == "bad" else st.change  # type: ignore[arg-type]
        out = bisect.search(revs, lambda rev: self._judge(rev, sought), st.budget, ends=(good, bad))
        return [self._finish(self.rows[0], out, self.evidence, _confidence)]

    def _judge(self, rev: str, change: float, either: bool = False) -> bisect.Probe:
        """``rev`` judged against the known-good build by probe runs of A/B pairs (measure)."""
        built, runs = False, []

        def draw() -> dict[str, Any]:
            nonlocal built
            run_id, records = self._probe(rev, baseline=self.good_build)
            runs.append(run_id)
            got = pairs(records, self.subject)
            built = built or got["built"]
            return got

        m = measure(draw, change, either, self.settings.max_pairs)
        if m.cmp is None:
            self._record({"rev": rev, "verdict": "skip", "built": built, "runs": runs, "why": m.why}, m.why)
            return bisect.Probe(rev, "skip", built=built, jobs=m.jobs)
        interval = m.paired.interval(LEVEL)
        ev = {"rev": rev, "verdict": m.verdict, "built": built, "runs": runs, "pairs": m.cmp.size,
              "change": m.estimate, "interval": list(interval) if interval else None, "p": m.cmp.p_value,
              "high_threshold": m.cmp.high_threshold, "magnitude_iqr": m.cmp.magnitude,
              "result": m.cmp.result if either else _result(m.side, change), "why": m.why}
        self._record(ev, bisect.evidence_line(ev))
        return bisect.Probe(rev, m.verdict, built=built, jobs=m.jobs,
                            evidence={"change": m.estimate, "p": m.cmp.p_value, "result": ev["result"]})

    def _record(self, ev: dict[str, Any], summary: str) -> None:
        self.evidence.append(ev)
        self.db.update_bisection(self.rows[0].id, probes=self.evidence, group=self.group())
        self.say(f"{self.prefix}: {ev['rev'][:12]} {ev['verdict']} ({summary})")


@dataclass
class Measured:
    """A revision's A/B figures against the known-good build, as measure left them."""

    new: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    jobs: int = 0
    why: str = ""
    cmp: compare.Comparison | None = None
    # The side of half the change sought its interval lies on (a middle revision); None while
    # it straddles it, and for the first bad end.
    side: bisect.ProbeVerdict | None = None
    verdict: bisect.ProbeVerdict = "skip"

    @property
    def paired(self) -> Paired:
        return Paired.of(self.ratios)

    @property
    def estimate(self) -> float:
        """The revision's change: its pairs' estimate (the drift between probe runs cancels
        within a pair), or the medians' when no pair has a ratio (a baseline figure of 0)."""
        assert self.cmp is not None
        return math.expm1(self.paired.mean) if self.paired.k else self.cmp.change


def measure(draw: Callable[[], dict[str, Any]], change: float, either: bool, max_pairs: int) -> Measured:
    """Probe runs (``draw``: one run's figures, as ``pairs`` gives them) until the revision is
    judged or ``max_pairs`` are measured.

    ``either`` (the first bad end, where the change is not known yet): bad when the comparison
    finds it different by at least half of ``change``, in any direction, and its estimate is
    settled, for it is the yardstick every middle revision is judged by; good when it finds it
    the same and the interval of its estimate lies short of half of ``change`` both ways (wild
    pairs on one side make the rank tests call a 5 % change the same). Otherwise: bad or good
    by the side of half of ``change`` its paired estimate's interval lies on. Undecided at
    max_pairs (the host's noise either way): the nearer of no change and the change sought
    decides, and the evidence says so."""
    m = Measured()
    while len(m.new) < max_pairs:
        got = draw()
        if got["why"]:
            m.why = got["why"]
            break
        m.jobs += 1
        m.new += got["new"]
        m.base += got["baseline"]
        m.ratios += got["ratio"]
        if either:
            m.cmp = compare.compare(m.new, m.base, change)
            like = _like(m.estimate, change, either)
            if ((m.cmp.result == "different" and like and _settled(m.paired)) or
                    (m.cmp.result == "same" and not like and
                     _side(m.paired, change) == _side(m.paired, -change) == "good")):
                break
        elif (side := _side(m.paired, change)) is not None:
            m.side = side
            break
    if m.new and not either:
        # A middle revision's comparison is evidence only (its p-value, for the confidence).
        m.cmp = compare.compare(m.new, m.base, change)
    if m.cmp is not None:
        m.verdict = m.side or ("bad" if _like(m.estimate, change, either) else "good")
    return m


def _settled(paired: Paired) -> bool:
    """The first bad end's estimate is known to SETTLED of itself (its interval's half-width on
    the log scale), from at least MIN_PAIRS pairs: half of it is the line between the ends."""
    interval = paired.interval(LEVEL)
    if paired.k < MIN_PAIRS or interval is None or paired.mean == 0:
        return False
    return (math.log1p(interval[1]) - math.log1p(interval[0])) / 2 <= SETTLED * abs(paired.mean)


def _like(measured: float, sought: float, either: bool) -> bool:
    """A change at least half the size of the one sought, in its direction (``either``: any)."""
    return abs(measured) >= abs(sought) / 2 and (either or measured * sought > 0)


def _side(paired: Paired, sought: float) -> bisect.ProbeVerdict | None:
    """Which end a middle revision is like, once its paired estimate's interval lies wholly on
    one side of half the change sought (on the log scale, where the pairs are averaged); None
    while it straddles it or fewer than MIN_PAIRS pairs are measured."""
    interval = paired.interval(LEVEL)
    if paired.k < MIN_PAIRS or interval is None:
        return None
    half = math.expm1(math.log1p(sought) / 2)
    low, high = interval
    if (high < half) if sought < 0 else (low > half):
        return "bad"
    if (low > half) if sought < 0 else (high < half):
        return "good"
    return None


def _result(side: bisect.ProbeVerdict | None, sought: float) -> str:
    if side is None:
        return "unknown"
    return f"{'beyond' if side == 'bad' else 'short of'} half of {sought:+.2%}"


def _confidence(out: bisect.SearchResult) -> float:
    by_rev = {p.rev: p for p in out.probes}
    culprit, parent = by_rev[out.culprit or out.first_bad], by_rev[out.last_good]
    return perf_confidence(float(culprit.evidence["p"]), not parent.evidence.get("known_good"))  # type: ignore[arg-type]


def pairs(records: list[ResultRecord], subject: PerfSubject) -> dict[str, Any]:
    """The probe's A/B figures of the metric ("new", "baseline", and each pair's "ratio"),
    whether its build was made, and why nothing can be judged ("" when there are pairs)."""
    _, built, why = built_of(records)
    perf = next((r for r in records if r.kind == "perf"), None)
    if not why and (perf is None or perf.status != "passed"):
        why = f"the benchmark did not pass: {perf.status + ': ' + perf.message if perf else 'no record'}"
    if why:
        return {"built": built, "why": why, "new": [], "baseline": [], "ratio": []}
    assert perf is not None
    values = {v: [s.value for s in perf.samples if s.metric == subject.metric and s.variant == v]
              for v in ("new", "baseline", "ratio")}
    if not values["new"] or not values["baseline"]:
        return {"built": built, "why": f"no A/B pairs of {subject.metric}", "new": [], "baseline": [], "ratio": []}
    return {"built": built, "why": "", **values}
