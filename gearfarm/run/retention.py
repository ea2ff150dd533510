"""Retention by value: which of the store's objects the farm keeps, and why, and pruning the
rest. The results database says what is worth keeping; S3 says what there is.

Kept, whatever their age (a kept revision keeps its builds on every target and its source):
* the last good and the first bad revision of every regression the reports found (a new
  failure's last good revision is the previous run's on its target);
* every revision a bisection judged, the culprit among them;
* revisions a tag of the project's repository points at ([retention] keep_tags);
* each target's last good build and pinned reference build, which the next nightly's
  benchmarks are paired with;
* the files (logs, results, report) of the runs that first showed a regression, and of runs
  still running.
Everything else expires once it has not been used for [retention] days: a build or source
when no run of its revision (nightly, re-run or bisection probe) started within that time, a
run's files when the run started before it. A run's files are its folder in S3, its folder
on this host's disk ([farm] state_dir/runs/<run>: the reports, the mail and the job files the
publisher wrote there), the job files its records carried (kept with their rows in the results
database: gearfarm.formats.result) and, for a run the dashboard started, its nightly's output
([farm] state_dir/web/<run>.log), one entry under one rule: a nightly host that ran cron for a
year would otherwise keep every night's copy after S3 let it go. The results database keeps every
run's rows (the history the series and the reports are made of), without those files once they
expire. Catalogs and project markers are never pruned (content-addressed and tiny). A pruned
build is made again from the repository when a bisection or a nightly needs it (the build
worker rebuilds what S3 does not have).

Pruning is `gearfarm store prune` (docker/systemd has a daily timer for it), never a side
effect; it refuses to run when the results database has no runs while S3 has run files: that
database would make every build look ordinary.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gearfarm.config import Config
from gearfarm.db import triage
from gearfarm.db.results import ResultsDB
from gearfarm.formats.words import counted
from gearfarm.run import snapshot
from gearfarm.s3.store import ArtifactStore

log = logging.getLogger(__name__)
DAY = 86400.0


class RetentionError(RuntimeError):
    """Pruning would be unsafe or cannot read what it needs; the message says what to fix."""


@dataclass
class Holding:
    """One unit of retention: a revision's builds (``artifacts/<rev>/``), its source
    (``sources/<rev>/``), a run's files (``runs/<run>/`` in S3 and ``local``, its folder on
    this host's disk, when there is one), or something never pruned."""

    kind: str  # build, source, run, other
    name: str  # the revision, the run id, or the top-level folder
    prefix: str
    keys: list[str] = field(default_factory=list)
    local: Path | None = None
    # Files of the run elsewhere on this host's disk: the output of a nightly the dashboard started.
    files: list[Path] = field(default_factory=list)
    # Bytes of the job files the run's records carried, in the results database.
    carried: int = 0
    size: int = 0
    last_used: float = 0.0
    # Why it is kept; empty: it expires (when older than the age limit).
    reasons: list[str] = field(default_factory=list)
    # Kept only because it is younger than the age limit.
    young: bool = False

    @property
    def expired(self) -> bool:
        return not self.reasons


def _group(key: str) -> tuple[str, str, str]:
    top, _, rest = key.partition("/")
    name = rest.split("/", 1)[0]
    kind = {"artifacts": "build", "sources": "source", "runs": "run", "cancels": "run"}.get(top)
    if kind is None or not name:
        return "other", top, f"{top}/"
    # A run's cancel markers (s3.keys.cancel) live outside runs/ and go with the run.
    return kind, name, f"{'runs' if top == 'cancels' else top}/{name}/"


def kept_revisions(cfg: Config, db: ResultsDB) -> dict[str, list[str]]:
    """Revision -> why the policy keeps its builds (see the module's docstring)."""
    why: dict[str, list[str]] = {}

    def keep(rev: str | None, reason: str) -> None:
        if rev:
            why.setdefault(rev, []).append(reason)

    for g in triage.listing(db, limit=1_000_000):
        keep(triage.last_good_rev(db, g), f"last good of regression #{g.id} ({g.subject} on {g.target})")
        keep(g.first_bad_rev, f"first bad of regression #{g.id} ({g.subject} on {g.target})")
    for b in db.bisections(limit=1_000_000):
        for p in (b.detail or {}).get("probes", []):
            keep(p["rev"], f"judged by bisect-{b.id} ({p['verdict']})")
        keep(b.culprit_rev, f"culprit of bisect-{b.id}")
    for project in cfg.project_list():
        if cfg.retention.keep_tags:
            repo = snapshot.local_repository(cfg, project)
            if repo is not None:
                try:
                    for rev, names in snapshot.tags(repo).items():
                        keep(rev, f"tagged {', '.join(sorted(names))} in {project.name}")
                except snapshot.SourceError as e:
                    raise RetentionError(f"cannot read the tags of project {project.name}: {e}") from e
        targets = {t for run in db.runs(limit=200, project=project.name) for t in run.targets or []}
        for t in sorted(targets):
            good = db.last_good_build(project.name, t, exclude_rev="")
            keep(good.rev if good else None, f"last good build of {project.name} on {t} (the next baseline)")
            ref = db.reference_build(project.name, t, cfg.farm.reference_nights)
            keep(ref.rev if ref else None, f"reference build of {project.name} on {t}")
    return why


def kept_runs(db: ResultsDB) -> dict[str, list[str]]:
    why: dict[str, list[str]] = {}
    for g in triage.listing(db, limit=1_000_000):
        why.setdefault(g.first_bad_run, []).append(f"first showed regression #{g.id} ({g.subject} on {g.target})")
    return why


def survey(cfg: Config, db: ResultsDB, store: ArtifactStore, now: float | None = None) -> list[Holding]:
    """Every prefix of the store with its size, last use and why it is kept, or marked expired."""
    now = time.time() if now is None else now
    limit = now - cfg.retention.days * DAY
    revs, runs = kept_revisions(cfg, db), kept_runs(db)
    used, ages = db.revisions_last_used(), db.run_ages()
    entries: dict[str, Holding] = {}
    for key, size, modified in store.objects():
        kind, name, prefix = _group(key)
        e = entries.setdefault(prefix, Holding(kind, name, prefix))
        e.keys.append(key)
        e.size += size
        e.last_used = max(e.last_used, modified)
    runs_dir = cfg.runs_dir()
    for d in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        if not d.is_dir() or d.is_symlink():
            continue
        e = entries.setdefault(f"runs/{d.name}/", Holding("run", d.name, f"runs/{d.name}/"))
        e.local = d
        e.last_used = max(e.last_used, d.stat().st_mtime)
        for f in d.rglob("*"):
            if f.is_file() and not f.is_symlink():
                st = f.stat()
                e.size += st.st_size
                e.last_used = max(e.last_used, st.st_mtime)
    web = cfg.submitted_logs()
    for f in sorted(web.iterdir()) if web.is_dir() else []:
        # <run>.log, and <run>.log.1 when a restart rotated it (gearfarm.hosts.process.spawn).
        run_id = f.name.removesuffix(".1").removesuffix(".log")
        if not run_id or run_id in (f.name, f.name.removesuffix(".1")) or not f.is_file() or f.is_symlink():
            continue
        e = entries.setdefault(f"runs/{run_id}/", Holding("run", run_id, f"runs/{run_id}/"))
        st = f.stat()
        e.files.append(f)
        e.size += st.st_size
        e.last_used = max(e.last_used, st.st_mtime)
    for run_id, size in db.carried_sizes().items():
        e = entries.setdefault(f"runs/{run_id}/", Holding("run", run_id, f"runs/{run_id}/"))
        e.carried = size
        e.size += size
    for e in entries.values():
        if e.kind in ("build", "source"):
            # The database knows when a revision was last used (a later nightly may have reused
            # the build); S3's time of writing answers only for builds no run remembers.
            e.last_used = used.get(e.name, e.last_used)
            e.reasons = list(revs.get(e.name, []))
        elif e.kind == "run":
            if e.name in ages:
                e.last_used = ages[e.name][0]
                if ages[e.name][1] == "running":
                    e.reasons.append("the run is still running")
            e.reasons += runs.get(e.name, [])
        elif e.name == "quarantine":
            e.reasons.append("objects a build found replaced in S3, kept for a look: never pruned (remove them "
                             "with mc rm once looked at)")
        else:
            e.reasons.append("catalogs and project markers are never pruned")
        if not e.reasons and e.last_used >= limit:
            e.young = True
            e.reasons.append(f"used {counted(round((now - e.last_used) / DAY, 1), 'day')} ago "
                             f"(younger than {cfg.retention.days:g})")
    return sorted(entries.values(), key=lambda e: (e.kind, -e.last_used, e.name))


def check_safe(db: ResultsDB, entries: Iterable[Holding]) -> None:
    if not db.run_ages() and any(e.kind == "run" for e in entries):
        raise RetentionError("the results database has no runs while S3 or this host's disk holds run files: every "
                             "build would look ordinary and be pruned; check [database] url (the farm's own "
                             "database) and try again")


def prune(db: ResultsDB, store: ArtifactStore, entries: list[Holding]) -> tuple[int, int, int]:
    """Delete the expired entries' objects and run folders on disk; (objects deleted, bytes
    freed, run folders deleted). S3 goes first: a folder on disk is only ever a copy."""
    check_safe(db, entries)
    doomed = [e for e in entries if e.expired]
    keys = [k for e in doomed for k in e.keys]
    deleted = store.delete(keys) if keys else 0
    folders = 0
    for e in doomed:
        if e.local is not None and e.local.is_dir():
            shutil.rmtree(e.local)
            folders += 1
        for f in e.files:
            f.unlink(missing_ok=True)
        if e.carried:
            db.drop_carried(e.name)
        log.info("pruned %s (%d objects%s%s, %d bytes, last used %s)", e.prefix, len(e.keys),
                 f" and {e.local}" if e.local else "", ", the job files its records carried" if e.carried else "",
                 e.size, time.strftime("%Y-%m-%d", time.gmtime(e.last_used)))
    return deleted, sum(e.size for e in doomed), folders
