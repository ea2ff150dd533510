"""Bisection after a nightly: what its report found, grouped by (project, target, range), and
each group bisected on the farm's own workers; and the text a person reads of a group.

The new failures of one project and target whose range (last good .. first bad) is the same are
one group (issue #35: "seven failures from one commit ran seven bisections of the same range"):
one search judges them all at each revision (gearfarm.bisection.failures). A performance
regression is bisected alone (gearfarm.bisection.benchmark): its judgement is an A/B comparison
of its own. The groups run [bisect] parallel at a time and share RevisionLocks, so no revision
is built twice, in a group or across groups of one target. Budgets apply per group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from gearfarm.bisection import search as bisect
from gearfarm.bisection.benchmark import BenchmarkBisector
from gearfarm.bisection.failures import FailureGroup
from gearfarm.bisection.probing import Bisector, RevisionLocks
from gearfarm.bisection.subject import BisectionError, PerfSubject, Settings, Subject, TestSubject
from gearfarm.config import Config, ProjectConfig
from gearfarm.db.results import Bisection, ResultsDB
from gearfarm.formats.words import counted
from gearfarm.run import snapshot
from gearfarm.s3.store import ArtifactStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """What a nightly found to bisect in one range of one target: a group of new failures, or
    one performance regression."""

    project: ProjectConfig
    target: str
    subjects: tuple[Subject, ...]
    good: str
    bad: str
    origin_run_id: str | None = None


def settings_of(cfg: Config, seed: int = 1) -> Settings:
    b = cfg.bisect
    return Settings(bisect.Budget(b.builds, b.jobs, b.hours * 3600), b.confirm, b.repeat, seed,
                    max_pairs=b.max_pairs)


def bisector(cfg: Config, db: ResultsDB, store: ArtifactStore, project: ProjectConfig, target: str,
             subjects: Sequence[Subject], settings: Settings | None = None, origin_run_id: str | None = None,
             say: Callable[[str], None] | None = None, locks: RevisionLocks | None = None) -> Bisector:
    """The bisection of ``subjects``: failing tests as one group, or one benchmark."""
    kinds = {s.kind for s in subjects}
    if kinds == {"test"}:
        return FailureGroup(cfg, db, store, project, target, subjects, settings, origin_run_id, say, locks)
    if kinds == {"perf"} and len(subjects) == 1:
        return BenchmarkBisector(cfg, db, store, project, target, subjects, settings, origin_run_id, say, locks)
    raise ValueError(f"bisect failing tests together, or one benchmark alone: not {[str(s) for s in subjects]}")


def candidates(cfg: Config, db: ResultsDB, run_id: str) -> list[Candidate]:
    """The regressions ``run_id``'s report found (gearfarm.db.triage's rows: new failures and
    performance changes, not triaged as expected, fixed or won't fix, not bisected before) whose
    range (last good, first bad] holds more than one commit: the new failures of one target and
    range as one group, each performance change alone. A new failure's last good revision is
    the previous run's on its target; one with no earlier run, or a one-commit range (the
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
    groups: dict[tuple[str, str, str, str], list[Subject]] = {}
    # Found by this run's report: a performance change is recorded at its first bad night,
    # which may be an earlier run's.
    found = [g for g in triage.listing(db, project=run.project, limit=1000) if g.detected_at >= run.created_at
             and g.state in ("untriaged", "investigating")]
    for g in sorted(found, key=lambda g: g.id):
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
            # Failures share a group by range; a benchmark has one of its own (its subject).
            group = (g.target, good, g.first_bad_rev, "tests" if subject.kind == "test" else str(subject))
            groups.setdefault(group, []).append(subject)
    return [Candidate(project, target, tuple(subjects), good, bad, run_id)
            for (target, good, bad, _), subjects in groups.items()]


def run_all(cfg: Config, db: ResultsDB, store: ArtifactStore, found: list[Candidate], seed: int = 1,
            say: Callable[[str], None] | None = None) -> list[list[Bisection] | BisectionError]:
    """Bisect every candidate group, [bisect] parallel at a time (each on its own Gearman
    connection; the farm's workers run their probe jobs side by side). A group that cannot go
    on is returned as its error; the others are not affected."""
    from concurrent.futures import ThreadPoolExecutor

    locks = RevisionLocks()

    def one(c: Candidate) -> list[Bisection] | BisectionError:
        try:
            return bisector(cfg, db, store, c.project, c.target, c.subjects, settings_of(cfg, seed), c.origin_run_id,
                            say, locks).run(c.good, c.bad)
        except BisectionError as e:
            log.warning("%s", e)
            return e

    with ThreadPoolExecutor(max_workers=cfg.bisect.parallel, thread_name_prefix="bisect") as pool:
        return list(pool.map(one, found))


def describe(rows: Sequence[Bisection]) -> str:
    """A group's bisection as text (its rows, any order): the range and what the group spent;
    one line per failure with its culprit (hash, subject, author, confidence) or how it ended;
    then the revisions judged, oldest first, with every failure's verdict there."""
    rows = sorted(rows, key=lambda b: b.id)
    first, g = rows[0], (rows[0].detail or {}).get("group", {})
    d = first.detail or {}
    what = counted(len(rows), "failure") if len(rows) > 1 else f"{first.kind} {_what(first)}"
    lines = [f"{first.run_prefix}: {what} on {first.target}, {counted(max(len(d.get('revs', [])) - 1, 0), 'commit')} "
             f"{first.good_rev[:12]}..{first.bad_rev[:12]}: {counted(d.get('builds', 0), 'build')} made, "
             f"{counted(d.get('jobs', 0), 'job')} in {counted(g.get('runs', 0), 'probe run')}, "
             f"{g.get('seconds', 0.0):.0f}s"]
    for b in rows:
        lines.append(f"  {_what(b)}: {b.state}, " + (
            f"culprit {b.culprit_rev} \"{b.detail.get('subject', '')}\" by {b.detail.get('author', '')}, "
            f"confidence {b.detail.get('confidence', 0.0):.3f}" if b.culprit_rev else b.detail.get("message", "")))
    for e in bisect.group_evidence([(_what(b), b.detail or {}) for b in rows]):
        lines.append(f"    {e['rev'][:12]}  {e['verdict']:<5} {e['figures']}{'  (built)' if e['built'] else ''}")
    return "\n".join(lines)


def _what(b: Bisection) -> str:
    return "/".join(str(v) for v in b.subject.values())
