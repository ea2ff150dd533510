"""Running one catalog step in a job's tree: the build (and the outputs it must leave), a suite
(and the test cases its declared format yields), one benchmark run (and its metrics). The
farm's workers and `gearfarm project check` run steps through here, so a team's trial run of
its catalog is the very code its nightly will run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gearfarm import catalog as catalog_mod
from gearfarm import outcome, process
from gearfarm.catalog import Benchmark, Catalog, Suite, Target
from gearfarm.outcome import OutcomeError
from gearfarm.result import CaseResult, CurveRecord
from gearfarm.sandbox import Sandbox


class OutputsMissing(RuntimeError):
    """A declared build output matched nothing: the catalog or the build is wrong."""


class BenchmarkFailed(RuntimeError):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def collect_outputs(root: Path, patterns: list[str]) -> list[str]:
    """The files (relative to ``root``) the output globs name; a directory means every file
    under it. Every glob must match: a missing output is a broken build, not an empty artifact."""
    files: set[str] = set()
    for pattern in patterns:
        matched = sorted(root.glob(pattern)) if pattern not in ("", ".") else [root]
        if not matched:
            raise OutputsMissing(f"build output {pattern!r} (catalog key build.outputs) matched nothing under the "
                                 "source tree after the build: fix the path (relative to the tree's root, not to "
                                 "build.cwd) or make the build write it")
        for m in matched:
            paths = [m] if m.is_file() else sorted(p for p in m.rglob("*") if p.is_file())
            files.update(str(p.relative_to(root)) for p in paths)
    return sorted(f for f in files if not f.startswith(".gearfarm/"))


@dataclass
class BuildRun:
    rc: int | None
    timed_out: bool
    outputs: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def status(self) -> str:
        if self.timed_out:
            return "timed_out"
        return "passed" if self.rc == 0 and not self.error else "failed"

    def message(self, timeout: float) -> str:
        if self.timed_out:
            return f"build timed out after {timeout:.0f}s"
        return self.error or ("" if self.rc == 0 else f"build failed (exit {self.rc})")


def _run(sandbox: Sandbox, argv: list[str], log_path: Path, timeout: float, cwd: Path, env: dict[str, str],
         writable: list[Path]) -> tuple[int | None, bool]:
    """Every catalog command starts here: confined by the worker's sandbox, writing only to
    the job's own directories."""
    full, env = sandbox.command(argv, env, cwd, writable)
    return process.run_logged(full, log_path, timeout, cwd=cwd, env=env, shown=argv)


def run_build(cat: Catalog, target: Target, root: Path, scratch: Path, log_path: Path, sandbox: Sandbox,
              started: Callable[[], None] | None = None) -> BuildRun:
    """Run the catalog's build of ``target`` in the snapshot at ``root``."""
    vals = catalog_mod.values(cat, target, {"root": str(root), "scratch": str(scratch), "junit": "", "seed": "1"})
    argv = catalog_mod.expand(cat.build.argv, vals, target.runner)
    env = catalog_mod.environment(sandbox.environment(), target, cat.build, vals)
    cwd = root / cat.build.cwd.format_map(vals)
    if not cwd.is_dir():
        return BuildRun(None, False, error=f"build.cwd {cat.build.cwd!r} is not a directory of the source tree: "
                                           "fix the catalog's build.cwd (relative to the repository's root)")
    if started is not None:
        started()
    rc, timed_out = _run(sandbox, argv, log_path, cat.build.timeout, cwd, env, [scratch, root])
    run = BuildRun(rc, timed_out)
    if rc == 0 and not timed_out:
        try:
            run.outputs = collect_outputs(root, [o.format_map(vals) for o in cat.build.outputs])
        except OutputsMissing as e:
            run.error = str(e)
            with log_path.open("a") as f:
                f.write(f"error: {e}\n")
    return run


@dataclass
class SuiteRun:
    status: str
    message: str
    cases: list[CaseResult]
    results: Path | None
    seconds: float


def run_suite(cat: Catalog, target: Target, suite: Suite, tree: Path, scratch: Path, log_path: Path, seed: int,
              sandbox: Sandbox, extra_env: dict[str, str] | None = None, cases: list[str] | None = None) -> SuiteRun:
    """Run one suite in ``tree`` (the artifact's files, over the source when the suite asks);
    ``extra_env`` is the host's addition for the runner (a wine prefix). ``cases``: only these,
    by the suite's `only` items (a suite without them runs whole)."""
    junit = scratch.parent / f"{scratch.name}-junit.xml"
    vals = catalog_mod.values(cat, target, {"root": str(tree), "scratch": str(scratch), "junit": str(junit),
                                            "seed": str(seed)})
    argv = (target.runner if suite.runner else []) + catalog_mod.expand(suite.argv, vals, target.runner)
    for case in (cases or []) if suite.only else []:
        argv += catalog_mod.expand(suite.only, {**vals, "case": case})
    env = catalog_mod.environment(sandbox.environment(extra_env), target, suite, vals)
    cwd = tree / suite.cwd.format_map(vals)
    results = Path(suite.results_file.format_map(vals)) if suite.results_file else None
    if results is not None and not results.is_absolute():
        results = cwd / results
    if not cwd.is_dir():
        return SuiteRun("failed", f"suite {suite.name}: cwd {suite.cwd!r} is not a directory of the job's tree "
                                  "(the artifact's files): add it to build.outputs or fix suites."
                                  f"{suite.name}.cwd", [], None, 0.0)
    if suite.format == "ctest":
        try:
            outcome.relocate_ctest(cwd, tree)
        except OutcomeError as e:
            return SuiteRun("failed", f"suite {suite.name}: {e}", [], None, 0.0)
    t0 = time.monotonic()
    # The JUnit file is written beside the scratch directory.
    rc, timed_out = _run(sandbox, argv, log_path, suite.timeout, cwd, env, [scratch, scratch.parent, tree])
    seconds = time.monotonic() - t0
    cases: list[CaseResult] = []
    message = ""
    try:
        cases = outcome.cases(suite.format, suite.name, rc=rc if rc is not None else -1, output=log_path,
                              results=results)
    except OutcomeError as e:
        message = f"suite {suite.name}: {e}"
    if timed_out:
        return SuiteRun("timed_out", f"suite {suite.name} timed out after {suite.timeout:.0f}s and was killed", cases,
                        results, seconds)
    if rc == 0 and cases and all(c.status in ("passed", "skipped") for c in cases):
        return SuiteRun("passed", "", cases, results, seconds)
    bad = [c.name for c in cases if c.status in ("failed", "error")]
    message = message or (f"{len(bad)} failed: {', '.join(bad[:10])}" if bad
                          else f"suite exited {rc} with {len(cases)} test results")
    return SuiteRun("failed", message, cases, results, seconds)


def run_benchmark(cat: Catalog, target: Target, bench: Benchmark, tree: Path, work: Path, tag: str, seed: int,
                  log_path: Path, sandbox: Sandbox, curves: list[CurveRecord] | None = None,
                  variant: Literal["new", "baseline"] = "new") -> dict[str, float]:
    """One run of ``bench`` in ``tree``: its declared metrics, or BenchmarkFailed. With
    ``curves``, the curves the catalog declares are read from its output and appended."""
    scratch = work / f"scratch-{tag}"
    scratch.mkdir()
    out_path = work / f"out-{tag}.log"
    vals = catalog_mod.values(cat, target, {"root": str(tree), "scratch": str(scratch), "junit": "",
                                            "seed": str(seed)})
    argv = (target.runner if bench.runner else []) + catalog_mod.expand(bench.argv, vals, target.runner)
    counted = work / f"callgrind-{tag}.out"
    if bench.counter == "instructions":
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counted}", *argv]
    env = catalog_mod.environment(sandbox.environment(), target, bench, vals)
    cwd = tree / bench.cwd.format_map(vals)
    rc, timed_out = _run(sandbox, argv, out_path, bench.timeout, cwd, env, [scratch, work, tree])
    text = out_path.read_text(errors="replace")
    with log_path.open("a") as f:
        f.write(f"--- {tag} ---\n{text}")
    if timed_out or rc != 0:
        raise BenchmarkFailed("timed_out" if timed_out else "failed",
                              f"benchmark {bench.name} ({tag}) " + ("timed out" if timed_out else f"exited {rc}"))
    declared = [m for m in bench.metrics if not (bench.counter == "instructions" and m == "instructions")]
    try:
        if not declared:
            metrics = {}
        elif bench.metrics_file is not None:
            path = Path(bench.metrics_file.format_map(vals))
            metrics = outcome.metrics_from_file(path if path.is_absolute() else cwd / path, declared)
        else:
            assert bench.metrics_pattern is not None
            metrics = outcome.metrics_from_pattern(text, bench.metrics_pattern, declared)
    except OutcomeError as e:
        raise BenchmarkFailed("failed", f"benchmark {bench.name}: {e}") from e
    if bench.counter == "instructions":
        metrics["instructions"] = instructions(counted, bench.name)
    if curves is not None:
        curves += curves_of(bench, text, variant)
    return {m: v for m, v in metrics.items() if m in bench.metrics}


MAX_POINTS = 2000


def curves_of(bench: Benchmark, text: str, variant: Literal["new", "baseline"]) -> list[CurveRecord]:
    """The catalog's curves from a benchmark's output: every line that is a JSON object with
    the curve's keys is a point (other output is ignored), at most MAX_POINTS a line."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                rows.append(obj)
    out = []
    for c in bench.curves:
        lines: dict[str, list[tuple[float, float]]] = {}
        for obj in rows:
            x, y = obj.get(c.x), obj.get(c.y)
            if isinstance(x, int | float) and isinstance(y, int | float) and not isinstance(x, bool):
                key = str(obj.get(c.split, "")) if c.split else ""
                pts = lines.setdefault(key, [])
                if len(pts) < MAX_POINTS:
                    pts.append((float(x), float(y)))
        if lines:
            out.append(CurveRecord(benchmark=bench.name, title=c.title, x=c.x, y=c.y, variant=variant,
                                   split_name=c.split or "", lines=lines))
    return out


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
