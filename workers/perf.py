"""The perf worker: run one catalog benchmark on tonight's artifact and, when the nightly names
one, on the last good build of the same target, alternately (A B, B A, ...) on this host, as
many pairs as the catalog's `repetitions` (5 by default), and on the target's pinned reference
build as a third side when it is another build (A B C, B C A, ...). It measures alone: it holds the host
lock exclusive (gearfarm.hosts.hostlock) while the pairs run, so no build or test of any farm on the
host runs beside it, and it records how quiet the host was (gearfarm.hosts.host.Activity). Every
figure is reported as a sample with this host's fingerprint, and each A/B pair also as a
paired ratio, which cancels the host's drift and noise between nights. The figures come from
the metrics file or the output pattern the catalog declares."""

from __future__ import annotations

import json
import time
from pathlib import Path

from gearfarm.formats.catalog import Benchmark, Catalog, Target
from gearfarm.formats.job import Payload
from gearfarm.formats.result import CurveRecord, ResultRecord, Sample
from gearfarm.formats.words import counted
from gearfarm.hosts import host, jobtree
from gearfarm.perf.pairs import Paired
from gearfarm.s3.artifact import MANIFEST, ArtifactError
from gearfarm.step import runner
from gearfarm.step.sandbox import Sandbox
from gearfarm.workers.base import Attempt
from gearfarm.workers.test import fetch_artifact

# A manifest lists every file of a build; more than this is not one the farm packed.
MANIFEST_MAX = 256 * 1024 * 1024


def _files(tree: Path) -> dict[str, str] | None:
    try:
        # Through jobtree: the tree was the benchmark's to write while it ran.
        files = json.loads(jobtree.read_capped(tree / MANIFEST, MANIFEST_MAX)[0])["files"]
        # A link's identity is where it points (s3.artifact records links, not contents).
        return {name: info.get("sha256") or f"link:{info.get('link')}" for name, info in files.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def identical(new_tree: Path, base_tree: Path) -> bool | None:
    """Whether two artifacts hold the very same files (by the sha256s their manifests list):
    then tonight's build cannot perform differently from the baseline, whatever the figures
    say. LNT ignores changes on an unchanged binary for the same reason."""
    new, base = _files(new_tree), _files(base_tree)
    return None if new is None or base is None else new == base


def handle(attempt: Attempt) -> ResultRecord:
    ctx, p, tmpd, log_path = attempt.ctx, attempt.p, attempt.tmpd, attempt.log_path
    assert p.name is not None
    bench = attempt.cat.benchmark(p.name)
    samples: list[Sample] = []
    curves: list[CurveRecord] = []
    status, message = "passed", ""
    new_tree = fetch_artifact(ctx, p, attempt.disk / "new", attempt.timings, aside=tmpd)
    base_tree = None
    if p.baseline_key and p.baseline_sha256 and p.baseline_rev:
        base = p.model_copy(update={"rev": p.baseline_rev, "artifact_key": p.baseline_key,
                                    "artifact_sha256": p.baseline_sha256})
        try:
            base_tree = fetch_artifact(ctx, base, attempt.disk / "base", {}, aside=tmpd)
            note = f"paired with the last good build {p.baseline_rev}"
        except ArtifactError as e:
            # Tonight's figures are still worth having: run unpaired, and say why.
            note = f"the last good build {p.baseline_rev} cannot be used ({e}); running unpaired"
        attempt.note(note)
    # The reference: the baseline's own runs when it is the same build, else a third side.
    ref_tree, ref_rev = None, None
    if base_tree is not None and p.reference is not None:
        if p.reference_rev == p.baseline_rev:
            ref_tree, ref_rev = base_tree, p.reference_rev
        else:
            ref = p.model_copy(update={"rev": p.reference_rev, "artifact_key": p.reference_key,
                                       "artifact_sha256": p.reference_sha256})
            try:
                ref_tree, ref_rev = fetch_artifact(ctx, ref, attempt.disk / "ref", {}, aside=tmpd), p.reference_rev
                note = f"and with the reference build {p.reference_rev}"
            except ArtifactError as e:
                note = f"the reference build {p.reference_rev} cannot be used ({e}); running without it"
            attempt.note(note)
    same = identical(new_tree, base_tree) if base_tree is not None else None
    t0 = time.monotonic()
    quietness: dict[str, float] = {}
    activity = host.Activity(ctx.hostlock.others)
    # The claim answered before the host is taken: a claim that waits must not hold the others up.
    attempt.settle()
    try:
        with ctx.hostlock.exclusive(f"{ctx.name} {p.job_id}", ctx.cfg.farm.perf_patience) as waited:
            quietness["lock_wait"] = round(waited, 3)
            t0 = time.monotonic()
            attempt.start()
            with activity:
                _measure(attempt.cat, attempt.target, bench, p, new_tree, base_tree, attempt.disk, log_path, samples,
                         ctx.sandbox, curves, ref_tree)
    except runner.BenchmarkFailed as e:
        status, message = e.status, str(e)
    quietness.update(activity.summary)
    attempt.timings["test"] = time.monotonic() - t0
    return attempt.record(status, message, artifact_key=p.artifact_key, artifact_sha256=p.artifact_sha256,
                       samples=samples, curves=curves, quietness=quietness, baseline_identical=same,
                       baseline_rev=p.baseline_rev if base_tree is not None else None, reference_rev=ref_rev)


def _measure(cat: Catalog, target: Target, bench: Benchmark, p: Payload, new_tree: Path, base_tree: Path | None,
             tmpd: Path, log_path: Path, samples: list[Sample], sandbox: Sandbox,
             curves: list[CurveRecord] | None = None, ref_tree: Path | None = None) -> None:
    """The pairs, appended to ``samples`` as they come (a failure keeps the ones before it):
    `repetitions` of them, then, when the catalog sets a precision, more until every metric's
    paired estimate is that precise (or `max_repetitions` ran). With a reference build each
    pair also runs it (a triple), and tonight's runs are divided by its runs too ("ref_ratio");
    a reference that is the baseline's build gets the pair's own ratio."""
    rep = 0
    while rep < bench.repetitions or (base_tree is not None and rep < bench.most_pairs
                                      and not _precise(bench, samples)):
        # Same seed for both sides of a pair: the pair differs only in the build.
        seed = p.seed + rep
        assert p.name is not None
        # The first pair's curves are kept: one of each side is what a person compares.
        keep = curves if rep == 0 else None
        if base_tree is None:
            new = runner.run_benchmark(cat, target, bench, new_tree, tmpd, f"new{rep}", seed, log_path, sandbox, keep)
            samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep) for m, v in new.items()]
        else:
            # A B, B A, A B ... (A B C, B C A, C A B ... with a reference of its own): whichever
            # side runs first (colder caches, a freshly unpacked binary) is not always the same.
            trees = {"new": new_tree, "base": base_tree}
            if ref_tree is not None and ref_tree != base_tree:
                trees["ref"] = ref_tree
            sides = list(trees)
            k = rep % len(sides)
            order = sides[k:] + sides[:k] if len(sides) == 3 else (sides if k == 0 else sides[::-1])
            got = {side: runner.run_benchmark(cat, target, bench, trees[side], tmpd, f"{side}{rep}", seed, log_path,
                                              sandbox, keep if side != "ref" else None,
                                              "new" if side == "new" else "baseline") for side in order}
            new, old = got["new"], got["base"]
            samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep) for m, v in new.items()]
            samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep, variant="baseline")
                        for m, v in old.items()]
            samples += [Sample(benchmark=p.name, metric=m, value=new[m] / old[m], repetition=rep, variant="ratio")
                        for m in new if old.get(m)]
            if ref_tree is not None:
                ref = got.get("ref", old)
                if "ref" in got:
                    samples += [Sample(benchmark=p.name, metric=m, value=v, repetition=rep, variant="reference")
                                for m, v in ref.items()]
                samples += [Sample(benchmark=p.name, metric=m, value=new[m] / ref[m], repetition=rep,
                                   variant="ref_ratio") for m in new if ref.get(m)]
        rep += 1
    if base_tree is not None and bench.precision is not None:
        with log_path.open("a") as f:
            f.write(f"{counted(rep, 'pair')}: {_precision_note(bench, samples)}\n")


def _errors(bench: Benchmark, samples: list[Sample]) -> dict[str, float | None]:
    return {m: Paired.of([s.value for s in samples if s.metric == m and s.variant == "ratio"]).se
            for m in bench.metrics}


def _precise(bench: Benchmark, samples: list[Sample]) -> bool:
    """Whether every metric's paired estimate is as precise as the catalog asks. A metric with
    no ratio at all (a baseline figure of 0) cannot get more precise with more pairs."""
    assert bench.precision is not None
    has_ratio = {s.metric for s in samples if s.variant == "ratio"}
    return all(se is not None and se <= bench.precision
               for m, se in _errors(bench, samples).items() if m in has_ratio)


def _precision_note(bench: Benchmark, samples: list[Sample]) -> str:
    return ", ".join(f"{m} standard error {'-' if se is None else f'{se:.2%}'}"
                     for m, se in _errors(bench, samples).items()) + f" (precision {bench.precision:.2%})"
