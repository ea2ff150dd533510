"""Bisection on the farm: judge revisions of a range by building each (or reusing its stored
build) and running the one failing test on the farm's own workers through Gearman, narrowing
the range with gearfarm.bisect, and recording what was found in the results database.

Each judgement is a probe run of its own (``bisect-<id>.<rev>.<n>``): one build job and one
test job, through the same submit, wait, ledger and workers as a nightly, so a probe survives
a dead worker or gearmand like any job. Probe runs are children of ``bisect-<id>`` (not a run),
which keeps them out of nightly history, series and last good builds.

How a failing test is judged: the ends are repeated ``confirm`` times first (the nightly's
failure was already confirmed once by its re-run); a test that both passes and fails there is
flaky and is not bisected, and so is one that never fails
again at the first bad revision. Every middle revision is run ``repeat`` times: all failing is bad,
all passing is good, both is flaky (the search stops and says so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gearfarm import bisect, nightly, snapshot
from gearfarm import catalog as catalog_mod
from gearfarm.config import Config, ProjectConfig
from gearfarm.connection import gearman_client
from gearfarm.gearman import GearmanError
from gearfarm.ledger import Ledger
from gearfarm.result import ResultRecord
from gearfarm.s3.store import ArtifactStore, StoreError
from gearfarm.store import Bisection, ResultsDB

log = logging.getLogger("gearfarm.bisection")


class BisectionError(RuntimeError):
    """The bisection cannot start (bad range, unknown test): the message says what to fix."""


@dataclass(frozen=True)
class TestSubject:
    suite: str
    case: str

    def __str__(self) -> str:
        return f"{self.suite}/{self.case}"


@dataclass(frozen=True)
class Settings:
    budget: bisect.Budget = bisect.Budget()
    # Repetitions of each end before the search (a flaky test is caught here) and of each middle.
    confirm: int = 4
    repeat: int = 2
    seed: int = 1


def confidence(good_passes: int, bad_failures: int) -> float:
    """How sure the culprit is not chance: 1 minus the largest probability, over every failure
    rate f, that a test failing at random with rate f both before and after the culprit would
    have failed all ``bad_failures`` runs at the culprit and passed all ``good_passes`` runs at
    its parent (f^m (1-f)^n, largest at f = m / (m + n))."""
    m, n = bad_failures, good_passes
    if m == 0 or n == 0:
        return 0.0
    f = m / (m + n)
    return 1.0 - f ** m * (1.0 - f) ** n


class TestBisection:
    """One failing test's bisection on one target."""

    def __init__(self, cfg: Config, db: ResultsDB, store: ArtifactStore, project: ProjectConfig, target: str,
                 subject: TestSubject, settings: Settings | None = None, origin_run_id: str | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.cfg, self.db, self.store, self.project, self.target = cfg, db, store, project, target
        self.subject, self.settings, self.origin_run_id = subject, settings or Settings(), origin_run_id
        self.say = say or (lambda _m: None)
        self.ledger = Ledger(db)
        self.row: Bisection | None = None
        self.evidence: list[dict[str, Any]] = []
        self.runs = 0

    def run(self, good: str, bad: str) -> Bisection:
        try:
            repo = snapshot.repository(self.cfg, self.project)
            revs = snapshot.first_parent_range(repo, good, bad)
        except snapshot.SourceError as e:
            raise BisectionError(f"project {self.project.name}: {e}") from e
        self.repo = repo
        self.row = self.db.create_bisection(self.project.name, self.target, "test",
                                            {"suite": self.subject.suite, "case": self.subject.case},
                                            revs[0], revs[-1], self.origin_run_id)
        self.say(f"bisect-{self.row.id}: {self.subject} on {self.target}, {len(revs) - 1} commits in "
                 f"{revs[0][:12]}..{revs[-1][:12]}")
        try:
            with gearman_client(self.cfg) as self.client:
                s = self.settings
                ends = (self._judge(revs[0], s.confirm), self._judge(revs[-1], s.confirm))
                # A failure the nightly saw that does not come back at the same revision is flaky.
                out = bisect.search(revs, lambda rev: self._judge(rev, s.repeat), s.budget, ends=ends,
                                    unreproduced="flaky")
        except (GearmanError, StoreError, nightly.RunError, snapshot.SourceError) as e:
            self.db.update_bisection(self.row.id, state="error", message=f"the farm could not go on: {e}",
                                     probes=self.evidence)
            raise BisectionError(f"bisect-{self.row.id}: the farm could not go on: {e}") from e
        return self._finish(out)

    def _finish(self, out: bisect.Outcome) -> Bisection:
        assert self.row is not None
        detail: dict[str, Any] = {
            "message": out.message, "suspects": out.suspects, "last_good": out.last_good, "first_bad": out.first_bad,
            "builds": out.builds, "jobs": out.jobs, "probes": self.evidence,
            "settings": {"confirm": self.settings.confirm, "repeat": self.settings.repeat, "seed": self.settings.seed,
                         "budget": vars(self.settings.budget)}}
        if out.culprit is not None:
            c = snapshot.commit_of(self.repo, out.culprit)
            by_rev = {p.rev: p for p in out.probes}
            detail.update(author=c.author, subject=c.subject, committed_at=c.at,
                          confidence=confidence(by_rev[out.last_good].jobs, by_rev[out.culprit].jobs))
        self.db.update_bisection(self.row.id, state=out.state, culprit_rev=out.culprit, **detail)
        self.say(f"bisect-{self.row.id}: {out.state}: {out.message}")
        row = next(b for b in self.db.bisections(project=self.project.name) if b.id == self.row.id)
        return row

    def _judge(self, rev: str, times: int) -> bisect.Probe:
        """Run the test at ``rev`` up to ``times`` times (stopping once it has both passed and
        failed, or its build failed) and give the verdict with its evidence."""
        statuses: list[str] = []
        built = False
        runs: list[str] = []
        why = ""
        for _ in range(times):
            outcome = self._once(rev)
            runs.append(outcome["run_id"])
            built = built or outcome["built"]
            why = outcome["why"] or why
            if outcome["case"] is None:
                break  # it did not build, or cannot run this test: a skip, not a verdict
            statuses.append(outcome["case"])
            if "passed" in statuses and any(st != "passed" for st in statuses):
                break
        verdict = bisect.judge_test(statuses)
        self.evidence.append({"rev": rev, "verdict": verdict, "statuses": statuses, "built": built,
                              "runs": runs, "why": why})
        assert self.row is not None
        self.db.update_bisection(self.row.id, probes=self.evidence)
        self.say(f"bisect-{self.row.id}: {rev[:12]} {verdict} ({', '.join(statuses) or why})")
        # A judgement's jobs: its test runs; its build counts once, and only if it was made.
        return bisect.Probe(rev, verdict, built=built, jobs=len(statuses), evidence={"statuses": statuses})

    def _once(self, rev: str) -> dict[str, Any]:
        """One probe run at ``rev``: build (or reuse) and run the suite; the named case's status."""
        assert self.row is not None
        self.runs += 1
        run_id = f"{self.row.run_prefix}.{rev[:10]}.{self.runs}"
        text, origin = snapshot.catalog_text(self.cfg, self.project, self.repo, rev)
        try:
            cat = catalog_mod.parse(text, origin)
            sel = nightly.select(cat, [self.target], [self.subject.suite], [])
        except catalog_mod.CatalogError as e:
            return {"run_id": run_id, "built": False, "case": None, "why": f"catalog at {rev[:12]}: {e}"}
        source, moved = nightly.prepare(self.store, nightly.Loaded(self.project.name, self.repo, rev, cat, text))
        p = nightly.plan(run_id, source, sel, self.settings.seed, text, moved)
        p.parent = self.row.run_prefix
        nightly.submit(self.cfg, self.db, self.client, p)
        records = nightly.wait(self.cfg, self.db, self.ledger, self.store, self.client, p)
        nightly.close(self.ledger, self.store, run_id)
        self.db.finish_run(run_id, "finished")
        return {"run_id": run_id, **_case_status(records, self.subject)}


def _case_status(records: list[ResultRecord], subject: TestSubject) -> dict[str, Any]:
    build = next((r for r in records if r.kind == "build"), None)
    test = next((r for r in records if r.kind == "test"), None)
    built = build is not None and build.status in ("passed", "failed") and not build.reused_artifact
    if build is None or build.status != "passed":
        return {"built": built, "case": None,
                "why": f"build {build.status if build else 'missing'}" + (f": {build.message}" if build and
                                                                           build.message else "")}
    if test is None or test.status not in ("passed", "failed", "timed_out"):
        return {"built": built, "case": None, "why": f"the suite was not run by the farm: "
                                                     f"{test.status if test else 'no record'}"}
    case = next((c for c in test.cases if c.name == subject.case), None)
    if case is not None:
        return {"built": built, "case": case.status, "why": ""}
    if test.status == "passed":
        return {"built": built, "case": None, "why": f"the suite has no case {subject.case!r} at this revision"}
    # The suite failed (crashed, timed out) before reporting the case: the case did not pass.
    return {"built": built, "case": "failed", "why": f"the suite {test.status} without reporting the case"}
