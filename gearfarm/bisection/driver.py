"""Bisection on the farm: judge revisions of a range by building each (or reusing its stored
build) and running only the failing test's suite or the regressed benchmark on the farm's own
workers through Gearman, narrowing the range with gearfarm.bisection.search, and recording the evidence
in the results database.

Each judgement is a probe run of its own (``bisect-<id>.<rev>.<n>``): a build job and the one
suite or benchmark, through the same submit, wait, ledger and workers as a nightly, so a probe
survives a dead worker or gearmand like any job. Probe runs are children of ``bisect-<id>``
(not a run), which keeps them out of nightly history, series and last good builds.

A failing test is judged by repetitions: both ends ``confirm`` times before the search (the
nightly's failure was confirmed once already by its re-run), each middle ``repeat`` times. A
test that both passes and fails at one revision is flaky and is not bisected, and so is one
whose failure does not come back at the first bad revision.

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

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from gearfarm.bisection import search as bisect
from gearfarm.config import Config, ProjectConfig
from gearfarm.db.results import Bisection, ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import Artifact
from gearfarm.formats.result import ResultRecord
from gearfarm.gearman import Client, GearmanError
from gearfarm.hosts.connection import gearman_client
from gearfarm.perf import compare
from gearfarm.run import nightly, snapshot
from gearfarm.run.execution import Executor
from gearfarm.run.ledger import Ledger
from gearfarm.s3.store import ArtifactStore, StoreError

log = logging.getLogger(__name__)
# Pairs before a revision may be called the same as the known-good build (Pinpoint starts with
# 10 repetitions): with 5 a side, one outlier lifts the rank tests' p from 0.008 to 0.08, above
# the high threshold of a change of several IQRs (measured: a -5.2 % revision called "same").
MIN_SAME_PAIRS = 10


class BisectionError(RuntimeError):
    """The bisection cannot start or go on (bad range, unknown test, the farm away): the
    message says what to fix."""


@dataclass(frozen=True)
class TestSubject:
    suite: str
    case: str
    kind = "test"

    def __str__(self) -> str:
        return f"{self.suite}/{self.case}"


@dataclass(frozen=True)
class PerfSubject:
    benchmark: str
    metric: str
    kind = "perf"

    def __str__(self) -> str:
        return f"{self.benchmark}/{self.metric}"


Subject = TestSubject | PerfSubject


@dataclass(frozen=True)
class Settings:
    budget: bisect.Budget = field(default_factory=bisect.Budget)
    # Tests: runs of each end before the search (a flaky test is caught here) and of each middle.
    confirm: int = 4
    repeat: int = 2
    seed: int = 1
    # Benchmarks: the relative change sought at the first bad end (its size; either direction),
    # and the most A/B pairs measured at one revision.
    change: float = 0.05
    max_pairs: int = 40


def test_confidence(good_passes: int, bad_failures: int) -> float:
    """How sure the culprit is not chance: 1 minus the largest probability, over every failure
    rate f, that a test failing at random with rate f both before and after the culprit would
    have failed all ``bad_failures`` runs at the culprit and passed all ``good_passes`` runs at
    its parent (f^m (1-f)^n, largest at f = m / (m + n))."""
    m, n = bad_failures, good_passes
    if m == 0 or n == 0:
        return 0.0
    f = m / (m + n)
    return 1.0 - f ** m * (1.0 - f) ** n


def perf_confidence(culprit_p: float, parent_compared: bool) -> float:
    """1 minus the chance the culprit's difference is noise (its comparison's p-value), times
    1 minus the chance its parent's "same" was wrong (compare.MISS) when the parent was measured
    (the good end is the known-good build itself)."""
    return (1.0 - culprit_p) * ((1.0 - compare.MISS) if parent_compared else 1.0)


class Runner:
    """One bisection of one subject on one target."""

    def __init__(self, cfg: Config, db: ResultsDB, store: ArtifactStore, project: ProjectConfig, target: str,
                 subject: Subject, settings: Settings | None = None, origin_run_id: str | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.cfg, self.db, self.store, self.project, self.target = cfg, db, store, project, target
        self.subject, self.settings, self.origin_run_id = subject, settings or Settings(), origin_run_id
        self.say = say or (lambda _m: None)
        self.ledger = Ledger(db)
        self.row: Bisection | None = None
        self.evidence: list[dict[str, Any]] = []
        self.runs = 0
        self.good_build: Artifact | None = None
        self.client: Client | None = None

    # ------------------------------------------------------------------ the whole bisection

    def run(self, good: str, bad: str) -> Bisection:
        try:
            self.repo = snapshot.repository(self.cfg, self.project)
            revs = snapshot.first_parent_range(self.repo, good, bad)
            self._selection(revs[-1])  # the subject must exist at the first bad revision
        except snapshot.SourceError as e:
            raise BisectionError(f"project {self.project.name}: {e}") from e
        except catalog_mod.CatalogError as e:
            raise BisectionError(f"project {self.project.name} at {revs[-1][:12]}: {e}") from e
        s = self.subject
        self.row = self.db.create_bisection(self.project.name, self.target, s.kind, asdict(s), revs[0], revs[-1],
                                            self.origin_run_id)
        self.db.update_bisection(self.row.id, revs=revs)
        self.say(f"{self.row.run_prefix}: {s} on {self.target}, {len(revs) - 1} commits in "
                 f"{revs[0][:12]}..{revs[-1][:12]}")
        try:
            with gearman_client(self.cfg) as self.client:
                out = self._search(revs)
            return self._finish(out)
        except (GearmanError, StoreError, nightly.RunError, snapshot.SourceError, SQLAlchemyError) as e:
            why = str(e).splitlines()[0] if isinstance(e, SQLAlchemyError) else str(e)
            try:
                self.db.update_bisection(self.row.id, state="error", message=f"the farm could not go on: {why}",
                                         probes=self.evidence)
            except SQLAlchemyError:
                log.warning("%s: the results database is away; its state stays 'running'", self.row.run_prefix)
            raise BisectionError(f"{self.row.run_prefix}: the farm could not go on: {why}") from e

    def _search(self, revs: list[str]) -> bisect.SearchResult:
        st = self.settings
        if isinstance(self.subject, TestSubject):
            ends = (self._judge_test(revs[0], st.confirm), self._judge_test(revs[-1], st.confirm))
            # A failure the nightly saw that does not come back at the same revision is flaky.
            return bisect.search(revs, lambda rev: self._judge_test(rev, st.repeat), st.budget, ends=ends,
                                 unreproduced="flaky")
        self.good_build, built = self._build(revs[0])
        good = bisect.Probe(revs[0], "good", built=built, evidence={"known_good": True})
        self.evidence.append({"rev": revs[0], "verdict": "good", "built": built, "known_good": True})
        bad = self._judge_perf(revs[-1], st.change, either=True)
        if bad.verdict == "bad":
            sought = float(bad.evidence["change"])  # type: ignore[arg-type]
            return bisect.search(revs, lambda rev: self._judge_perf(rev, sought), st.budget, ends=(good, bad))
        return bisect.search(revs, lambda rev: self._judge_perf(rev, st.change), st.budget, ends=(good, bad))

    def _finish(self, out: bisect.SearchResult) -> Bisection:
        assert self.row is not None
        st = self.settings
        detail: dict[str, Any] = {
            "message": out.message, "suspects": out.suspects, "last_good": out.last_good, "first_bad": out.first_bad,
            "builds": out.builds, "jobs": out.jobs, "probes": self.evidence,
            "settings": {"confirm": st.confirm, "repeat": st.repeat, "seed": st.seed, "change": st.change,
                         "max_pairs": st.max_pairs, "budget": vars(st.budget)}}
        if out.culprit is not None:
            c = snapshot.commit_of(self.repo, out.culprit)
            by_rev = {p.rev: p for p in out.probes}
            culprit, parent = by_rev[out.culprit], by_rev[out.last_good]
            if isinstance(self.subject, TestSubject):
                conf = test_confidence(parent.jobs, culprit.jobs)
            else:
                conf = perf_confidence(float(culprit.evidence["p"]),  # type: ignore[arg-type]
                                       not parent.evidence.get("known_good"))
            detail.update(author=c.author, subject=c.subject, committed_at=c.at, confidence=conf)
        self.db.update_bisection(self.row.id, state=out.state, culprit_rev=out.culprit, **detail)
        self.say(f"{self.row.run_prefix}: {out.state}: {out.message}")
        return self.db.get_bisection(self.row.id)

    # ------------------------------------------------------------------ judging one revision

    def _judge_test(self, rev: str, times: int) -> bisect.Probe:
        """Run the test at ``rev`` up to ``times`` times (stopping once it has both passed and
        failed, or it cannot run there) and give the verdict with its evidence."""
        assert isinstance(self.subject, TestSubject)
        statuses: list[str] = []
        built, runs, why = False, [], ""
        for _ in range(times):
            run_id, records = self._probe(rev)
            runs.append(run_id)
            outcome = _case_status(records, self.subject)
            built = built or outcome["built"]
            why = outcome["why"] or why
            if outcome["case"] is None:
                break  # it did not build, or cannot run this test: a skip, not a verdict
            statuses.append(outcome["case"])
            if "passed" in statuses and any(st != "passed" for st in statuses):
                break
        verdict = bisect.judge_test(statuses)
        self._record({"rev": rev, "verdict": verdict, "statuses": statuses, "built": built, "runs": runs,
                      "why": why}, f"{', '.join(statuses) or why}")
        # A judgement's jobs are its test runs; its build counts once, and only if it was made.
        return bisect.Probe(rev, verdict, built=built, jobs=len(statuses), evidence={"statuses": statuses})

    def _judge_perf(self, rev: str, change: float, either: bool = False) -> bisect.Probe:
        """A/B pairs of ``rev`` against the known-good build until the comparison decides (or
        max_pairs): bad when it differs by at least half of ``change``, in its direction
        (``either``: in any direction, at the first bad end, where it is not known yet)."""
        assert isinstance(self.subject, PerfSubject)
        new: list[float] = []
        base: list[float] = []
        built, runs, why, jobs = False, [], "", 0
        cmp: compare.Comparison | None = None
        while len(new) < self.settings.max_pairs:
            run_id, records = self._probe(rev, baseline=self.good_build)
            runs.append(run_id)
            got = _pairs(records, self.subject)
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
        self._record(ev, f"{cmp.change:+.2%} over {cmp.size} pairs, p={cmp.p_value:.3g}, {cmp.result}")
        return bisect.Probe(rev, verdict, built=built, jobs=jobs,
                            evidence={"change": cmp.change, "p": cmp.p_value, "result": cmp.result})

    def _record(self, ev: dict[str, Any], summary: str) -> None:
        assert self.row is not None
        self.evidence.append(ev)
        self.db.update_bisection(self.row.id, probes=self.evidence)
        self.say(f"{self.row.run_prefix}: {ev['rev'][:12]} {ev['verdict']} ({summary})")

    # ------------------------------------------------------------------ probe runs

    def _selection(self, rev: str, build_only: bool = False) -> tuple[catalog_mod.Catalog, str, nightly.Selection]:
        """The catalog at ``rev`` and the run selection of the subject (CatalogError when the
        catalog there does not define it for the target)."""
        text, origin = snapshot.catalog_text(self.cfg, self.project, self.repo, rev)
        cat = catalog_mod.parse(text, origin)
        t = self.target
        cat.target(t)
        if build_only:
            return cat, text, nightly.Selection([t], {t: []}, {t: []})
        if isinstance(self.subject, TestSubject):
            if self.subject.suite not in cat.suites_for(t):
                raise catalog_mod.CatalogError(f"target {t} does not run suite {self.subject.suite!r}; its suites: "
                                               f"{', '.join(cat.suites_for(t)) or 'none'}")
            return cat, text, nightly.select(cat, [t], [self.subject.suite], [])
        bench = cat.benchmark(self.subject.benchmark)
        if not cat.target(t).perf:
            raise catalog_mod.CatalogError(f"target {t} runs no benchmarks (its catalog entry has perf = false)")
        if self.subject.metric not in bench.metrics:
            raise catalog_mod.CatalogError(f"benchmark {self.subject.benchmark} has no metric "
                                           f"{self.subject.metric!r}; its metrics: {', '.join(sorted(bench.metrics))}")
        return cat, text, nightly.select(cat, [t], [], [self.subject.benchmark])

    def _probe(self, rev: str, baseline: Artifact | None = None,
               build_only: bool = False) -> tuple[str, list[ResultRecord]]:
        """One probe run at ``rev``: build (or reuse) and run the subject; its records (none
        when the catalog at ``rev`` cannot run the subject: a skip)."""
        assert self.row is not None and self.client is not None
        self.runs += 1
        run_id = f"{self.row.run_prefix}.{rev[:10]}.{self.runs}"
        try:
            cat, text, sel = self._selection(rev, build_only)
        except catalog_mod.CatalogError as e:
            log.info("%s: %s", run_id, e)
            return run_id, []
        source, moved = nightly.prepare(self.store, nightly.Loaded(self.project.name, self.repo, rev, cat, text))
        p = nightly.plan(run_id, source, sel, self.settings.seed, text, moved)
        p.parent = self.row.run_prefix
        if isinstance(self.subject, TestSubject) and not build_only:
            # Only the failing case, where the suite says how (its `only`); else the whole suite.
            p.cases = [self.subject.case]
        if baseline is not None:
            p.baselines[self.target] = baseline
        ex = Executor(self.cfg, self.db, self.ledger, self.store, self.client)
        return run_id, ex.execute([p])[run_id]

    def _build(self, rev: str) -> tuple[Artifact, bool]:
        """The known-good build of ``rev`` (made now, or reused) and whether it was made."""
        run_id, records = self._probe(rev, build_only=True)
        b = next((r for r in records if r.kind == "build"), None)
        if b is None or b.status != "passed" or not b.artifact_key or not b.artifact_sha256:
            raise nightly.RunError(f"the last good revision {rev[:12]} did not build in {run_id}: "
                                   f"{b.status + ': ' + b.message if b else 'no record'}")
        return Artifact(b.artifact_key, b.artifact_sha256, rev), not b.reused_artifact


def _like(measured: float, sought: float, either: bool) -> bool:
    """A change at least half the size of the one sought, in its direction (``either``: any)."""
    return abs(measured) >= abs(sought) / 2 and (either or measured * sought > 0)


def _built(records: list[ResultRecord]) -> tuple[ResultRecord | None, bool, str]:
    """The probe's build record, whether it was made (not reused), and why nothing can be
    judged ("" when the build passed)."""
    build = next((r for r in records if r.kind == "build"), None)
    if build is None:
        return None, False, "the catalog cannot run it at this revision"
    made = build.status in ("passed", "failed") and not build.reused_artifact
    why = "" if build.status == "passed" else f"build {build.status}" + (f": {build.message}" if build.message else "")
    return build, made, why


def _case_status(records: list[ResultRecord], subject: TestSubject) -> dict[str, Any]:
    _, built, why = _built(records)
    if why:
        return {"built": built, "case": None, "why": why}
    test = next((r for r in records if r.kind == "test"), None)
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


def _pairs(records: list[ResultRecord], subject: PerfSubject) -> dict[str, Any]:
    _, built, why = _built(records)
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


@dataclass(frozen=True)
class Candidate:
    """A regression a nightly found whose range holds more than one commit: what to bisect."""

    project: ProjectConfig
    target: str
    subject: Subject
    good: str
    bad: str
    origin_run_id: str


def settings_of(cfg: Config, seed: int = 1) -> Settings:
    b = cfg.bisect
    return Settings(bisect.Budget(b.builds, b.jobs, b.hours * 3600), b.confirm, b.repeat, seed,
                    max_pairs=b.max_pairs)


def candidates(cfg: Config, db: ResultsDB, run_id: str) -> list[Candidate]:
    """The regressions ``run_id``'s report found (gearfarm.db.triage's rows: new failures and
    performance changes, not triaged as expected, fixed or won't fix, not bisected before) whose
    range (last good, first bad] holds more than one commit. A new failure's last good revision
    is the previous run's on its target; one with no earlier run, or a one-commit range (the
    culprit is the first bad revision itself), is not bisected."""
    from gearfarm.db import triage

    run = db.get_run(run_id)
    if run is None:
        return []
    try:
        project = cfg.project(run.project)
    except ValueError:
        log.warning("run %s: project %s is no longer configured; its regressions are not bisected", run_id,
                    run.project)
        return []
    repo = snapshot.repository(cfg, project)
    done = {(b.target, b.kind, tuple(b.subject.values()), b.good_rev, b.bad_rev)
            for b in db.bisections(project=run.project, limit=1000)}
    out: list[Candidate] = []
    # Found by this run's report: a performance change is recorded at its first bad night,
    # which may be an earlier run's.
    found = [g for g in triage.listing(db, project=run.project, limit=1000) if g.detected_at >= run.created_at
             and g.state in ("untriaged", "investigating")]
    for g in found:
        subject: Subject
        if g.kind == "failure":
            suite, _, case = g.subject.partition("/")
            subject = TestSubject(suite, case)
        else:
            subject = PerfSubject(str(g.detail.get("benchmark")), str(g.detail.get("metric")))
        good = triage.last_good_rev(db, g)
        if not good or good == g.first_bad_rev:
            continue
        try:
            commits = len(snapshot.first_parent_range(repo, good, g.first_bad_rev)) - 1
        except snapshot.SourceError as e:
            log.warning("run %s: %s on %s is not bisected: %s", run_id, subject, g.target, e)
            continue
        key = (g.target, subject.kind, tuple(asdict(subject).values()), good, g.first_bad_rev)
        if commits > 1 and key not in done:
            done.add(key)
            out.append(Candidate(project, g.target, subject, good, g.first_bad_rev, run_id))
    return out


def run_all(cfg: Config, db: ResultsDB, store: ArtifactStore, found: list[Candidate], seed: int = 1,
            say: Callable[[str], None] | None = None) -> list[Bisection | BisectionError]:
    """Bisect every candidate, [bisect] parallel at a time (each on its own Gearman connection;
    the farm's workers run their probe jobs side by side). A bisection that cannot go on is
    returned as its error; the others are not affected."""
    from concurrent.futures import ThreadPoolExecutor

    def one(c: Candidate) -> Bisection | BisectionError:
        try:
            return Runner(cfg, db, store, c.project, c.target, c.subject, settings_of(cfg, seed), c.origin_run_id,
                          say).run(c.good, c.bad)
        except BisectionError as e:
            log.warning("%s", e)
            return e

    with ThreadPoolExecutor(max_workers=cfg.bisect.parallel, thread_name_prefix="bisect") as pool:
        return list(pool.map(one, found))


def describe(b: Bisection) -> str:
    """The bisection as text: the culprit (hash, author, subject, confidence), how it ended and
    what it spent, and the evidence, one line per revision judged, oldest first."""
    d = b.detail
    what = "/".join(str(v) for v in b.subject.values())
    lines = [f"bisect-{b.id}: {b.kind} {what} on {b.target}, {b.good_rev[:12]}..{b.bad_rev[:12]}: {b.state}"]
    if b.culprit_rev:
        lines += [f"culprit: {b.culprit_rev} {d.get('subject', '')}", f"author:  {d.get('author', '')}",
                  f"confidence: {d.get('confidence', 0.0):.3f}"]
    lines.append(f"{d.get('message', '')} ({d.get('builds', 0)} builds made, {d.get('jobs', 0)} jobs)")
    for p in bisect.ordered_evidence(d):
        lines.append(f"  {p['rev'][:12]}  {p['verdict']:<5} {bisect.evidence_line(p)}"
                     f"{'  (built)' if p.get('built') else ''}")
    return "\n".join(lines)
