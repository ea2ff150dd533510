"""The perf worker: run one catalog benchmark on tonight's artifact and, when the nightly names
one, on the last good build of the same target, alternately (A B A B ...) on this host. Every
figure is reported as a sample with this host's fingerprint, and each A/B pair also as a
paired ratio, which cancels the host's drift and noise between nights. The figures come from
the metrics file or the output pattern the catalog declares."""

from __future__ import annotations

import time

from gearfarm import process, snapshot, step
from gearfarm.gearman import Job
from gearfarm.job import Payload
from gearfarm.result import ResultRecord, Sample
from gearfarm.s3 import keys
from gearfarm.s3.artifact import ArtifactError
from gearfarm.workers.base import Context
from gearfarm.workers.test import fetch_artifact


def handle(ctx: Context, p: Payload, job: Job) -> ResultRecord:
    started = time.time()
    timings: dict[str, float] = {"queue_wait": max(0.0, started - p.submitted_at)}
    cat = snapshot.fetch_catalog(ctx.store, p.catalog_sha256)
    target = cat.target(p.target)
    assert p.name is not None
    bench = cat.benchmark(p.name)
    log_key = keys.job_file(p.run_id, p.target, p.step, "log.txt")
    samples: list[Sample] = []
    status, message = "passed", ""
    # Under the worker's own work dir, so a worker killed mid-job has it swept on restart.
    with process.job_dir(ctx.work, "perf") as tmpd:
        log_path = tmpd / "perf.log"
        log_path.write_text(f"gearfarm {p.step} of {p.project} for {p.target} at {p.rev} on {ctx.name}\n")
        new_tree = fetch_artifact(ctx, p, tmpd / "new", timings)
        base_tree = None
        if p.baseline_key and p.baseline_sha256 and p.baseline_rev:
            base = p.model_copy(update={"rev": p.baseline_rev, "artifact_key": p.baseline_key,
                                        "artifact_sha256": p.baseline_sha256})
            try:
                base_tree = fetch_artifact(ctx, base, tmpd / "base", {})
                note = f"paired with the last good build {p.baseline_rev}"
            except ArtifactError as e:
                # Tonight's figures are still worth having: run unpaired, and say why.
                note = f"the last good build {p.baseline_rev} cannot be used ({e}); running unpaired"
            with log_path.open("a") as f:
                f.write(note + "\n")
        t0 = time.monotonic()
        ctx.started(p)
        try:
            for rep in range(bench.repetitions):
                # Same seed for both sides of a pair: the pair differs only in the build.
                seed = p.seed + rep
                if base_tree is None:
                    new = step.run_benchmark(cat, target, bench, new_tree, tmpd, f"new{rep}", seed, log_path)
                    samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep) for m, v in new.items()]
                    continue
                # A B, B A, A B ...: whichever side runs first in a pair (colder caches, a
                # freshly unpacked binary) is not always the same one.
                order = ("new", "base") if rep % 2 == 0 else ("base", "new")
                got = {side: step.run_benchmark(cat, target, bench, new_tree if side == "new" else base_tree, tmpd,
                                      f"{side}{rep}", seed, log_path) for side in order}
                new, old = got["new"], got["base"]
                samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep) for m, v in new.items()]
                samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep, variant="baseline")
                            for m, v in old.items()]
                samples += [Sample(benchmark=p.name, metric=m, value=new[m] / old[m], repetition=rep,
                                   variant="ratio") for m in new if old.get(m)]
        except step.BenchmarkFailed as e:
            status, message = e.status, str(e)
        timings["test"] = time.monotonic() - t0
        ctx.store.put_bytes(log_key, log_path.read_bytes(), "text/plain; charset=utf-8")
        return ctx.record(p, status, started_at=started, finished_at=time.time(), timings=timings,
                          log_key=log_key, artifact_key=p.artifact_key, artifact_sha256=p.artifact_sha256,
                          samples=samples, message=message,
                          log_tail="" if status == "passed" else process.log_tail(log_path, 40))
