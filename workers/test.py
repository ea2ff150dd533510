"""The test worker: download the target's artifact, verify every sha256, run one suite as the
catalog at the run's revision defines it (killed at its timeout), and report per-test results."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gearfarm import catalog as catalog_mod
from gearfarm import process
from gearfarm.gearman import Job
from gearfarm.job import Payload
from gearfarm.junit import JUnitError, parse
from gearfarm.result import ResultRecord
from gearfarm.s3 import artifact, keys
from gearfarm.workers.base import Context

log = logging.getLogger("gearfarm.worker.test")


def fetch_artifact(ctx: Context, p: Payload, dest: Path, timings: dict[str, float]) -> Path:
    """Download and verify the artifact; returns the directory its binaries are in."""
    assert p.artifact_key and p.artifact_sha256
    t0 = time.monotonic()
    archive = dest / "artifact.tar.gz"
    ctx.store.get_file(p.artifact_key, archive)
    timings["download"] = time.monotonic() - t0
    t0 = time.monotonic()
    bindir = dest / "bin"
    manifest = artifact.unpack(archive, bindir, p.artifact_sha256)
    if manifest.get("rev") != p.rev or manifest.get("target") != p.target:
        raise artifact.ArtifactError(
            f"artifact manifest is for {manifest.get('target')}@{manifest.get('rev')}, not {p.target}@{p.rev}")
    timings["verify"] = time.monotonic() - t0
    return bindir


def handle(ctx: Context, p: Payload, job: Job) -> ResultRecord:
    started = time.time()
    timings: dict[str, float] = {"queue_wait": max(0.0, started - p.submitted_at)}
    cat = catalog_mod.load_at_rev(ctx.repo, p.rev)
    target = cat.target(p.target)
    assert p.name is not None
    suite = cat.suite(p.name)
    log_key = keys.job_file(p.run_id, p.target, p.step, "log.txt")
    junit_key = keys.job_file(p.run_id, p.target, p.step, "junit.xml")
    # Under the worker's own work dir, so a worker killed mid-job has it swept on restart.
    with process.job_dir(ctx.work, "test") as tmpd:
        log_path = tmpd / "test.log"
        log_path.write_text(f"gearfarm {p.step} for {p.target} at {p.rev} on {ctx.name}\n")
        try:
            bindir = fetch_artifact(ctx, p, tmpd, timings)
        except artifact.ArtifactError as e:
            # Nothing from an unverified artifact runs; this is the farm's failure, not the engine's.
            return ctx.record(p, "infra", message=str(e), started_at=started, finished_at=time.time(),
                              timings=timings)
        scratch = tmpd / "scratch"
        scratch.mkdir()
        junit = tmpd / "junit.xml"
        values = {"bin": str(bindir), "exe": target.exe, "junit": str(junit), "scratch": str(scratch),
                  "seed": str(p.seed)}
        argv = target.runner + catalog_mod.expand(suite.argv, values)
        t0 = time.monotonic()
        ctx.started(p)
        with ctx.runner_env(target.runner, target.runner_env) as env:
            rc, timed_out = process.run_logged(argv, log_path, suite.timeout, cwd=scratch, env=env)
        timings["test"] = time.monotonic() - t0
        cases = []
        message = ""
        if junit.exists():
            try:
                cases = parse(junit)
            except JUnitError as e:
                message = str(e)
            ctx.store.put_file(junit_key, junit, "application/xml")
        if timed_out:
            status = "timed_out"
            message = f"suite {p.name} timed out after {suite.timeout:.0f}s and was killed"
        elif rc == 0 and cases and all(c.status in ("passed", "skipped") for c in cases):
            status = "passed"
        else:
            status = "failed"
            bad = [c.name for c in cases if c.status in ("failed", "error")]
            message = message or (f"{len(bad)} failed: {', '.join(bad[:10])}" if bad
                                  else f"suite exited {rc} with {len(cases)} test results")
        ctx.store.put_bytes(log_key, log_path.read_bytes(), "text/plain; charset=utf-8")
        return ctx.record(p, status, started_at=started, finished_at=time.time(), timings=timings,
                          log_key=log_key, junit_key=junit_key if junit.exists() else None,
                          artifact_key=p.artifact_key, artifact_sha256=p.artifact_sha256, cases=cases,
                          message=message, log_tail="" if status == "passed" else process.log_tail(log_path, 40))
