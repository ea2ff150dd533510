"""The build worker: export the engine at the run's revision, build it with the target's
toolchain as the catalog says, pack and upload the artifact (or reuse it), then fan out the
target's test and perf jobs. A build that does not pass ends its dependents through the
ledger's rule, not here."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import tarfile
import time
from pathlib import Path

from gearfarm import catalog as catalog_mod
from gearfarm import process
from gearfarm.catalog import Catalog, Target
from gearfarm.gearman import GearmanError, Job
from gearfarm.job import Artifact, Payload, dependent, sign, step_name
from gearfarm.result import ResultRecord
from gearfarm.s3 import artifact, keys
from gearfarm.workers.base import Context

log = logging.getLogger("gearfarm.worker.build")
LOG_TAIL_LINES = 40


def compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{cc}: unavailable ({e})"
    return out.splitlines()[0].strip() if out else cc


def toolchain(cat: Catalog, target: Target) -> tuple[str, str, str]:
    """(toolchain id, compiler version, flags) for the artifact key and manifest."""
    version = compiler_version(target.cc)
    flags = json.dumps({"argv": cat.build.argv, "cc": target.cc, "static": target.static})
    return keys.toolchain_id(version, flags), version, flags


def export_source(repo: Path, rev: str, dest: Path) -> None:
    """git archive of the revision, so the build never sees the worker's working tree."""
    proc = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, "engine", "jobs"],
                          capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git archive {rev} failed in {repo}: {proc.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(dest, filter="data")


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return process.log_tail(path, lines)


def handle(ctx: Context, p: Payload, job: Job) -> ResultRecord:
    """Whatever goes wrong here (catalog unreadable, revision missing, export or upload error)
    becomes the build's record; the ledger then ends the target's test and perf jobs with it,
    so no run waits for a job that cannot start."""
    started = time.time()
    try:
        cat = catalog_mod.load_at_rev(ctx.repo, p.rev)
        target = cat.target(p.target)
        rec = build(ctx, p, cat, target, started)
    except Exception as e:  # the farm failed (S3, disk, git, catalog), not the engine: say so
        log.exception("build %s failed inside the worker", p.job_id)
        return ctx.record(p, "infra", message=f"build worker error: {type(e).__name__}: {e}",
                          started_at=started, finished_at=time.time())
    if rec.status == "passed":
        fan_out(ctx, p, [s for s in p.suites if s in target.suites], target, rec)
    return rec


def build(ctx: Context, p: Payload, cat: Catalog, target: Target, started: float) -> ResultRecord:
    timings: dict[str, float] = {"queue_wait": max(0.0, started - p.submitted_at)}
    tc_id, cc_version, flags = toolchain(cat, target)
    art_key = keys.artifact(p.rev, p.target, tc_id)
    man_key = keys.manifest(p.rev, p.target, tc_id)
    log_key = keys.job_file(p.run_id, p.target, p.step, "log.txt")

    # Under the worker's own work dir, so a worker killed mid-job has it swept on restart.
    with process.job_dir(ctx.work, "build") as tmpd:
        log_path = tmpd / "build.log"
        log_path.write_text(f"gearfarm build {p.target} at {p.rev} on {ctx.name}\ncompiler: {cc_version}\n")
        reused = False
        bytes_up = 0
        status = "passed"
        message = ""
        t0 = time.monotonic()
        if ctx.store.exists(man_key) and ctx.store.exists(art_key):
            manifest = json.loads(ctx.store.get_bytes(man_key))
            reused = True
            with log_path.open("a") as f:
                f.write(f"artifact {art_key} exists (sha256 {manifest['archive_sha256']}): build and upload "
                        "skipped, 0 bytes moved\n")
            timings["lookup"] = time.monotonic() - t0
        else:
            src = tmpd / "src"
            out = tmpd / "out"
            out.mkdir()
            export_source(ctx.repo, p.rev, src)
            timings["export"] = time.monotonic() - t0
            values = {"src": str(src), "out": str(out), "exe": target.exe, "cc": target.cc, "ar": target.ar,
                      "static": str(target.static)}
            argv = catalog_mod.expand(cat.build.argv, values)
            t0 = time.monotonic()
            ctx.started(p)
            rc, timed_out = process.run_logged(argv, log_path, cat.build.timeout, cwd=src, env=dict(os.environ))
            timings["build"] = time.monotonic() - t0
            manifest = {}
            if timed_out or rc != 0:
                status = "timed_out" if timed_out else "failed"
                message = (f"build timed out after {cat.build.timeout:.0f}s" if timed_out
                           else f"build failed (exit {rc})")
            else:
                outputs = [o.format(exe=target.exe) for o in cat.build.outputs]
                # Nothing about who or when: two builds of the same inputs pack byte-identical
                # archives (the record says who built it and when).
                meta = {"rev": p.rev, "target": p.target, "toolchain": tc_id, "compiler": cc_version,
                        "flags": flags}
                t0 = time.monotonic()
                packed = artifact.pack(out, outputs, meta, tmpd / "artifact.tar.gz")
                # Put-if-absent: a concurrent build of the same (rev, target, toolchain) cannot
                # replace the archive under a sha256 another build's tests were given.
                manifest = artifact.publish(ctx.store, art_key, man_key, tmpd / "artifact.tar.gz", packed)
                bytes_up += manifest["uploaded_bytes"]
                if manifest["raced"]:
                    with log_path.open("a") as f:
                        f.write(f"another build stored {art_key} first (sha256 {manifest['archive_sha256']}); "
                                "using that one\n")
                timings["upload"] = time.monotonic() - t0
        log_tail = tail(log_path)
        ctx.store.put_bytes(log_key, log_path.read_bytes(), "text/plain; charset=utf-8")

    return ctx.record(p, status, started_at=started, finished_at=time.time(), timings=timings,
                      bytes_uploaded=bytes_up, reused_artifact=reused, log_key=log_key,
                      artifact_key=art_key if status == "passed" else None,
                      artifact_sha256=manifest.get("archive_sha256") if status == "passed" else None,
                      message=message, log_tail=log_tail if status != "passed" else "")


def fan_out(ctx: Context, p: Payload, suites: list[str], target: Target, build: ResultRecord) -> None:
    """Submit the target's test (and perf) jobs; they carry the artifact's key and sha256. If
    gearmand stays away past the retries, the nightly's watchdog finds the jobs missing and
    submits them itself (same payload factory), so a passed build is still reported passed."""
    assert build.artifact_key and build.artifact_sha256
    artifact = Artifact(build.artifact_key, build.artifact_sha256)
    steps = [step_name("test", s) for s in suites] + ([step_name("perf", b) for b in p.benchmarks] if target.perf
                                                      else [])
    for step in steps:
        q = dependent(p, step, artifact)
        try:
            ctx.client.submit_background(q.function, sign(q, ctx.cfg.farm.secrets), unique=q.unique)
        except GearmanError as e:
            log.error("cannot submit %s (%s); the nightly will resubmit it", q.job_id, e)
            continue
        log.info("submitted %s %s", q.function, q.step)
