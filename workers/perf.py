"""The perf worker: run one catalog benchmark on the target's artifact R times, parse the JSON
lines it prints, and report every figure as a sample with this host's fingerprint."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from gearfarm import catalog as catalog_mod
from gearfarm import process
from gearfarm.gearman import Job
from gearfarm.job import Payload
from gearfarm.result import ResultRecord, Sample
from s3 import keys
from workers.base import Context
from workers.test import fetch_artifact


def parse_summary(output: str, bench: str) -> dict[str, float]:
    """The metrics of the benchmark's summary line (its last JSON object of type summary)."""
    metrics: dict[str, float] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("type") == "summary":
            metrics = {k: float(v) for k, v in obj.get("metrics", {}).items() if isinstance(v, int | float)}
    if not metrics:
        raise ValueError(f"benchmark {bench} printed no summary line with metrics")
    return metrics


def handle(ctx: Context, p: Payload, job: Job) -> ResultRecord:
    started = time.time()
    timings: dict[str, float] = {"queue_wait": max(0.0, started - p.submitted_at)}
    cat = catalog_mod.load_at_rev(ctx.repo, p.rev)
    target = cat.target(p.target)
    assert p.name is not None
    bench = cat.benchmark(p.name)
    log_key = keys.job_file(p.run_id, p.target, p.step, "log.txt")
    samples: list[Sample] = []
    status, message = "passed", ""
    with tempfile.TemporaryDirectory(prefix="gearfarm-perf-") as tmp:
        tmpd = Path(tmp)
        log_path = tmpd / "perf.log"
        log_path.write_text(f"gearfarm {p.step} for {p.target} at {p.rev} on {ctx.name}\n")
        bindir = fetch_artifact(ctx, p, tmpd, timings)
        t0 = time.monotonic()
        for rep in range(bench.repetitions):
            scratch = tmpd / f"scratch{rep}"
            scratch.mkdir()
            out_path = tmpd / f"out{rep}.jsonl"
            values = {"bin": str(bindir), "exe": target.exe, "scratch": str(scratch), "seed": str(p.seed + rep)}
            argv = target.runner + catalog_mod.expand(bench.argv, values)
            rc, timed_out = process.run_logged(argv, out_path, bench.timeout, cwd=scratch,
                                               env=dict(os.environ, **target.runner_env))
            text = out_path.read_text(errors="replace")
            with log_path.open("a") as f:
                f.write(text)
            if timed_out or rc != 0:
                status = "timed_out" if timed_out else "failed"
                message = f"benchmark {p.name} repetition {rep} " + ("timed out" if timed_out else f"exited {rc}")
                break
            try:
                metrics = parse_summary(text, p.name)
            except ValueError as e:
                status, message = "failed", str(e)
                break
            samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep)
                        for m, v in metrics.items() if m in bench.metrics]
        timings["test"] = time.monotonic() - t0
        ctx.store.put_bytes(log_key, log_path.read_bytes(), "text/plain; charset=utf-8")
        return ctx.record(p, status, started_at=started, finished_at=time.time(), timings=timings,
                          log_key=log_key, artifact_key=p.artifact_key, artifact_sha256=p.artifact_sha256,
                          samples=samples, message=message,
                          log_tail="" if status == "passed" else process.log_tail(log_path, 40))
