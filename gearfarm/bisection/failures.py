"""A group of failing tests bisected together (issue #35): the new failures of one project and
target in one range. Each probe run runs the union of their suites once (only their cases,
when they are all of one suite that has `only`), and one run judges every failure of the
group; the search over those judgements is gearfarm.bisection.grouped.

A revision is judged by repetitions, as when one test was bisected alone: both ends
``confirm`` times before the search (the nightly's failure was confirmed once already by its
re-run), each middle ``repeat`` times. A test that both passes and fails at one revision is
flaky and is not bisected, and neither is one whose failure does not come back at the first bad
revision: said per failure, the others go on.
"""

from __future__ import annotations

from typing import Any

from gearfarm.bisection import grouped
from gearfarm.bisection import search as bisect
from gearfarm.bisection.probing import Bisector, built_of
from gearfarm.bisection.subject import TestSubject, test_confidence
from gearfarm.db.results import Bisection
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.result import ResultRecord
from gearfarm.run import nightly

# The most cases a job's payload names (gearfarm.formats.job.Payload.cases); more run whole.
MAX_CASES = 16


class FailureGroup(Bisector):
    """The failing tests ``subjects`` (all TestSubject) bisected as one group."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tests = [s for s in self.subjects if isinstance(s, TestSubject)]
        self.names = [str(s) for s in self.tests]
        if len(self.tests) != len(self.subjects) or len(set(self.names)) != len(self.names):
            raise ValueError(f"a group is of failing tests, each once: not {[str(s) for s in self.subjects]}")
        self.suites = sorted({s.suite for s in self.tests})
        # Every failure's evidence, one entry per revision judged, as its own row records it.
        self.evidence: dict[str, list[dict[str, Any]]] = {n: [] for n in self.names}

    def _check(self, cat: catalog_mod.Catalog) -> None:
        have = cat.suites_for(self.target)
        for suite in self.suites:
            if suite not in have:
                raise catalog_mod.CatalogError(f"target {self.target} does not run suite {suite!r}; its suites: "
                                               f"{', '.join(have) or 'none'}")

    def _select(self, cat: catalog_mod.Catalog) -> nightly.Selection:
        # A suite the catalog at this revision lacks is left out: its failures are skipped there.
        have = cat.suites_for(self.target)
        suites = [s for s in self.suites if s in have]
        if not suites:
            raise catalog_mod.CatalogError(f"target {self.target} runs none of the suites {', '.join(self.suites)}")
        return nightly.select(cat, [self.target], suites, [])

    def _cases(self) -> list[str]:
        # One run's case names go to every suite it runs (Plan.cases): only one suite's are
        # given, else a suite would be asked for another's cases.
        cases = sorted({s.case for s in self.tests})
        return cases if len(self.suites) == 1 and len(cases) <= MAX_CASES else []

    def _bisect(self, revs: list[str]) -> list[Bisection]:
        out = grouped.search_group(revs, self.names, self._judge, self.over)
        return [self._finish(row, out[name], self.evidence[name], _confidence)
                for row, name in zip(self.rows, self.names, strict=True)]

    def _judge(self, rev: str, end: bool) -> grouped.Verdicts:
        """Run the group's suites at ``rev`` ``confirm`` (an end) or ``repeat`` times, stopping
        early once every failure is flaky there or nothing can run; each failure's verdict."""
        times = self.settings.confirm if end else self.settings.repeat
        statuses: dict[str, list[str]] = {n: [] for n in self.names}
        why = dict.fromkeys(self.names, "")
        built, runs = False, []
        for _ in range(times):
            run_id, records = self._probe(rev)
            runs.append(run_id)
            built = built or built_of(records)[1]
            ran = False
            for s, name in zip(self.tests, self.names, strict=True):
                case, reason = case_status(records, s)
                why[name] = reason or why[name]
                if case is not None:  # None: it did not build, or cannot run this test: a skip
                    statuses[name].append(case)
                    ran = True
            if not ran or all(bisect.judge_test(st) == "flaky" for st in statuses.values()):
                break
        verdicts = {}
        for name in self.names:
            verdict = bisect.judge_test(statuses[name])
            self.evidence[name].append({"rev": rev, "verdict": verdict, "statuses": statuses[name], "built": built,
                                        "runs": runs, "why": why[name]})
            # A judgement's jobs are its test runs; its build counts once, and only if it was made.
            verdicts[name] = bisect.Probe(rev, verdict, built=built, jobs=len(statuses[name]),
                                          evidence={"statuses": statuses[name]})
        for row, name in zip(self.rows, self.names, strict=True):
            self.db.update_bisection(row.id, probes=self.evidence[name], group=self.group())
        line = bisect.group_evidence([(n, {"probes": self.evidence[n][-1:]}) for n in self.names])[0]
        self.say(f"{self.prefix}: {rev[:12]} {line['verdict']} ({line['figures']})")
        return verdicts


def case_status(records: list[ResultRecord], subject: TestSubject) -> tuple[str | None, str]:
    """The test's status in a probe run's records, or None and why it cannot be judged there."""
    why = built_of(records)[2]
    if why:
        return None, why
    test = next((r for r in records if r.kind == "test" and r.name == subject.suite), None)
    if test is None or test.status not in ("passed", "failed", "timed_out"):
        return None, f"the suite was not run by the farm: {test.status if test else 'no record'}"
    case = next((c for c in test.cases if c.name == subject.case), None)
    if case is not None:
        return case.status, ""
    if test.status == "passed":
        return None, f"the suite has no case {subject.case!r} at this revision"
    # The suite failed (crashed, timed out) before reporting the case: the case did not pass.
    return "failed", f"the suite {test.status} without reporting the case"


def _confidence(out: bisect.SearchResult) -> float:
    by_rev = {p.rev: p for p in out.probes}
    return test_confidence(by_rev[out.last_good].jobs, by_rev[out.culprit or out.first_bad].jobs)
