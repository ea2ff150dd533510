"""Running one catalog step in a job's tree: the build (and the outputs it must leave), a suite
(and the test cases its declared format yields), one benchmark run (and its metrics). The
farm's workers and `gearfarm project check` run steps through here, so a team's trial run of
its catalog is the very code its nightly will run."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import Benchmark, Catalog, Suite, Target
from gearfarm.formats.result import CaseResult, CurveRecord
from gearfarm.hosts import jobtree, process
from gearfarm.hosts.cgroup import Limits
from gearfarm.s3.artifact import ArtifactError, link_target
from gearfarm.step import ctestfile, hostlib, outcome, runpath
from gearfarm.step.outcome import OutcomeError
from gearfarm.step.sandbox import Ran, Sandbox, within


class OutputsMissing(RuntimeError):
    """A declared build output matched nothing: the catalog or the build is wrong."""


class OutputsUnsafe(RuntimeError):
    """A build output is a link leading out of the job's tree (or nowhere), or a pattern names a
    path outside it: packing it would carry a file of the worker's host out in the artifact."""


class BenchmarkFailed(RuntimeError):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def collect_outputs(root: Path, patterns: list[str]) -> list[str]:
    """The files and symlinks (relative to ``root``) the output globs name; a directory means
    every file and link under it. Every glob must match: a missing output is a broken build,
    not an empty artifact.

    Nothing is followed: the build is the project's code and the worker reads its outputs
    outside the sandbox, so a link could hand it any host file. Paths are looked at with lstat,
    a link is an output of its own (never descended, even to a directory), and a match a glob
    reached through a directory link stands for that link. A link must lead inside ``root`` to
    something that exists (gearfarm.s3.artifact.link_target), else OutputsUnsafe."""
    files: set[str] = set()
    for pattern in patterns:
        try:
            matched = sorted(root.glob(pattern)) if pattern not in ("", ".") else [root]
        except (NotImplementedError, ValueError):  # pathlib's answer to an absolute pattern
            matched = [Path(pattern)]
        except RecursionError:  # Python 3.11's "**" recurses: a tree a thousand deep is the build's doing
            raise OutputsUnsafe(f"build output {pattern!r} (catalog key build.outputs): the tree under it is too "
                                "deep to search (over a thousand directories): name the outputs without `**`, or "
                                "keep the build's tree shallower") from None
        if not matched and os.path.islink(root / pattern):
            matched = [root / pattern]  # a dangling link: glob skips it, but it is what the build left
        if not matched:
            raise OutputsMissing(f"build output {pattern!r} (catalog key build.outputs) matched nothing under the "
                                 "source tree after the build: fix the path (relative to the tree's root, not to "
                                 "build.cwd) or make the build write it")
        for m in matched:
            files.update(_outputs_at(root, m, pattern))
    return sorted(f for f in files if not f.startswith(".gearfarm/"))


def _outputs_at(root: Path, match: Path, pattern: str) -> list[str]:
    try:
        rel = match.relative_to(root)
    except ValueError:
        rel = match
    if rel.is_absolute() or ".." in rel.parts:
        raise OutputsUnsafe(f"build output {pattern!r} (catalog key build.outputs) names {str(match)!r}, outside "
                            "the build's tree: name paths relative to the tree's root, without `..`")
    # The topmost link on the way stands for everything below it.
    for i in range(1, len(rel.parts)):
        if (root / Path(*rel.parts[:i])).is_symlink():
            rel = Path(*rel.parts[:i])
            break
    path = root / rel
    if path.is_symlink():
        return [_checked_link(root, str(rel))]
    if path.is_file():
        return [str(rel)]
    if not path.is_dir():
        return []  # a fifo, socket or device: not an output, as before
    out: list[str] = []
    for d, dirs, names in jobtree.walk(path):  # never enters a link (listed among the names)
        for name in dirs + names:
            p = Path(d) / name
            r = str(p.relative_to(root))
            if p.is_symlink():
                out.append(_checked_link(root, r))
            elif p.is_file():
                out.append(r)
    return out


def _checked_link(root: Path, rel: str) -> str:
    try:
        link_target(root, rel)
    except ArtifactError as e:
        raise OutputsUnsafe(f"{e} (catalog key build.outputs): the worker packs no file from outside the job's "
                            "tree. Make the build copy the file into the tree, or link to a path inside it, or "
                            "leave the link out of build.outputs") from None
    return rel


@dataclass
class BuildRun:
    rc: int | None
    timed_out: bool
    outputs: list[str] = field(default_factory=list)
    error: str = ""
    # The limit of its cgroup the build reached ("": none): the build failed for it, whatever its
    # exit status (a fork or an allocation of it failed) and timed out or not.
    reached: str = ""

    @property
    def status(self) -> str:
        if self.reached:
            return "failed"
        if self.timed_out:
            return "timed_out"
        return "passed" if self.rc == 0 and not self.error else "failed"

    def message(self, timeout: float) -> str:
        if self.reached:
            return f"build failed: {self.reached}" + (f" (then timed out after {timeout:.0f}s)" if self.timed_out
                                                      else f" (exit {self.rc})")
        if self.timed_out:
            return f"build timed out after {timeout:.0f}s"
        return self.error or ("" if self.rc == 0 else f"build failed (exit {self.rc})")


def _run(sandbox: Sandbox, cat: Catalog, step: catalog_mod.Step | None, argv: list[str], log_path: Path,
         timeout: float, cwd: Path, env: dict[str, str], writable: list[Path], wine_prefix: Path | None = None,
         shared: list[Path] | None = None, inner: dict[str, str] | None = None) -> Ran:
    """Every catalog command starts here: confined by the worker's sandbox, writing only to
    the job's own directories, which are handed to the job's uid first, and to ``shared`` ones
    (already the jobs' group's), within the farm's limits as ``step`` and the catalog lower them.
    The log is the worker's: it lives beside those directories, never in one the job writes.
    ``inner``: environment of the command alone (Sandbox.command)."""
    sandbox.give(writable)
    lowered = catalog_mod.limits_for(cat, step)
    limits = Limits(lowered.get("processes"), lowered.get("memory"), lowered.get("cpu_weight"))
    return sandbox.run(argv, log_path, timeout, cwd, env, writable + (shared or []), wine_prefix, inner, limits)


def run_build(cat: Catalog, target: Target, root: Path, scratch: Path, log_path: Path, sandbox: Sandbox,
              started: Callable[[], None] | None = None, project: str | None = None) -> BuildRun:
    """Run the catalog's build of ``target`` (its own, Catalog.build_for) in the snapshot at ``root``;
    with a compiler cache on the host, ``project``'s part of it is the build's CCACHE_DIR."""
    build = cat.build_for(target)
    vals = catalog_mod.values(cat, target, {"root": str(root), "scratch": str(scratch), "junit": "", "seed": "1"})
    argv = catalog_mod.expand(build.argv, vals, target.runner)
    env = catalog_mod.environment(sandbox.environment(), target, build, vals)
    cwd = root / build.cwd.format_map(vals)
    if not cwd.is_dir():
        key = cat.build_key(target, "cwd")
        return BuildRun(None, False, error=f"{key} {build.cwd!r} is not a directory of the source tree: "
                                           f"fix the catalog's {key} (relative to the repository's root)")
    if started is not None:
        started()
    cache = sandbox.compiler_cache(project) if project else None
    if cache is not None:
        # Shared by every slot's uid through the jobs' group (Sandbox.share).
        env.update(CCACHE_DIR=str(cache), CCACHE_UMASK="002")
    rc, timed_out, reached, _ = _run(sandbox, cat, None, argv, log_path, build.timeout, cwd, env, [scratch, root],
                                     shared=[cache] if cache is not None else None)
    run = BuildRun(rc, timed_out, reached=reached)
    if rc == 0 and not timed_out:
        try:
            run.outputs = collect_outputs(root, [o.format_map(vals) for o in build.outputs])
        except (OutputsMissing, OutputsUnsafe) as e:
            # collect_outputs speaks of [build]'s key; a target with outputs of its own is told its own.
            run.error = str(e).replace("build.outputs", cat.build_key(target, "outputs"))
            with log_path.open("a") as f:
                f.write(f"error: {run.error}\n")
    return run


@dataclass
class SuiteRun:
    status: str
    message: str
    cases: list[CaseResult]
    results: Path | None
    seconds: float


def run_suite(cat: Catalog, target: Target, suite: Suite, tree: Path, scratch: Path, log_path: Path, seed: int,
              sandbox: Sandbox, wine_prefix: Path | None = None, cases: list[str] | None = None,
              relink: bool = True) -> SuiteRun:
    """Run one suite in ``tree`` (the artifact's files, over the source when the suite asks);
    ``wine_prefix`` is the job's own prefix for a wine runner (gearfarm.step.wine). ``cases``: only
    these, by the suite's `only` items (a suite without them runs whole). The tree's programs are
    first pointed at its own libraries (gearfarm.step.runpath; ``relink`` false leaves them as
    built), and a program that still loads the host's copy of a built library fails the suite."""
    # The JUnit file is written in a directory of the job's own beside the scratch directory.
    out = scratch.parent / f"{scratch.name}-out"
    out.mkdir(exist_ok=True)
    junit = out / "junit.xml"
    vals = catalog_mod.values(cat, target, {"root": str(tree), "scratch": str(scratch), "junit": str(junit),
                                            "seed": str(seed)})
    argv = (target.runner if suite.runner else []) + catalog_mod.expand(suite.argv, vals, target.runner)
    for case in (cases or []) if suite.only else []:
        argv += catalog_mod.expand(suite.only, {**vals, "case": case})
    env = catalog_mod.environment(sandbox.environment(), target, suite, vals)
    cwd = tree / suite.cwd.format_map(vals)
    results = Path(suite.results_file.format_map(vals)) if suite.results_file else None
    if results is not None and not results.is_absolute():
        results = cwd / results
    if not cwd.is_dir():
        return SuiteRun("failed", f"suite {suite.name}: cwd {suite.cwd!r} is not a directory of the job's tree "
                                  "(the artifact's files): add it to build.outputs or fix suites."
                                  f"{suite.name}.cwd", [], None, 0.0)
    prepared = ctestfile.Prepared()
    if suite.format == "ctest":
        try:
            prepared = ctestfile.prepare(cwd, tree, target.runner)
        except OutcomeError as e:
            return SuiteRun("failed", f"suite {suite.name}: {e}", [], None, 0.0)
    _note(log_path, _relinked(tree, process.jobs_root(scratch.parent)) if relink else [])
    loader = scratch.parent / f"{scratch.name}-loader"
    t0 = time.monotonic()
    rc, timed_out, reached, _ = _run(sandbox, cat, suite, argv, log_path, suite.timeout, cwd, env,
                                     [scratch, out, loader, tree], wine_prefix, inner=hostlib.environment(loader))
    seconds = time.monotonic() - t0
    cases_found: list[CaseResult] = []
    message, copied = "", None
    asked = results
    if results is not None:
        results, message, copied = _results_copy(suite, results, [tree, scratch, out], log_path.parent / (
            f"{scratch.name}-results"), sandbox.result_limit or process.LOG_LIMIT)
    try:
        if not message:
            cases_found = outcome.cases(suite.format, suite.name, rc=rc if rc is not None else -1, output=log_path,
                                        results=results, capped=bool(copied and copied.dropped))
    except OutcomeError as e:
        message = f"suite {suite.name}: {e}"
    capped = ""
    if copied is not None and copied.dropped and results is not None:
        capped = f"suite {suite.name}: {copied.note(asked or results)}"
        _note(log_path, [capped])
        with results.open("a") as f:  # the stored copy says where it was cut, as a capped log does
            f.write(f"\n<!-- {capped} -->\n" if suite.format in ("junit", "ctest") else f"\n# {capped}\n")
    cases_found = _judged(cases_found, suite, loader, tree, prepared, target.runner, log_path)
    if reached:
        # The cause, whatever the cases say: the kernel stopped the suite, or refused it, at its limit.
        then = f", then timed out after {suite.timeout:.0f}s" if timed_out else ""
        return SuiteRun("failed", f"suite {suite.name}: {reached}{then}" + (f"; {message}" if message else ""),
                        cases_found, results, seconds)
    if timed_out:
        return SuiteRun("timed_out", f"suite {suite.name} timed out after {suite.timeout:.0f}s and was killed",
                        cases_found, results, seconds)
    if rc == 0 and cases_found and all(c.status in ("passed", "skipped") for c in cases_found):
        return SuiteRun("passed", capped, cases_found, results, seconds)
    bad = [c.name for c in cases_found if c.status in ("failed", "error")]
    message = message or (f"{len(bad)} failed: {', '.join(bad[:10])}" if bad
                          else f"suite exited {rc} with {len(cases_found)} test results")
    return SuiteRun("failed", "; ".join(m for m in (message, capped) if m), cases_found, results, seconds)


def _results_copy(suite: Suite, results: Path, roots: list[Path], where: Path, limit: int
                  ) -> tuple[Path | None, str, jobtree.Copied | None]:
    """The suite's results file as the worker reads and stores it: its own copy of at most
    ``limit`` bytes ([farm] result_limit), made through jobtree.open_file (a regular file inside
    the job's directories, never a link out, a FIFO, a socket or a device), under the same name in
    the worker's directory ``where`` (errors name the file as the suite wrote it). Returns the path to
    read (the copy; the job's path when there is no file, for the error that names it), a
    message when it must not be read, and what the copy kept."""
    inside = within(results, roots)
    if inside is None:
        # Read nothing through it: the suite made its results file a link out of the job.
        return None, (f"suite {suite.name}: its results file {results} is a link leading outside the job's "
                      "directories; the worker reads only files inside them: write the results there"), None
    if not os.path.lexists(inside):
        return inside, "", None
    copy = where / inside.name
    try:
        where.mkdir(exist_ok=True)
        copied = jobtree.copy_capped(inside, copy, limit)
    except jobtree.NotAFile as e:
        return None, f"suite {suite.name}: its results file {e.strerror}; make the suite write a file there", None
    except OSError as e:
        return None, f"suite {suite.name}: cannot read its results file {inside}: {e.strerror or e}", None
    return copy, "", copied


def _relinked(tree: Path, others: Path) -> list[str]:
    done, notes = runpath.relink(tree, others)
    return [f"RUNPATH of {r.path}: {r.before} -> {r.after}" for r in done] + notes


def _note(log_path: Path, lines: list[str]) -> None:
    """What the worker changed in the job's tree before running it, at the top of its log."""
    if lines:
        with log_path.open("a") as f:
            f.writelines(f"gearfarm: {line}\n" for line in lines)


def _judged(found: list[CaseResult], suite: Suite, loader: Path, tree: Path, prepared: ctestfile.Prepared,
            runner: list[str], log_path: Path) -> list[CaseResult]:
    """The cases as the suite's results say, failed where a program of the tree ran against the
    host's copy of a library the build made (its case, or a case of its own when the program is
    not one ctest named), and with a note where a cross test could not be given the runner."""
    copies, notes = hostlib.findings(loader, tree)
    _note(log_path, notes + [c.message() for c in copies])
    by_program: dict[str, list[hostlib.HostCopy]] = {}
    for c in copies:
        by_program.setdefault(os.path.abspath(c.program), []).append(c)
    out, claimed = [], set()
    for case in found:
        mine = by_program.get(os.path.abspath(prepared.programs.get(case.name, "\0")), [])
        if mine:
            claimed |= {id(c) for c in mine}
            text = "; ".join(c.message() for c in mine)
            case = case.model_copy(update={"status": "failed", "message": f"{text}\n{case.message}".strip()})
        elif case.status in ("failed", "error") and case.name in prepared.unwrapped and runner:
            hint = ctestfile.unwrapped_hint(prepared.unwrapped[case.name], runner)
            case = case.model_copy(update={"message": f"{hint}\n{case.message}".strip()})
        out.append(case)
    rest = [c for c in copies if id(c) not in claimed]
    if rest:
        out.append(CaseResult(classname=suite.name, name=f"{suite.name} (host library)", status="failed",
                              message="; ".join(c.message() for c in rest)))
    return out


def run_benchmark(cat: Catalog, target: Target, bench: Benchmark, tree: Path, work: Path, tag: str, seed: int,
                  log_path: Path, sandbox: Sandbox, curves: list[CurveRecord] | None = None,
                  variant: Literal["new", "baseline"] = "new") -> dict[str, float]:
    """One run of ``bench`` in ``tree``: its declared metrics, or BenchmarkFailed. With
    ``curves``, the curves the catalog declares are read from its output and appended."""
    scratch = work / f"scratch-{tag}"
    scratch.mkdir()
    # The run's output is the worker's file: beside the job's log, not in a directory the job writes.
    out_path = log_path.parent / f"out-{tag}.log"
    vals = catalog_mod.values(cat, target, {"root": str(tree), "scratch": str(scratch), "junit": "",
                                            "seed": str(seed)})
    argv = (target.runner if bench.runner else []) + catalog_mod.expand(bench.argv, vals, target.runner)
    # callgrind writes its count from inside the sandbox, so into a directory of the job's own.
    count_dir = work / f"counted-{tag}"
    count_dir.mkdir()
    counted = count_dir / "callgrind.out"
    if bench.counter == "instructions":
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counted}", *argv]
    env = catalog_mod.environment(sandbox.environment(), target, bench, vals)
    cwd = tree / bench.cwd.format_map(vals)
    rc, timed_out, reached, _ = _run(sandbox, cat, bench, argv, out_path, bench.timeout, cwd, env,
                                     [scratch, count_dir, tree])
    # Into the job's log within its cap, streamed (the run's output was capped as it came).
    process.append_capped(out_path, log_path, sandbox.log_limit, header=f"--- {tag} ---\n")
    text = out_path.read_text(errors="replace")
    if reached:
        raise BenchmarkFailed("failed", f"benchmark {bench.name} ({tag}): {reached}")
    if timed_out or rc != 0:
        raise BenchmarkFailed("timed_out" if timed_out else "failed",
                              f"benchmark {bench.name} ({tag}) " + ("timed out" if timed_out else f"exited {rc}"))
    declared = [m for m in bench.metrics if not (bench.counter == "instructions" and m == "instructions")]
    try:
        if not declared:
            metrics = {}
        elif bench.metrics_file is not None:
            path = Path(bench.metrics_file.format_map(vals))
            path = path if path.is_absolute() else cwd / path
            inside = within(path, [tree, scratch])
            if inside is None:
                raise OutcomeError(f"metrics_file {path} is a link leading outside the job's directories; the worker "
                                   "reads only files inside them: write the metrics there")
            metrics = outcome.metrics_from_file(inside, declared)
        else:
            assert bench.metrics_pattern is not None
            metrics = outcome.metrics_from_pattern(text, bench.metrics_pattern, declared)
    except OutcomeError as e:
        raise BenchmarkFailed("failed", f"benchmark {bench.name}: {e}") from e
    if bench.counter == "instructions":
        metrics["instructions"] = instructions(within(counted, [count_dir]), bench.name)
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
            # Finite numbers only: a JSON line may say NaN or Infinity, which no record keeps.
            if isinstance(x, int | float) and isinstance(y, int | float) and not isinstance(x, bool) \
                    and math.isfinite(x) and math.isfinite(y):
                key = str(obj.get(c.split, "")) if c.split else ""
                pts = lines.setdefault(key, [])
                if len(pts) < MAX_POINTS:
                    pts.append((float(x), float(y)))
        if lines:
            out.append(CurveRecord(benchmark=bench.name, title=c.title, x=c.x, y=c.y, variant=variant,
                                   split_name=c.split or "", lines=lines))
    return out


MAX_LINE = 64 * 1024


def instructions(callgrind_out: Path | None, bench: str) -> float:
    """Total instructions executed, from callgrind's "summary:" line (None: no such file inside
    the job's directory)."""
    try:
        if callgrind_out is not None:
            # Streamed, a line (at most MAX_LINE) at a time: a count file is as large as the program.
            with jobtree.open_file(callgrind_out) as (fh, _):
                while line := fh.readline(MAX_LINE):
                    if line.startswith(b"summary:") and math.isfinite(count := float(line.split()[1])):
                        return count
    except (OSError, IndexError, ValueError):
        pass
    raise BenchmarkFailed("failed", f"benchmark {bench}: callgrind wrote no instruction count "
                                    "(is valgrind installed? apt-get install valgrind)")
