"""The test worker: fetch the run's catalog and the target's artifact from S3 (and the source
snapshot when the suite reads it), verify every sha256, run one suite as the catalog defines it
(killed at its timeout), and turn its output into test cases by the suite's declared format
(JUnit, TAP, CTest or the exit status)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gearfarm.formats.job import Payload
from gearfarm.formats.result import ResultRecord
from gearfarm.run import snapshot
from gearfarm.s3 import artifact
from gearfarm.step import runner, wine
from gearfarm.workers.base import Attempt, Context

log = logging.getLogger(__name__)


def fetch_artifact(ctx: Context, p: Payload, tree: Path, timings: dict[str, float], source: bool = False,
                   aside: Path | None = None) -> Path:
    """Download (or take from this host's cache) and verify the artifact into ``tree`` (over the
    source snapshot when ``source``); returns ``tree``. The archives go to ``aside`` (the job's
    dir of the worker's own files; default: beside ``tree``)."""
    assert p.artifact_key and p.artifact_sha256
    tmp = aside or tree.parent
    t0 = time.monotonic()
    if source:
        snapshot.fetch_source(ctx.store, p.rev, p.source_sha256, tree, tmp)
    archive = tmp / f"{tree.name}{artifact.ARCHIVE_SUFFIX}"
    cached = ctx.archives.take(p.artifact_sha256, archive)
    manifest = None
    if not cached:
        # One download of an archive a host: its slots start suites of one build together (a
        # build's release starts many), and each fetched it where one fetch would have served all.
        with ctx.archives.fetching(p.artifact_sha256):
            cached = ctx.archives.take(p.artifact_sha256, archive)  # a sibling fetched it meanwhile
            if not cached:
                ctx.store.get_file(p.artifact_key, archive)
                timings["download"] = timings.get("download", 0.0) + time.monotonic() - t0
                t0 = time.monotonic()
                manifest = artifact.unpack(archive, tree, p.artifact_sha256)
                ctx.archives.add(p.artifact_sha256, archive)
    if manifest is None:
        timings["download"] = timings.get("download", 0.0) + time.monotonic() - t0
        t0 = time.monotonic()
        try:
            manifest = artifact.unpack(archive, tree, p.artifact_sha256)
        except artifact.ArtifactError as e:
            # The cached copy is damaged: what the payload names is fetched again, and checked again.
            log.warning("cached artifact %s did not verify (%s); downloading it", p.artifact_sha256[:12], e)
            ctx.archives.drop(p.artifact_sha256)
            archive.unlink(missing_ok=True)
            ctx.store.get_file(p.artifact_key, archive)
            manifest = artifact.unpack(archive, tree, p.artifact_sha256)
            ctx.archives.add(p.artifact_sha256, archive)
    archive.unlink()
    if manifest.get("rev") != p.rev or manifest.get("target") != p.target:
        raise artifact.ArtifactError(
            f"artifact manifest is for {manifest.get('target')}@{manifest.get('rev')}, not {p.target}@{p.rev}")
    timings["verify"] = timings.get("verify", 0.0) + time.monotonic() - t0
    return tree


def handle(attempt: Attempt) -> ResultRecord:
    ctx, p, target = attempt.ctx, attempt.p, attempt.target
    assert p.name is not None
    suite = attempt.cat.suite(p.name)
    try:
        tree = fetch_artifact(ctx, p, attempt.disk / "root", attempt.timings, source=suite.source, aside=attempt.tmpd)
    except artifact.ArtifactError as e:
        # Nothing from an unverified artifact runs; this is the farm's failure, not the project's.
        return attempt.refuse(str(e), timings=attempt.timings)
    scratch = attempt.scratch()
    attempt.start()
    # Beside the job's log, not on its disk: the prefix is hard links to the host's template,
    # which cannot cross to another filesystem.
    prefix = wine.job_prefix(ctx.sandbox, ctx.state / "wine", target.runner, attempt.tmpd)
    run = runner.run_suite(attempt.cat, target, suite, tree, scratch, attempt.log_path, p.seed, ctx.sandbox, prefix,
                           p.cases)
    attempt.timings["test"] = run.seconds
    has_junit = suite.format in ("junit", "ctest") and run.results is not None and run.results.is_file()
    files = {"junit.xml": (run.results, "application/xml")} if has_junit and run.results is not None else {}
    return attempt.record(run.status, run.message, files, artifact_key=p.artifact_key,
                          artifact_sha256=p.artifact_sha256, cases=run.cases)
