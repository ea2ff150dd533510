"""The farm side of every bisection: its records in the results database and its probe runs.

One Bisector bisects one range of one target for one or more subjects: a group of failing
tests (gearfarm.bisection.failures) or one benchmark (gearfarm.bisection.benchmark). It records
one Bisection row per subject, every row naming the group (the first row's id), so each
failure's record says its own culprit, confidence and evidence and the group it belonged to.

Each judgement is a probe run of its own (``bisect-<group>.<rev>.<n>``): a build job and the
suites or the benchmark, through the same submit, wait, ledger and workers as a nightly, so a
probe survives a dead worker or gearmand like any job. Probe runs are children of
``bisect-<group>`` (not a run), which keeps them out of nightly history, series and last good
builds. A build is made once per revision: a later probe of that revision, in this group or
another, names the signed build in its build job's payload and the worker reuses it
(nightly.build_payload); RevisionLocks keeps two bisections running side by side from building
one revision at the same time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from gearfarm.bisection import search as bisect
from gearfarm.bisection.subject import BisectionError, Settings, Subject
from gearfarm.config import Config, ProjectConfig
from gearfarm.db.results import Bisection, ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import Artifact
from gearfarm.formats.result import ResultRecord
from gearfarm.formats.words import counted
from gearfarm.gearman import Client, GearmanError
from gearfarm.hosts.connection import gearman_client
from gearfarm.run import nightly, snapshot
from gearfarm.run.execution import Executor
from gearfarm.run.ledger import Ledger
from gearfarm.s3.store import ArtifactStore, StoreError

log = logging.getLogger(__name__)
# What a probe job did, by its record's status: it ran (and counts as a job of the budget).
RAN = ("passed", "failed", "timed_out")


class RevisionLocks:
    """One lock per (project, target, revision), shared by the bisections run side by side
    (driver.run_all): the first to probe a revision builds it, the other waits and reuses the
    signed build instead of making it again at the same time."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str, str], threading.Lock] = {}

    @contextmanager
    def hold(self, project: str, target: str, rev: str) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault((project, target, rev), threading.Lock())
        with lock:
            yield


class Bisector:
    """One bisection of ``subjects`` on one target; a subclass selects what a probe runs and
    judges the revisions (``_check``, ``_select``, ``_bisect``)."""

    def __init__(self, cfg: Config, db: ResultsDB, store: ArtifactStore, project: ProjectConfig, target: str,
                 subjects: Sequence[Subject], settings: Settings | None = None, origin_run_id: str | None = None,
                 say: Callable[[str], None] | None = None, locks: RevisionLocks | None = None) -> None:
        if not subjects:
            raise ValueError("a bisection needs something to bisect")
        self.cfg, self.db, self.store, self.project, self.target = cfg, db, store, project, target
        self.subjects, self.settings, self.origin_run_id = list(subjects), settings or Settings(), origin_run_id
        self.say = say or (lambda _m: None)
        self.locks = locks or RevisionLocks()
        self.ledger = Ledger(db)
        self.rows: list[Bisection] = []
        self.client: Client | None = None
        # What the group spent, whichever subject it was judged for: its budget and its record.
        self.runs = self.builds = self.jobs = 0
        self.started = time.monotonic()

    @property
    def prefix(self) -> str:
        """The parent_run_id of the probe runs: the group's, its first row's."""
        return f"bisect-{self.rows[0].id}"

    # ------------------------------------------------------------------ the whole bisection

    def run(self, good: str, bad: str) -> list[Bisection]:
        """Bisect good..bad; every subject's row as it ended. BisectionError when it cannot
        start (nothing recorded) or the farm cannot go on (the rows say "error")."""
        try:
            self.repo = snapshot.repository(self.cfg, self.project)
            revs = snapshot.first_parent_range(self.repo, good, bad)
            self._check(self._catalog(revs[-1])[0])  # the subjects must exist at the first bad revision
        except snapshot.SourceError as e:
            raise BisectionError(f"project {self.project.name}: {e}") from e
        except catalog_mod.CatalogError as e:
            raise BisectionError(f"project {self.project.name} at {revs[-1][:12]}: {e}") from e
        self._open(revs)
        try:
            with gearman_client(self.cfg) as self.client:
                return self._bisect(revs)
        except (GearmanError, StoreError, nightly.RunError, snapshot.SourceError, SQLAlchemyError) as e:
            why = str(e).splitlines()[0] if isinstance(e, SQLAlchemyError) else str(e)
            try:
                for row in self.rows:
                    self.db.update_bisection(row.id, state="error", message=f"the farm could not go on: {why}",
                                             group=self.group())
            except SQLAlchemyError:
                log.warning("%s: the results database is away; its state stays 'running'", self.prefix)
            raise BisectionError(f"{self.prefix}: the farm could not go on: {why}") from e

    def _open(self, revs: list[str]) -> None:
        self.started = time.monotonic()
        for s in self.subjects:
            self.rows.append(self.db.create_bisection(self.project.name, self.target, s.kind, asdict(s), revs[0],
                                                      revs[-1], self.origin_run_id))
        for row in self.rows:
            self.db.update_bisection(row.id, revs=revs, group=self.group())
        what = str(self.subjects[0]) if len(self.subjects) == 1 else counted(len(self.subjects), "failure")
        self.say(f"{self.prefix}: {what} on {self.target}, {counted(len(revs) - 1, 'commit')} in "
                 f"{revs[0][:12]}..{revs[-1][:12]}")

    def group(self) -> dict[str, Any]:
        """The group as each of its rows records it: its id, its members, what it spent."""
        return {"id": self.rows[0].id, "failures": [str(s) for s in self.subjects], "runs": self.runs,
                "builds": self.builds, "jobs": self.jobs, "seconds": round(time.monotonic() - self.started, 1)}

    def over(self) -> str | None:
        """Why the group may judge no further revision (its budget spent); None while it may."""
        return self.settings.budget.spent(self.builds, self.jobs, time.monotonic() - self.started)

    def _finish(self, row: Bisection, out: bisect.SearchResult, evidence: list[dict[str, Any]],
                confidence: Callable[[bisect.SearchResult], float]) -> Bisection:
        """Record how ``row``'s search ended: its culprit (commit, author, confidence), its
        evidence, and the group's spending."""
        detail: dict[str, Any] = {
            "message": out.message, "suspects": out.suspects, "last_good": out.last_good, "first_bad": out.first_bad,
            "builds": self.builds, "jobs": self.jobs, "probes": evidence, "settings": self.settings.as_dict(),
            "group": self.group()}
        if out.culprit is not None:
            c = snapshot.commit_of(self.repo, out.culprit)
            detail.update(author=c.author, subject=c.subject, committed_at=c.at, confidence=confidence(out))
        self.db.update_bisection(row.id, state=out.state, culprit_rev=out.culprit, **detail)
        what = "/".join(str(v) for v in row.subject.values())
        self.say(f"{self.prefix}: {what}: {out.state}: {out.message}")
        return self.db.get_bisection(row.id)

    # ------------------------------------------------------------------ what a subclass says

    def _check(self, cat: catalog_mod.Catalog) -> None:
        """CatalogError unless the catalog at the first bad revision runs every subject."""
        raise NotImplementedError

    def _select(self, cat: catalog_mod.Catalog) -> nightly.Selection:
        """What a probe at a revision with catalog ``cat`` runs (CatalogError: nothing)."""
        raise NotImplementedError

    def _cases(self) -> list[str]:
        """Only these cases of the suites (their `only`); empty: the whole suites."""
        return []

    def _bisect(self, revs: list[str]) -> list[Bisection]:
        raise NotImplementedError

    # ------------------------------------------------------------------ probe runs

    def _catalog(self, rev: str) -> tuple[catalog_mod.Catalog, str]:
        text, origin = snapshot.catalog_text(self.cfg, self.project, self.repo, rev)
        cat = catalog_mod.parse(text, origin)
        cat.target(self.target)
        return cat, text

    def _probe(self, rev: str, baseline: Artifact | None = None,
               build_only: bool = False) -> tuple[str, list[ResultRecord]]:
        """One probe run at ``rev``: build (or reuse) and run what ``_select`` says; its records
        (none when the catalog at ``rev`` cannot run it: a skip). Counted in the group's spending."""
        assert self.rows and self.client is not None
        self.runs += 1
        run_id = f"{self.prefix}.{rev[:10]}.{self.runs}"
        try:
            cat, text = self._catalog(rev)
            t = self.target
            sel = nightly.Selection([t], {t: []}, {t: []}) if build_only else self._select(cat)
        except catalog_mod.CatalogError as e:
            log.info("%s: %s", run_id, e)
            return run_id, []
        loaded = nightly.Loaded(self.project.name, self.repo, rev, cat, text,
                                mirrors=snapshot.module_mirrors(self.cfg, self.project))
        source, moved = nightly.prepare(self.store, loaded)
        p = nightly.plan(run_id, source, sel, self.settings.seed, text, moved)
        p.parent = self.prefix
        p.cases = [] if build_only else self._cases()
        if baseline is not None:
            p.baselines[self.target] = baseline
        ex = Executor(self.cfg, self.db, self.ledger, self.store, self.client)
        with self.locks.hold(self.project.name, self.target, rev):
            records = ex.execute([p])[run_id]
        self.builds += built_of(records)[1]
        self.jobs += sum(r.kind != "build" and r.status in RAN for r in records)
        return run_id, records

    def _build(self, rev: str) -> tuple[Artifact, bool]:
        """The known-good build of ``rev`` (made now, or reused) and whether it was made."""
        run_id, records = self._probe(rev, build_only=True)
        b = next((r for r in records if r.kind == "build"), None)
        if b is None or b.status != "passed" or not b.artifact_key or not b.artifact_sha256:
            raise nightly.RunError(f"the last good revision {rev[:12]} did not build in {run_id}: "
                                   f"{b.status + ': ' + b.message if b else 'no record'}")
        return Artifact(b.artifact_key, b.artifact_sha256, rev), not b.reused_artifact


def built_of(records: list[ResultRecord]) -> tuple[ResultRecord | None, bool, str]:
    """The probe's build record, whether it was made (not reused), and why nothing can be
    judged ("" when the build passed)."""
    build = next((r for r in records if r.kind == "build"), None)
    if build is None:
        return None, False, "the catalog cannot run it at this revision"
    made = build.status in ("passed", "failed") and not build.reused_artifact
    why = "" if build.status == "passed" else f"build {build.status}" + (f": {build.message}" if build.message else "")
    return build, made, why
