"""One performance regression bisected alone: its judgement is an A/B comparison against the
known-good build, so two benchmarks share no judgement and each is a search of its own (a
group of one; gearfarm.bisection.failures groups the failing tests instead).

A benchmark is judged against the known-good build (the last good revision's, built or reused
first) by the perf job's interleaved A/B pairs on one host; a probe run adds the catalog's
`repetitions` pairs until the revision is judged, or ``max_pairs`` are measured. The first bad
end is judged first, by gearfarm.perf.compare (Pinpoint's rule: KS and Mann-Whitney U, a high
threshold that depends on the change sought and the number of pairs), looking for ``change``;
if it is the same as the good build there is no culprit. Afterwards the change sought is the
one measured there, and a middle revision is asked which end it is like: bad when the 95 %
interval of its paired estimate lies beyond half the change sought, good when it lies short of
it. "Different from the known-good build" is the wrong question there: the host's noise makes
an unchanged revision differ by 2 % now and then (CI, November 28: -2.20 % over 10 pairs,
p=0.007, an unchanged build blamed), while half of a 4 % change is several standard errors
from either end.
"""

from __future__ import annotations

import math
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
        """A/B pairs of ``rev`` against the known-good build until it is judged (or max_pairs).
        ``either`` (the first bad end, where the change is not known yet): bad when the comparison
        finds it different by at least half of ``change``, in any direction. Otherwise: bad or
        good by the side of half of ``change`` its paired estimate's interval lies on."""
        new: list[float] = []
        base: list[float] = []
        ratios: list[float] = []
        built, runs, why, jobs = False, [], "", 0
        cmp: compare.Comparison | None = None
        side: bisect.ProbeVerdict | None = None
        while len(new) < self.settings.max_pairs:
            run_id, records = self._probe(rev, baseline=self.good_build)
            runs.append(run_id)
            got = pairs(records, self.subject)
            built = built or got["built"]
            if got["why"]:
                why = got["why"]
                break
            jobs += 1
            new += got["new"]
            base += got["baseline"]
            ratios += got["ratio"]
            cmp = compare.compare(new, base, change)
            paired = Paired.of(ratios)
            if either:
                like = _like(_estimate(paired, cmp), change, either)
                if (cmp.result == "different" and like) or (cmp.result == "same" and not like and
                                                            cmp.size >= MIN_PAIRS):
                    break
            elif (side := _side(paired, change)) is not None:
                break
        if cmp is None:
            self._record({"rev": rev, "verdict": "skip", "built": built, "runs": runs, "why": why}, why)
            return bisect.Probe(rev, "skip", built=built, jobs=jobs)
        paired = Paired.of(ratios)
        estimate = _estimate(paired, cmp)
        # Undecided at max_pairs (the host's noise either way): the nearer of no change and the
        # change sought decides, and the evidence says so.
        verdict: bisect.ProbeVerdict = side or ("bad" if _like(estimate, change, either) else "good")
        interval = paired.interval(LEVEL)
        ev = {"rev": rev, "verdict": verdict, "built": built, "runs": runs, "pairs": cmp.size,
              "change": estimate, "interval": list(interval) if interval else None, "p": cmp.p_value,
              "high_threshold": cmp.high_threshold, "magnitude_iqr": cmp.magnitude,
              "result": cmp.result if either else _result(side, change), "why": why}
        self._record(ev, bisect.evidence_line(ev))
        return bisect.Probe(rev, verdict, built=built, jobs=jobs,
                            evidence={"change": estimate, "p": cmp.p_value, "result": ev["result"]})

    def _record(self, ev: dict[str, Any], summary: str) -> None:
        self.evidence.append(ev)
        self.db.update_bisection(self.rows[0].id, probes=self.evidence, group=self.group())
        self.say(f"{self.prefix}: {ev['rev'][:12]} {ev['verdict']} ({summary})")


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


def _estimate(paired: Paired, cmp: compare.Comparison) -> float:
    """The revision's change: its pairs' estimate (the drift between probe runs cancels within a
    pair), or the medians' when no pair has a ratio (a baseline figure of 0)."""
    return math.expm1(paired.mean) if paired.k else cmp.change


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
