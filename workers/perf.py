"""The perf worker: run one catalog benchmark on tonight's artifact and, when the nightly names
one, on the last good build of the same target, alternately (A B A B ...) on this host. Every
figure is reported as a sample with this host's fingerprint, and each A/B pair also as a
paired ratio, which cancels the host's drift and noise between nights."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gearfarm import catalog as catalog_mod
from gearfarm import process
from gearfarm.catalog import Benchmark, Target
from gearfarm.gearman import Job
from gearfarm.job import Payload
from gearfarm.result import ResultRecord, Sample
from gearfarm.s3 import keys
from gearfarm.workers.base import Context
from gearfarm.workers.test import fetch_artifact


class BenchmarkFailed(RuntimeError):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


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
        raise BenchmarkFailed("failed", f"benchmark {bench} printed no summary line with metrics")
    return metrics


def run_once(target: Target, bench: Benchmark, name: str, bindir: Path, work: Path, tag: str, seed: int,
             log_path: Path) -> dict[str, float]:
    scratch = work / f"scratch-{tag}"
    scratch.mkdir()
    out_path = work / f"out-{tag}.jsonl"
    values = {"bin": str(bindir), "exe": target.exe, "scratch": str(scratch), "seed": str(seed)}
    argv = target.runner + catalog_mod.expand(bench.argv, values)
    counted = work / f"callgrind-{tag}.out"
    if bench.counter == "instructions":
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counted}", *argv]
    rc, timed_out = process.run_logged(argv, out_path, bench.timeout, cwd=scratch,
                                       env=dict(os.environ, **target.runner_env))
    text = out_path.read_text(errors="replace")
    with log_path.open("a") as f:
        f.write(f"--- {tag} ---\n{text}")
    if timed_out or rc != 0:
        raise BenchmarkFailed("timed_out" if timed_out else "failed",
                              f"benchmark {name} ({tag}) " + ("timed out" if timed_out else f"exited {rc}"))
    metrics = parse_summary(text, name)
    if bench.counter == "instructions":
        metrics["instructions"] = instructions(counted, name)
    return {m: v for m, v in metrics.items() if m in bench.metrics}


def instructions(callgrind_out: Path, bench: str) -> float:
    """Total instructions executed, from callgrind's "summary:" line."""
    try:
        for line in callgrind_out.read_text().splitlines():
            if line.startswith("summary:"):
                return float(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    raise BenchmarkFailed("failed", f"benchmark {bench}: callgrind wrote no instruction count "
                                    "(is valgrind installed? apt-get install valgrind)")


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
    # Under the worker's own work dir, so a worker killed mid-job has it swept on restart.
    with process.job_dir(ctx.work, "perf") as tmpd:
        log_path = tmpd / "perf.log"
        log_path.write_text(f"gearfarm {p.step} for {p.target} at {p.rev} on {ctx.name}\n")
        (tmpd / "new").mkdir()
        bindir = fetch_artifact(ctx, p, tmpd / "new", timings)
        basedir = None
        if p.baseline_key and p.baseline_sha256 and p.baseline_rev:
            (tmpd / "base").mkdir()
            base = p.model_copy(update={"rev": p.baseline_rev, "artifact_key": p.baseline_key,
                                        "artifact_sha256": p.baseline_sha256})
            basedir = fetch_artifact(ctx, base, tmpd / "base", {})
            with log_path.open("a") as f:
                f.write(f"paired with the last good build {p.baseline_rev}\n")
        t0 = time.monotonic()
        ctx.started(p)
        try:
            for rep in range(bench.repetitions):
                # Same seed for both sides of a pair: the pair differs only in the build.
                seed = p.seed + rep
                if basedir is None:
                    new = run_once(target, bench, p.name, bindir, tmpd, f"new{rep}", seed, log_path)
                    samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep) for m, v in new.items()]
                    continue
                # A B, B A, A B ...: whichever side runs first in a pair (colder caches, a
                # freshly unpacked binary) is not always the same one.
                order = ("new", "base") if rep % 2 == 0 else ("base", "new")
                got = {side: run_once(target, bench, p.name, bindir if side == "new" else basedir, tmpd,
                                      f"{side}{rep}", seed, log_path) for side in order}
                new, old = got["new"], got["base"]
                samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep) for m, v in new.items()]
                samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep, variant="baseline")
                            for m, v in old.items()]
                samples += [Sample(benchmark=p.name, metric=m, value=new[m] / old[m], repetition=rep,
                                   variant="ratio") for m in new if old.get(m)]
        except BenchmarkFailed as e:
            status, message = e.status, str(e)
        timings["test"] = time.monotonic() - t0
        ctx.store.put_bytes(log_key, log_path.read_bytes(), "text/plain; charset=utf-8")
        return ctx.record(p, status, started_at=started, finished_at=time.time(), timings=timings,
                          log_key=log_key, artifact_key=p.artifact_key, artifact_sha256=p.artifact_sha256,
                          samples=samples, message=message,
                          log_tail="" if status == "passed" else process.log_tail(log_path, 40))
