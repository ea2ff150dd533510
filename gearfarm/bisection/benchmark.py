"""One performance regression bisected alone: its judgement is an A/B comparison against the
known-good build, so two benchmarks share no judgement and each is a search of its own (a
group of one; gearfarm.bisection.failures groups the failing tests instead).

A benchmark is judged against the known-good build (the last good revision's, built or reused
first) by the perf job's interleaved A/B pairs on one host, compared with gearfarm.perf.compare
(Pinpoint's rule: KS and Mann-Whitney U, a high threshold that depends on the change sought and
the number of pairs): a probe run adds the catalog's `repetitions` pairs until the comparison
says same or different, or ``max_pairs`` are measured. The first bad end is judged first,
looking for ``change``; if it is the same as the good build there is no culprit. Afterwards
the change sought is the one measured there, and a middle revision is bad when it differs from
the good build in that direction.
"""

from __future__ import annotations

from typing import Any

from gearfarm.bisection import search as bisect
from gearfarm.bisection.probing import Bisector, built_of
from gearfarm.bisection.subject import PerfSubject, perf_confidence
from gearfarm.db.results import Bisection
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import Artifact
from gearfarm.formats.result import ResultRecord
from gearfarm.formats.words import counted
from gearfarm.perf import compare
from gearfarm.run import nightly

# Pairs before a revision may be called the same as the known-good build (Pinpoint starts with
# 10 repetitions): with 5 a side, one outlier lifts the rank tests' p from 0.008 to 0.08, above
# the high threshold of a change of several IQRs (measured: a -5.2 % revision called "same").
MIN_SAME_PAIRS = 10


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
        """A/B pairs of ``rev`` against the known-good build until the comparison decides (or
        max_pairs): bad when it differs by at least half of ``change``, in its direction
        (``either``: in any direction, at the first bad end, where it is not known yet)."""
        new: list[float] = []
        base: list[float] = []
        built, runs, why, jobs = False, [], "", 0
        cmp: compare.Comparison | None = None
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
            cmp = compare.compare(new, base, change)
            like = _like(cmp.change, change, either)
            if (cmp.result == "different" and like) or (cmp.result == "same" and not like and
                                                        cmp.size >= MIN_SAME_PAIRS):
                break
        if cmp is None:
            self._record({"rev": rev, "verdict": "skip", "built": built, "runs": runs, "why": why}, why)
            return bisect.Probe(rev, "skip", built=built, jobs=jobs)
        # Different and like the change sought: bad; the same, and not like it: good. Anything else
        # (a difference the other way or under half the change sought, or "same" while the estimate
        # shows the change: the host's noise either way) was measured further; at max_pairs, the
        # nearer of no change and the change sought decides.
        verdict: bisect.ProbeVerdict = "bad" if _like(cmp.change, change, either) else "good"
        ev = {"rev": rev, "verdict": verdict, "built": built, "runs": runs, "pairs": cmp.size,
              "change": cmp.change, "p": cmp.p_value, "high_threshold": cmp.high_threshold,
              "magnitude_iqr": cmp.magnitude, "result": cmp.result, "why": why}
        self._record(ev, f"{cmp.change:+.2%} over {counted(cmp.size, 'pair')}, p={cmp.p_value:.3g}, {cmp.result}")
        return bisect.Probe(rev, verdict, built=built, jobs=jobs,
                            evidence={"change": cmp.change, "p": cmp.p_value, "result": cmp.result})

    def _record(self, ev: dict[str, Any], summary: str) -> None:
        self.evidence.append(ev)
        self.db.update_bisection(self.rows[0].id, probes=self.evidence, group=self.group())
        self.say(f"{self.prefix}: {ev['rev'][:12]} {ev['verdict']} ({summary})")


def _like(measured: float, sought: float, either: bool) -> bool:
    """A change at least half the size of the one sought, in its direction (``either``: any)."""
    return abs(measured) >= abs(sought) / 2 and (either or measured * sought > 0)


def _confidence(out: bisect.SearchResult) -> float:
    by_rev = {p.rev: p for p in out.probes}
    culprit, parent = by_rev[out.culprit or out.first_bad], by_rev[out.last_good]
    return perf_confidence(float(culprit.evidence["p"]), not parent.evidence.get("known_good"))  # type: ignore[arg-type]


def pairs(records: list[ResultRecord], subject: PerfSubject) -> dict[str, Any]:
    """The probe's A/B figures of the metric ("new", "baseline"), whether its build was made,
    and why nothing can be judged ("" when there are pairs)."""
    _, built, why = built_of(records)
    perf = next((r for r in records if r.kind == "perf"), None)
    if not why and (perf is None or perf.status != "passed"):
        why = f"the benchmark did not pass: {perf.status + ': ' + perf.message if perf else 'no record'}"
    if why:
        return {"built": built, "why": why, "new": [], "baseline": []}
    assert perf is not None
    values = {v: [s.value for s in perf.samples if s.metric == subject.metric and s.variant == v]
              for v in ("new", "baseline")}
    if not values["new"] or not values["baseline"]:
        return {"built": built, "why": f"no A/B pairs of {subject.metric}", "new": [], "baseline": []}
    return {"built": built, "why": "", **values}
