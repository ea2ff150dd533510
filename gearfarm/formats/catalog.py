"""A project's job catalog: its targets, how to build it, its suites and benchmarks, as validated
data that fits any build system (make, CMake, a shell script).

The nightly reads the catalog at the run's revision (or the project's configured file), stores
it content-addressed, and payloads carry its sha256: what runs on a lab host is always the
catalog the nightly validated, never a file on the worker's disk, and never a command from a
payload. Every error names the file, the key and the fix. A target's build is [build] with the
target's own [targets.NAME.build] over it, and only Catalog.build_for says what it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import string
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gearfarm.formats.words import parse_size, size_text

SCHEMA = 2
TARGET_RE = re.compile(r"^[a-z0-9]+-[a-z0-9_]+$")
VAR_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# Placeholders every step may use (their values are the worker's, per job); a target adds its
# own through `vars`. "runner" only as a whole argv item (it is zero or more items) or in env.
BUILTINS = {
    "root": "the job's tree: the source snapshot (build), or the artifact's files (test, perf)",
    "target": "the target's name, e.g. linux-x86_64",
    "exe": "the target's executable suffix ('' or '.exe')",
    "scratch": "an empty private directory for the step",
    "junit": "where a junit or ctest suite writes its JUnit XML",
    "seed": "the run's seed",
    "jobs": "the number of CPUs of the host (for make -j)",
    "runner": "the target's runner command (e.g. qemu-aarch64), empty when native",
    "case": "a test case to run alone (in a suite's `only` items only)",
}
CTEST_ARGV = ["ctest", "--output-on-failure", "--output-junit", "{junit}"]


class CatalogError(ValueError):
    """The catalog is missing or malformed, or names something it does not define."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _names(text: str) -> list[str]:
    """The placeholder names in one template string; ValueError for a malformed one."""
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def _check_cwd(cwd: str) -> None:
    if cwd.startswith("/") or ".." in Path(cwd).parts:
        raise ValueError(f"cwd {cwd!r} must be a relative path inside the job's tree (no '/' start, no '..')")


def _inside_the_job(key: str, template: str | None) -> None:
    """A file the worker reads after a step is one of the job's: relative to the step's cwd, or
    under a placeholder of the job's own directories ({junit}, {scratch}, {root}), never a path
    of the host's (the worker would upload the host's file as the job's)."""
    if template is not None and (template.startswith("/") or ".." in Path(template).parts):
        raise ValueError(f"{key} {template!r} names a path outside the job: give it relative to the step's cwd or "
                         "under {root}, {scratch} or {junit}, without '..'")


# -- limits: what a command may use, at most the farm's ([farm] job_pids_max, ...) ---------------

class StepLimits(_Strict):
    """[limits] (every command of the catalog) or a suite's or benchmark's own `limits`: lower
    than the farm's bounds, never higher (check_limits); None: the farm's."""

    processes: int | None = Field(default=None, ge=1)
    memory: int | None = Field(default=None, ge=1024 * 1024)
    cpu_weight: int | None = Field(default=None, ge=1, le=10000)

    @field_validator("memory", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return parse_size(v) if isinstance(v, str) else v


def limits_for(cat: Catalog, step: Step | None) -> dict[str, int]:
    """A command's limits as the catalog sets them: the step's own over [limits]."""
    out: dict[str, int] = {}
    for layer in (cat.limits, getattr(step, "limits", None)):
        out.update({k: v for k, v in (layer.model_dump() if layer is not None else {}).items() if v is not None})
    return out


def check_limits(cat: Catalog, origin: str, bounds: dict[str, int | None]) -> None:
    """CatalogError naming the key of a limit above the farm's ``bounds`` (FarmConfig.job_limits_max)."""
    layers = [("limits", cat.limits)] + [(f"suites.{n}.limits", s.limits) for n, s in cat.suites.items()]
    layers += [(f"benchmarks.{n}.limits", b.limits) for n, b in cat.benchmarks.items()]
    for where, layer in layers:
        for key, value in (layer.model_dump() if layer is not None else {}).items():
            most = bounds.get(key)
            if value is not None and most is not None and value > most:
                said = size_text if key == "memory" else str
                farm = {"processes": "job_pids_max", "memory": "job_memory_max", "cpu_weight": "job_cpu_weight"}[key]
                raise CatalogError(f"{origin}: [{where}] {key} = {said(value)} is above this farm's [farm] {farm} "
                                   f"({said(most)}): a catalog may lower a job's limits, not raise them; lower it "
                                   "or remove it")


class Step(_Strict):
    """What every command of the catalog has."""

    name: str = ""
    argv: list[str] = Field(default_factory=list)
    # Relative to the job's tree ({root}); "." is the tree itself.
    cwd: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=600, gt=0)

    @model_validator(mode="after")
    def _relative_cwd(self) -> Step:
        _check_cwd(self.cwd)
        return self

    def templates(self) -> list[tuple[str, str]]:
        """(key, template) of every string that takes placeholders, for validation."""
        return [("argv", a) for a in self.argv] + [(f"env.{k}", v) for k, v in self.env.items()] + [("cwd", self.cwd)]


def _something_built(argv: list[str] | None, outputs: list[str] | None) -> None:
    """A build's argv and outputs, where given, are not empty (None: not given here)."""
    if argv is not None and not argv:
        raise ValueError("argv must not be empty: the command that builds the project")
    if outputs is not None and not outputs:
        raise ValueError("outputs must name at least one file or directory the build leaves (what tests run)")


class Build(Step):
    """One target's build, complete: what runs it (Catalog.build_for makes it)."""

    timeout: float = Field(default=900, gt=0)
    # Globs relative to the tree after the build: the files packed into the artifact. A
    # directory (or "dir/**") packs every file under it.
    outputs: list[str]

    @model_validator(mode="after")
    def _something(self) -> Build:
        _something_built(self.argv, self.outputs)
        return self

    def templates(self) -> list[tuple[str, str]]:
        return super().templates() + [("outputs", o) for o in self.outputs]


# The keys of a build, in the order they are shown; a target's own build overrides [build]'s
# key by key.
BUILD_KEYS = ("argv", "cwd", "env", "timeout", "outputs")


class BuildKeys(_Strict):
    """[build] or a target's [targets.NAME.build], as written: any of a build's keys (None: not
    set here). Neither is a build by itself: Catalog.build_for layers them into one."""

    argv: list[str] | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    timeout: float | None = Field(default=None, gt=0)
    outputs: list[str] | None = None

    @model_validator(mode="after")
    def _sound(self) -> BuildKeys:
        if self.cwd is not None:
            _check_cwd(self.cwd)
        _something_built(self.argv, self.outputs)
        return self

    def keys_set(self) -> list[str]:
        return [k for k in BUILD_KEYS if getattr(self, k) is not None]

    def templates(self) -> list[tuple[str, str]]:
        return ([("argv", a) for a in self.argv or []] + [(f"env.{k}", v) for k, v in (self.env or {}).items()]
                + ([("cwd", self.cwd)] if self.cwd is not None else []) + [("outputs", o) for o in self.outputs or []])

    def sets(self, key: str) -> bool:
        """Whether this sets template ``key`` of templates() (argv, cwd, outputs, env.NAME)."""
        field, _, name = key.partition(".")
        value = getattr(self, field)
        return value is not None and (not name or name in value)


class Target(_Strict):
    name: str = ""
    exe: str = ""
    # The command that runs this target's programs on a host, [] = natively.
    runner: list[str] = Field(default_factory=list)
    runner_env: dict[str, str] = Field(default_factory=dict)
    # Commands a build host must have; their versions are part of the artifact's identity.
    tools: list[str] = Field(default_factory=list)
    # This target's own placeholders, e.g. cc = "aarch64-linux-gnu-gcc".
    vars: dict[str, str] = Field(default_factory=dict)
    # Environment of every step of this target (values may use placeholders).
    env: dict[str, str] = Field(default_factory=dict)
    # Only natively-run binaries give performance figures worth comparing.
    perf: bool = False
    suites: list[str] = Field(default_factory=list)
    # This target's own build keys over [build]'s ([targets.NAME.build]): a Windows build that
    # leaves foo.dll where Linux's leaves libfoo.so, with no padding of either list.
    build: BuildKeys | None = None

    @property
    def os(self) -> str:
        return self.name.split("-", 1)[0]

    @property
    def arch(self) -> str:
        return self.name.split("-", 1)[1]

    @property
    def cc(self) -> str | None:
        """The C compiler, when the target names one (the host probe compiles with it)."""
        return self.vars.get("cc")


class Suite(Step):
    description: str = ""
    timeout: float = Field(default=300, gt=0)
    format: Literal["junit", "tap", "ctest", "exit-code"] = "junit"
    # junit: the XML file (default {junit}); tap: "stdout" (the default) or a file.
    results: str | None = None
    # Unpack the source snapshot under the artifact's files (tests that read data files).
    source: bool = False
    # Put the target's runner in front of argv; false when argv starts a driver (make, ctest,
    # sh) that runs the programs itself (it finds the runner in $GEARFARM_RUNNER).
    runner: bool = True
    # How to run only some of the suite's cases (a bisection runs only the failing one): argv
    # items appended once per case, with {case} the case's name, e.g. ["--only", "{case}"].
    # A suite without it runs whole, and the case is read from its results.
    only: list[str] = Field(default_factory=list, max_length=8)
    # This suite's own limits, lower than [limits] and the farm's (StepLimits).
    limits: StepLimits | None = None

    @model_validator(mode="after")
    def _only_names_the_case(self) -> Suite:
        if self.only and not any("{case}" in item for item in self.only):
            raise ValueError(f"only {self.only!r} must name the case with {{case}}, e.g. [\"--only\", \"{{case}}\"]")
        return self

    @model_validator(mode="before")
    @classmethod
    def _format_defaults(cls, raw: Any) -> Any:
        """What a format implies, filled in before validation: ctest has its own argv and runs
        the programs itself; junit and ctest read {junit} unless told otherwise."""
        if not isinstance(raw, dict):
            return raw
        fmt = raw.get("format", "junit")
        defaults: dict[str, Any] = {}
        if fmt == "ctest":
            defaults = {"argv": list(CTEST_ARGV), "runner": False}
        if fmt in ("junit", "ctest"):
            defaults["results"] = "{junit}"
        return {**defaults, **raw, **({"runner": False} if fmt == "ctest" else {})}

    @model_validator(mode="after")
    def _format(self) -> Suite:
        if not self.argv:
            raise ValueError("argv must not be empty")
        if self.format == "exit-code" and self.results is not None:
            raise ValueError("results has no meaning for format 'exit-code' (the exit status is the result): "
                             "remove it")
        _inside_the_job("results", self.results_file)
        return self

    @property
    def results_file(self) -> str | None:
        """The template of the file the results are read from; None for stdout."""
        return None if self.results in (None, "stdout") else self.results

    def templates(self) -> list[tuple[str, str]]:
        return (super().templates() + ([("results", self.results_file)] if self.results_file else [])
                + [("only", o) for o in self.only])


# Pairs a benchmark runs by default: each night's paired estimate needs a handful to have a
# confidence interval at all, and five of iiBench's 2-5 % pair noise give about 1-2 %.
DEFAULT_PAIRS = 5


class Curve(_Strict):
    """A curve the benchmark records while it runs, from the JSON objects it prints one per
    line: ``y`` against ``x``, one line per value of ``split`` when set (e.g. OLTP throughput
    per second, one line per thread count). Lines without both keys are not points."""

    title: str = Field(min_length=1, max_length=80)
    x: str = Field(min_length=1, max_length=64)
    y: str = Field(min_length=1, max_length=64)
    split: str | None = Field(default=None, min_length=1, max_length=64)


class Benchmark(Step):
    # A/B pairs (tonight's build and the last good one, interleaved), or plain runs unpaired.
    repetitions: int = Field(default=DEFAULT_PAIRS, ge=1, le=100)
    # Adaptive pairs: after `repetitions` pairs, keep adding pairs until the paired estimate of
    # every metric has at most this relative standard error, up to `max_repetitions`. A VM's
    # noise comes in regimes, so a fixed count is too many on a quiet night and too few on a
    # noisy one; stopping on the standard error alone (never on the estimate) keeps the
    # night's test honest.
    precision: float | None = Field(default=None, gt=0, le=0.5)
    max_repetitions: int | None = Field(default=None, ge=1, le=1000)
    # "instructions": also run the benchmark under callgrind and report the instructions it
    # executed, a figure that does not move with the host's load (time on a shared VM does).
    counter: Literal["instructions"] | None = None
    metrics: dict[str, Literal["higher", "lower"]]
    # Each metric's unit as people write it ("rows/s", "ms", "bytes"), for the dashboard and the
    # report; optional, and only for metrics named in `metrics`.
    units: dict[str, str] = Field(default_factory=dict)
    # Where the figures come from: a JSON file the benchmark writes, or a regex over its output.
    metrics_file: str | None = None
    metrics_pattern: str | None = None
    runner: bool = True
    # Curves kept with the run (the first pair's, tonight's build and the baseline's) for the
    # dashboard: iiBench's insert rate against rows inserted, OLTP's throughput per second.
    curves: list[Curve] = Field(default_factory=list, max_length=8)
    # This benchmark's own limits, lower than [limits] and the farm's (StepLimits).
    limits: StepLimits | None = None

    @property
    def most_pairs(self) -> int:
        """The most pairs a night may run (`repetitions` unless a precision asks for more)."""
        if self.precision is None:
            return self.repetitions
        return self.max_repetitions or 10 * self.repetitions

    @model_validator(mode="after")
    def _source_of_metrics(self) -> Benchmark:
        _inside_the_job("metrics_file", self.metrics_file)
        if self.max_repetitions is not None and self.precision is None:
            raise ValueError("max_repetitions only applies with precision (the standard error at which a "
                             "night has pairs enough): set precision, or drop max_repetitions")
        if self.max_repetitions is not None and self.max_repetitions < self.repetitions:
            raise ValueError(f"max_repetitions ({self.max_repetitions}) is below repetitions "
                             f"({self.repetitions}): raise it, or lower repetitions")
        if not self.argv:
            raise ValueError("argv must not be empty")
        if not self.metrics:
            raise ValueError("metrics must name at least one metric (name = \"higher\" or \"lower\")")
        stray = sorted(set(self.units) - set(self.metrics) - ({"instructions"} if self.counter else set()))
        if stray:
            declared = ", ".join(sorted(self.metrics))
            raise ValueError(f"units names {', '.join(stray)}, not among the metrics ({declared}): "
                             "give units only for declared metrics")
        for name, unit in self.units.items():
            if not 0 < len(unit) <= 24 or not unit.isprintable():
                raise ValueError(f"units.{name}: a unit is 1 to 24 printable characters, such as \"rows/s\"")
        # The counter's own figure needs no source; any other metric does.
        counted = self.counter is not None and set(self.metrics) == {self.counter}
        if (self.metrics_file is not None and self.metrics_pattern is not None) or \
                (not counted and self.metrics_file is None and self.metrics_pattern is None):
            raise ValueError("set exactly one of metrics_file (a JSON file the benchmark writes) or "
                             "metrics_pattern (a regex over its output)")
        if self.metrics_pattern is not None:
            declared = [m for m in self.metrics if m != "instructions" or self.counter is None]
            problem = check_pattern(self.metrics_pattern, declared)
            if problem:
                raise ValueError(f"metrics_pattern: {problem}")
        return self

    def templates(self) -> list[tuple[str, str]]:
        return super().templates() + ([("metrics_file", self.metrics_file)] if self.metrics_file else [])


class Catalog(_Strict):
    schema_: Literal[2] = Field(alias="schema")
    # What every target's build shares; absent when each target has a build of its own. Read a
    # target's build through build_for, never here.
    build: BuildKeys | None = None
    targets: dict[str, Target]
    suites: dict[str, Suite] = Field(default_factory=dict)
    benchmarks: dict[str, Benchmark] = Field(default_factory=dict)
    # What every command may use, lower than the farm's bounds (StepLimits).
    limits: StepLimits | None = None

    def target(self, name: str) -> Target:
        if name not in self.targets:
            raise CatalogError(f"unknown target {name!r}; known targets: {', '.join(sorted(self.targets))}")
        return self.targets[name]

    def build_for(self, target: str | Target) -> Build:
        """The build of ``target``, the one place that says it: [build], then the target's own
        [targets.NAME.build] over it key by key. env merges name by name (the target's value
        wins), so a shared CFLAGS is not lost where a target adds its CC; every other key is
        replaced whole (a Windows outputs list is not Linux's plus more)."""
        t = self.target(target) if isinstance(target, str) else target
        keys: dict[str, Any] = {}
        for layer in (self.build, t.build):
            for key in layer.keys_set() if layer is not None else []:
                value = getattr(layer, key)
                keys[key] = {**keys.get(key, {}), **value} if key == "env" else value
        missing = [k for k in ("argv", "outputs") if k not in keys]
        if missing:
            raise CatalogError(self._no_build(t, missing))
        return Build(**keys)

    def _no_build(self, t: Target, missing: list[str]) -> str:
        own = f"[targets.{t.name}.build]"
        if self.build is None and t.build is None:
            if not any(o.build for o in self.targets.values()):
                return ("[build] required key is missing: add it with argv and outputs (see docs/projects.md), or "
                        "give every target a build of its own, [targets.NAME.build]")
            return (f"[targets.{t.name}] has no build: the catalog has no [build] and no {own}: add {own} with "
                    "argv and outputs, or a [build] the targets share")
        where = f"targets.{t.name}.build" if t.build is not None else "build"
        return (f"[{where}.{missing[0]}] required key is missing for target {t.name}, set neither in {own} nor in "
                f"[build]: add {' and '.join(missing)} to {own}, or to [build] for every target")

    def build_key(self, target: Target, key: str) -> str:
        """The catalog key ``target``'s build takes ``key`` from, for messages: build.outputs,
        or targets.NAME.build.outputs when the target sets its own."""
        own = target.build is not None and getattr(target.build, key) is not None
        return f"targets.{target.name}.build.{key}" if own else f"build.{key}"

    def suite(self, name: str) -> Suite:
        if name not in self.suites:
            raise CatalogError(f"unknown suite {name!r}; known suites: {', '.join(sorted(self.suites)) or 'none'}")
        return self.suites[name]

    def benchmark(self, name: str) -> Benchmark:
        if name not in self.benchmarks:
            raise CatalogError(
                f"unknown benchmark {name!r}; known benchmarks: {', '.join(sorted(self.benchmarks)) or 'none'}")
        return self.benchmarks[name]

    def suites_for(self, target: str, only: list[str] | None = None) -> list[str]:
        """The suites a run executes on ``target``: the target's list, narrowed by ``only``."""
        names = self.target(target).suites
        if only is None:
            return list(names)
        for s in only:
            self.suite(s)
        return [s for s in names if s in only]


def _describe(e: ValidationError) -> str:
    """Each problem as '[section.key] what is wrong (fix)'."""
    parts = []
    for err in e.errors(include_input=False, include_url=False):
        loc = [str(x) for x in err["loc"] if not isinstance(x, int)]
        where = ".".join(loc) or "catalog"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key {loc[-1]!r}: remove it or check its spelling (see docs/projects.md for the keys)"
            where = ".".join(loc[:-1]) or "top level"
        elif err["type"] == "missing":
            msg = "required key is missing: add it (see docs/projects.md)"
        elif err["type"] == "literal_error" and loc and loc[-1] == "schema":
            msg = f"this gearfarm reads catalog schema {SCHEMA}: set `schema = {SCHEMA}` (docs/projects.md)"
        parts.append(f"[{where}] {msg}")
    return "; ".join(parts)


def _template_uses(cat: Catalog) -> list[tuple[str, str, str, list[Target]]]:
    """(section, key, template, the targets it runs on) of every string that takes placeholders.
    A key of [build] runs on the targets that do not set it in a build of their own."""
    targets = list(cat.targets.values())
    uses = [("build", k, v, [t for t in targets if t.build is None or not t.build.sets(k)])
            for k, v in (cat.build.templates() if cat.build is not None else [])]
    uses += [(f"targets.{t.name}.build", k, v, [t]) for t in targets if t.build is not None
             for k, v in t.build.templates()]
    steps: list[tuple[str, Step, list[Target]]] = [
        (f"suites.{n}", s, [t for t in targets if n in t.suites]) for n, s in cat.suites.items()]
    steps += [(f"benchmarks.{n}", b, [t for t in targets if t.perf]) for n, b in cat.benchmarks.items()]
    steps += [(f"targets.{t.name}", Step(env=t.env), [t]) for t in targets]
    return uses + [(section, k, v, ts) for section, step, ts in steps for k, v in step.templates()]


def _check_templates(cat: Catalog, origin: str) -> None:
    """Every placeholder must be a builtin or a var of every target the step runs on."""
    for section, key, template, targets in _template_uses(cat):
        try:
            names = _names(template)
        except ValueError as e:
            raise CatalogError(f"{origin}: [{section}] {key}: malformed placeholder in {template!r} ({e}); "
                               "write {{ and }} for literal braces") from None
        for name in names:
            if name == "runner" and not (key.startswith("env.") or template == "{runner}" and key == "argv"):
                raise CatalogError(f"{origin}: [{section}] {key} {template!r}: {{runner}} must be an argv item "
                                   "of its own (it expands to zero or more items) or in env (space-separated)")
            if name == "case" and key != "only":
                raise CatalogError(f"{origin}: [{section}] {key} {template!r}: {{case}} is only known in a "
                                   "suite's `only` items (how to run one case alone)")
            if name in BUILTINS:
                continue
            lacking = [t.name for t in targets if name not in t.vars]
            if lacking or not VAR_RE.match(name):
                builtins = set(BUILTINS) - ({"case"} if key != "only" else set())
                known = sorted(builtins | set.intersection(*(set(t.vars) for t in targets)) if targets
                               else builtins)
                where = f"targets {', '.join(lacking)} define no var {name!r}" if lacking and VAR_RE.match(name) \
                    else f"{name!r} is not a placeholder name"
                raise CatalogError(f"{origin}: [{section}] {key}: unknown placeholder {{{name}}} in {template!r}"
                                   f" ({where}); known here: {', '.join('{' + k + '}' for k in known)}. Fix the "
                                   "name or add it to the targets' vars; if the braces are meant literally (a "
                                   "shell's ${x} in `sh -c`, a C block), write them doubled: {{ and }}")


# The largest catalog read: the engine's is 5 KiB, and a catalog is read by the nightly and by
# every worker of its project, whole, into memory.
MAX_BYTES = 1024 * 1024


def parse(text: str | bytes, origin: str, max_timeout: float | None = None) -> Catalog:
    """Validate a catalog; CatalogError naming ``origin``, the key and the fix, and nothing else
    whatever the input (any size, any nesting, any bytes): a catalog is a project's commit, and
    one project's commit must never stop the farm's night. ``max_timeout``: the farm's bound
    on every timeout (`[farm] max_timeout`); a catalog may lower it, never raise it."""
    try:
        cat = _parse(text_of(text, origin) if isinstance(text, bytes) else _sized(text, origin), origin)
        if max_timeout is not None:
            _check_timeouts(cat, origin, max_timeout)
        return cat
    except CatalogError:
        raise
    except RecursionError:
        raise CatalogError(f"{origin}: arrays or tables nested too deeply to read: a catalog's values are at "
                           "most a few levels deep; remove the nesting") from None
    except Exception as e:  # any other failure of the reader or the validation is the input's
        raise CatalogError(f"{origin}: cannot be read as a catalog ({type(e).__name__}: {str(e)[:300]}); "
                           "check it against docs/projects.md") from None


def check_size(size: int, origin: str) -> None:
    """CatalogError when a catalog of ``size`` bytes is larger than one may be (MAX_BYTES)."""
    if size > MAX_BYTES:
        raise CatalogError(f"{origin}: the catalog is {size} bytes, more than the {MAX_BYTES} a catalog may have: "
                           "a catalog lists targets, a build, suites and benchmarks; keep data files in the "
                           "repository and name them in argv")


def text_of(data: bytes, origin: str) -> str:
    """A catalog file's text: within MAX_BYTES and UTF-8, else CatalogError saying which."""
    check_size(len(data), origin)
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise CatalogError(f"{origin}: not UTF-8 text ({e}): save the catalog as UTF-8") from None


def _sized(text: str, origin: str) -> str:
    check_size(len(text.encode(errors="surrogatepass")), origin)
    return text


def _check_timeouts(cat: Catalog, origin: str, max_timeout: float) -> None:
    """Every timeout a step of the catalog runs with (its own, or the default it leaves) is at
    most the farm's ``max_timeout``: the farm's bound, which a catalog may lower, never raise."""
    steps: list[tuple[str, float]] = [(cat.build_key(t, "timeout"), cat.build_for(t).timeout)
                                      for t in cat.targets.values()]
    steps += [(f"suites.{n}.timeout", s.timeout) for n, s in cat.suites.items()]
    steps += [(f"benchmarks.{n}.timeout", b.timeout) for n, b in cat.benchmarks.items()]
    for key, value in steps:
        if value > max_timeout:
            limit = f"{max_timeout:.15g}"
            raise CatalogError(f"{origin}: [{key}] {value:.15g} s is above the farm's limit, [farm] max_timeout = "
                               f"{limit} s: set {key} to {limit} or less (a catalog may lower the farm's limits, "
                               "never raise them)")


def _parse(text: str, origin: str) -> Catalog:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{origin}: not valid TOML: {e}") from e
    if raw.get("schema") == 1:
        raise CatalogError(f"{origin}: catalog schema 1 is no longer read: set `schema = {SCHEMA}` and give each "
                           "target its compiler as vars (docs/projects.md shows the layout)")
    for section in ("targets", "suites", "benchmarks"):
        entries = raw.get(section, {})
        if not isinstance(entries, dict):
            raise CatalogError(f"{origin}: [{section}] must be a table of named entries")
        for name, entry in entries.items():
            if isinstance(entry, dict):
                if "name" in entry:
                    raise CatalogError(f"{origin}: [{section}.{name}] unknown key 'name': an entry's name is its "
                                       "table's name; remove the key")
                entry["name"] = name
    try:
        cat = Catalog.model_validate(raw)
    except ValidationError as e:
        raise CatalogError(f"{origin}: {_describe(e)}") from None
    if not cat.targets:
        raise CatalogError(f"{origin}: [targets] defines no target: add at least one, e.g. [targets.linux-x86_64]")
    for name, t in cat.targets.items():
        if not TARGET_RE.match(name):
            raise CatalogError(f"{origin}: [targets.{name}] target name is not <os>-<arch> (e.g. linux-x86_64)")
        for var in t.vars:
            if not VAR_RE.match(var) or var in BUILTINS:
                raise CatalogError(f"{origin}: [targets.{name}] vars.{var}: a var name is lower-case letters, digits "
                                   f"and _, and not a builtin ({', '.join(sorted(BUILTINS))}); rename it")
        for s in t.suites:
            if s not in cat.suites:
                raise CatalogError(f"{origin}: [targets.{name}] suites lists {s!r}, which [suites] does not define; "
                                   f"defined: {', '.join(sorted(cat.suites)) or 'none'}")
        try:
            cat.build_for(t)
        except CatalogError as e:
            raise CatalogError(f"{origin}: {e}") from None
    _check_templates(cat, origin)
    _check_env(cat, origin)
    return cat


def _check_env(cat: Catalog, origin: str) -> None:
    """No catalog variable may set what the worker sets for a job (RESERVED_ENV):
    the sandbox makes HOME and the wine prefix writable, so a catalog naming them could open a
    host path to the job."""
    envs: list[tuple[str, dict[str, str]]] = [("build", cat.build.env or {})] if cat.build is not None else []
    envs += [(f"targets.{t.name}.build", t.build.env or {}) for t in cat.targets.values() if t.build is not None]
    envs += [(f"suites.{n}", s.env) for n, s in cat.suites.items()]
    envs += [(f"benchmarks.{n}", b.env) for n, b in cat.benchmarks.items()]
    for t in cat.targets.values():
        envs += [(f"targets.{t.name}", t.env), (f"targets.{t.name}", {f"runner_env.{k}": v for k, v in
                                                                        t.runner_env.items()})]
    for section, env in envs:
        for key in env:
            name = key.removeprefix("runner_env.")
            if reserved(name):
                where = key if key.startswith("runner_env.") else f"env.{key}"
                raise CatalogError(f"{origin}: [{section}] {where}: {name} is set by the worker for every job (its "
                                   "home, temporary directory and wine prefix are the job's own, inside its "
                                   "directory); a catalog cannot set it: remove it")


def digest(text: str) -> str:
    """The catalog's content address: payloads carry it, workers check it."""
    return hashlib.sha256(text.encode()).hexdigest()


def load_file(path: Path) -> Catalog:
    try:
        return parse(path.read_bytes(), str(path))
    except FileNotFoundError as e:
        raise CatalogError(f"job catalog not found at {path}") from e


def values(cat: Catalog, target: Target, builtins: dict[str, str]) -> dict[str, str]:
    """The placeholder values of one step of ``target``: its vars, then the job's builtins."""
    out = {"target": target.name, "exe": target.exe, "jobs": str(os.cpu_count() or 1),
           "runner": " ".join(target.runner)}
    out.update(target.vars)
    out.update(builtins)
    return out


def expand(argv: list[str], vals: dict[str, str], runner: list[str] | None = None) -> list[str]:
    """Fill a catalog argv template. Values are substituted into single argv items, never
    passed through a shell, so a value cannot inject a command; an item "{runner}" becomes the
    runner's own items (none when native)."""
    out: list[str] = []
    for arg in argv:
        if arg == "{runner}":
            out += list(runner or [])
        else:
            out.append(arg.format_map(vals))
    return out


def environment(base: dict[str, str], target: Target, step: Step, vals: dict[str, str]) -> dict[str, str]:
    """A step's environment: the host's, the runner's, the target's, then the step's own."""
    env = dict(base)
    env.update(target.runner_env)
    env["GEARFARM_RUNNER"] = " ".join(target.runner)
    env["GEARFARM_TARGET"] = target.name
    for extra in (target.env, step.env):
        env.update({k: v.format_map(vals) for k, v in extra.items()})
    return env


def definition(cat: Catalog, target: Target) -> str:
    """What decides a target's build, as canonical text: part of the artifact's identity, so a
    changed build command or variable never reuses an artifact built the old way. The build is
    the target's own (build_for), so a change to one target's build is a new artifact of that
    target only; and a catalog without [targets.NAME.build] reads as it did before there were
    any, so its artifacts are still reused."""
    body: dict[str, Any] = {"build": cat.build_for(target).model_dump(exclude={"name"}),
                            "target": target.model_dump(exclude={"perf", "suites", "build"})}
    return json.dumps(body, sort_keys=True)


# -- rules a catalog is checked against (the step package applies them when it runs one) ------

# What the worker alone sets in a job's environment; a catalog's env, a target's env or
# runner_env naming one of these is refused (parse), because each names a place the worker
# would otherwise make writable or a setting of the farm's own (gearfarm.step.sandbox).
RESERVED_ENV = ("HOME", "TMPDIR", "WINEPREFIX")
RESERVED_PREFIXES = ("GEARFARM_",)


def reserved(name: str) -> bool:
    """Whether only the worker may set environment variable ``name`` for a job."""
    return name in RESERVED_ENV or name.startswith(RESERVED_PREFIXES)


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A benchmark's `metrics_pattern` as gearfarm.step.outcome reads output with it: benchmarks
    print one figure per line, so ^ and $ are meant per line."""
    return re.compile(pattern, re.MULTILINE)


def check_pattern(pattern: str, declared: Iterable[str]) -> str | None:
    """None if `pattern` can give the declared metrics, else what is wrong and the fix."""
    wanted = list(dict.fromkeys(declared))
    try:
        rx = compile_pattern(pattern)
    except re.error as e:
        return f"{pattern!r} does not compile as a regular expression: {e}"
    groups = list(rx.groupindex)
    if "metric" in groups and "value" in groups:
        return None
    pair_hint = "or capture each metric's name and number as (?P<metric>...) and (?P<value>...)"
    for one, other in (("metric", "value"), ("value", "metric")):
        if one in groups and one not in wanted:
            return f"{pattern!r} has a group named {one!r} but none named {other!r}: add (?P<{other}>...)"
    if not groups:
        example = next((n for n in wanted if n.isidentifier()), "name")
        return (f"{pattern!r} has no named group: name each group after the metric it captures, e.g. "
                f"(?P<{example}>[0-9.]+), {pair_hint}")
    undeclared = [g for g in groups if g not in wanted]
    if undeclared:
        return (f"named group {', '.join(map(repr, undeclared))} of {pattern!r} is not a declared metric "
                f"(declared: {', '.join(wanted) or 'none'}): rename the group after a declared metric, or declare "
                f"it in the benchmark's `metrics`")
    return None
