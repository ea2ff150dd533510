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
from gearfarm.gearman import Job
from gearfarm.hosts import process
from gearfarm.run import snapshot
from gearfarm.s3 import artifact, keys
from gearfarm.step import runner as step
from gearfarm.step import wine
from gearfarm.workers.base import Context

log = logging.getLogger("gearfarm.worker.test")


def fetch_artifact(ctx: Context, p: Payload, tree: Path, timings: dict[str, float], source: bool = False) -> Path:
    """Download and verify the artifact into ``tree`` (over the source snapshot when ``source``);
    returns ``tree``."""
    assert p.artifact_key and p.artifact_sha256
    tmp = tree.parent
    t0 = time.monotonic()
    if source:
        snapshot.fetch_source(ctx.store, p.rev, p.source_sha256, tree, tmp)
    archive = tmp / f"{tree.name}{artifact.ARCHIVE_SUFFIX}"
    ctx.store.get_file(p.artifact_key, archive)
    timings["download"] = timings.get("download", 0.0) + time.monotonic() - t0
    t0 = time.monotonic()
    manifest = artifact.unpack(archive, tree, p.artifact_sha256)
    archive.unlink()
    if manifest.get("rev") != p.rev or manifest.get("target") != p.target:
        raise artifact.ArtifactError(
            f"artifact manifest is for {manifest.get('target')}@{manifest.get('rev')}, not {p.target}@{p.rev}")
    timings["verify"] = timings.get("verify", 0.0) + time.monotonic() - t0
    return tree


def handle(ctx: Context, p: Payload, job: Job) -> ResultRecord:
    started = time.time()
    timings: dict[str, float] = {"queue_wait": max(0.0, started - p.submitted_at)}
    cat = snapshot.fetch_catalog(ctx.store, p.catalog_sha256)
    target = cat.target(p.target)
    assert p.name is not None
    suite = cat.suite(p.name)
    log_key = keys.job_file(p.run_id, p.target, p.step, "log.txt")
    junit_key = keys.job_file(p.run_id, p.target, p.step, "junit.xml")
    # Under the worker's own work dir, so a worker killed mid-job has it swept on restart.
    with process.job_dir(ctx.work, "test") as tmpd:
        log_path = tmpd / "test.log"
        log_path.write_text(f"gearfarm {p.step} of {p.project} for {p.target} at {p.rev} on {ctx.name}\n")
        try:
            tree = fetch_artifact(ctx, p, tmpd / "root", timings, source=suite.source)
        except artifact.ArtifactError as e:
            # Nothing from an unverified artifact runs; this is the farm's failure, not the project's.
            return ctx.record(p, "infra", message=str(e), started_at=started, finished_at=time.time(),
                              timings=timings)
        scratch = tmpd / "scratch"
        scratch.mkdir()
        ctx.started(p)
        prefix = wine.job_prefix(ctx.sandbox, ctx.state / "wine", target.runner, tmpd)
        run = step.run_suite(cat, target, suite, tree, scratch, log_path, p.seed, ctx.sandbox, prefix, p.cases)
        timings["test"] = run.seconds
        status, message, cases = run.status, run.message, run.cases
        has_junit = suite.format in ("junit", "ctest") and run.results is not None and run.results.is_file()
        if has_junit:
            assert run.results is not None
            ctx.store.put_file(junit_key, run.results, "application/xml")
        ctx.store.put_file(log_key, log_path, "text/plain; charset=utf-8")
        return ctx.record(p, status, started_at=started, finished_at=time.time(), timings=timings,
                          log_key=log_key, junit_key=junit_key if has_junit else None,
                          artifact_key=p.artifact_key, artifact_sha256=p.artifact_sha256, cases=cases,
                          message=message, log_tail="" if status == "passed" else process.log_tail(log_path, 40))

