"""The build worker: fetch the run's catalog and source snapshot from S3 (both checked by the
sha256 in the signed payload), build the target as the catalog says, pack the declared outputs
and upload the artifact (or reuse it), then fan out the target's test and perf jobs. It needs no
git and no clone. A build that does not pass ends its dependents through the ledger's rule."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time

from gearfarm import catalog as catalog_mod
from gearfarm import process, snapshot, step
from gearfarm.catalog import Catalog, Target
from gearfarm.gearman import GearmanError, Job
from gearfarm.job import Artifact, Payload, dependent, function_name, sign, step_name
from gearfarm.priority import longest_first
from gearfarm.result import ResultRecord
from gearfarm.s3 import artifact, keys
from gearfarm.workers.base import Context

log = logging.getLogger("gearfarm.worker.build")
LOG_TAIL_LINES = 40


def tool_version(tool: str) -> str:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{tool}: unavailable ({e})"
    return out.splitlines()[0].strip() if out.strip() else tool


def toolchain(cat: Catalog, target: Target) -> tuple[str, str, str]:
    """(toolchain id, tool versions, build definition) for the artifact key and manifest: a new
    compiler or a changed build command is a new artifact, never a reused one."""
    versions = "\n".join(tool_version(t) for t in target.tools)
    definition = catalog_mod.definition(cat, target)
    return keys.toolchain_id(versions, definition), versions, definition


def missing_tools(target: Target) -> list[str]:
    return [t for t in target.tools if shutil.which(t) is None]


def handle(ctx: Context, p: Payload, job: Job) -> ResultRecord:
    """Whatever goes wrong here (catalog or snapshot unreadable, tools missing, upload error)
    becomes the build's record; the ledger then ends the target's test and perf jobs with it,
    so no run waits for a job that cannot start."""
    started = time.time()
    try:
        cat = snapshot.fetch_catalog(ctx.store, p.catalog_sha256)
        target = cat.target(p.target)
        lacking = missing_tools(target)
        if lacking:
            return ctx.record(p, "infra", started_at=started, finished_at=time.time(),
                              message=f"host {ctx.name} lacks {', '.join(lacking)} that project {p.project} needs "
                                      f"to build {p.target} (catalog targets.{p.target}.tools): install them, or do "
                                      f"not run a build worker for {p.target} here")
        rec = build(ctx, p, cat, target, started)
    except Exception as e:  # the farm failed (S3, disk, catalog), not the project: say so
        log.exception("build %s failed inside the worker", p.job_id)
        return ctx.record(p, "infra", message=f"build worker error: {type(e).__name__}: {e}",
                          started_at=started, finished_at=time.time())
    if rec.status == "passed":
        fan_out(ctx, p, [s for s in p.suites if s in target.suites], target, rec)
    return rec


def build(ctx: Context, p: Payload, cat: Catalog, target: Target, started: float) -> ResultRecord:
    timings: dict[str, float] = {"queue_wait": max(0.0, started - p.submitted_at)}
    tc_id, versions, definition = toolchain(cat, target)
    art_key = keys.artifact(p.rev, p.target, tc_id)
    man_key = keys.manifest(p.rev, p.target, tc_id)
    log_key = keys.job_file(p.run_id, p.target, p.step, "log.txt")

    # Under the worker's own work dir, so a worker killed mid-job has it swept on restart.
    with process.job_dir(ctx.work, "build") as tmpd:
        log_path = tmpd / "build.log"
        log_path.write_text(f"gearfarm build of {p.project} for {p.target} at {p.rev} on {ctx.name}\n"
                            f"tools:\n{versions}\n")
        reused = False
        bytes_up = 0
        status = "passed"
        message = ""
        t0 = time.monotonic()
        manifest: dict[str, object] = {}
        if ctx.store.exists(man_key) and ctx.store.exists(art_key):
            manifest = json.loads(ctx.store.get_bytes(man_key))
            reused = True
            with log_path.open("a") as f:
                f.write(f"artifact {art_key} exists (sha256 {manifest['archive_sha256']}): build and upload "
                        "skipped, 0 bytes moved\n")
            timings["lookup"] = time.monotonic() - t0
        else:
            root, scratch = tmpd / "root", tmpd / "scratch"
            scratch.mkdir()
            size = snapshot.fetch_source(ctx.store, p.rev, p.source_sha256, root, tmpd)
            timings["source"] = time.monotonic() - t0
            with log_path.open("a") as f:
                f.write(f"source snapshot {keys.source(p.rev)}: {size} bytes, sha256 verified\n")
            t0 = time.monotonic()
            run = step.run_build(cat, target, root, scratch, log_path, ctx.sandbox, lambda: ctx.started(p))
            timings["build"] = time.monotonic() - t0
            status, message = run.status, run.message(cat.build.timeout)
            if status == "passed":
                # Nothing about who or when: two builds of the same inputs pack byte-identical
                # archives (the record says who built it and when).
                meta = {"project": p.project, "rev": p.rev, "target": p.target, "toolchain": tc_id,
                        "tools": versions, "definition": definition}
                t0 = time.monotonic()
                archive = tmpd / f"artifact{artifact.ARCHIVE_SUFFIX}"
                packed = artifact.pack(root, run.outputs, meta, archive)
                # Put-if-absent: a concurrent build of the same (rev, target, toolchain) cannot
                # replace the archive under a sha256 another build's tests were given.
                manifest = artifact.publish(ctx.store, art_key, man_key, archive, packed)
                bytes_up += int(manifest["uploaded_bytes"])  # type: ignore[call-overload]
                if manifest["raced"]:
                    with log_path.open("a") as f:
                        f.write(f"another build stored {art_key} first (sha256 {manifest['archive_sha256']}); "
                                "using that one\n")
                timings["upload"] = time.monotonic() - t0
        log_tail = process.log_tail(log_path, LOG_TAIL_LINES)
        ctx.store.put_file(log_key, log_path, "text/plain; charset=utf-8")

    sha = str(manifest.get("archive_sha256")) if status == "passed" else None
    return ctx.record(p, status, started_at=started, finished_at=time.time(), timings=timings,
                      bytes_uploaded=bytes_up, reused_artifact=reused, log_key=log_key,
                      artifact_key=art_key if status == "passed" else None, artifact_sha256=sha,
                      message=message, log_tail=log_tail if status != "passed" else "")


def fan_out(ctx: Context, p: Payload, suites: list[str], target: Target, build: ResultRecord) -> None:
    """Submit the target's test (and perf) jobs; they carry the artifact's key and sha256. If
    gearmand stays away past the retries, the nightly's watchdog finds the jobs missing and
    submits them itself (same payload factory), so a passed build is still reported passed."""
    assert build.artifact_key and build.artifact_sha256
    art = Artifact(build.artifact_key, build.artifact_sha256)
    tests = longest_first([step_name("test", s) for s in suites], function_name("test", p.target),
                          ctx.durations.load())
    steps = tests + ([step_name("perf", b) for b in p.benchmarks] if target.perf else [])
    for name in steps:
        q = dependent(p, name, art)
        try:
            ctx.client.submit_background(q.function, sign(q, ctx.cfg.farm.secrets), unique=q.unique)
        except GearmanError as e:
            log.error("cannot submit %s (%s); the nightly will resubmit it", q.job_id, e)
            continue
        log.info("submitted %s %s", q.function, q.step)
