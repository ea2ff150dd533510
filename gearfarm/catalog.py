"""The job catalog (jobs/catalog.toml): targets, suites and benchmarks as validated data.

Workers load it from the repository at the run's pinned revision, so what runs on a lab host
is always what was committed, never what a payload says.
"""

from __future__ import annotations

import re
import string
import subprocess
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

CATALOG_PATH = "jobs/catalog.toml"
TARGET_RE = re.compile(r"^[a-z0-9]+-[a-z0-9_]+$")
# The only names argv templates may use; anything else is a catalog error, caught at load.
PLACEHOLDERS = frozenset({"src", "out", "bin", "exe", "junit", "scratch", "seed", "cc", "ar", "static"})


class CatalogError(ValueError):
    """The catalog is missing or malformed, or names something it does not define."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_argv(argv: list[str]) -> list[str]:
    if not argv:
        raise ValueError("argv must not be empty")
    for arg in argv:
        for _, name, _, _ in string.Formatter().parse(arg):
            if name is not None and name not in PLACEHOLDERS:
                raise ValueError(f"unknown placeholder {{{name}}} in {arg!r}; known: {sorted(PLACEHOLDERS)}")
    return argv


class Build(_Strict):
    argv: list[str]
    outputs: list[str]
    timeout: float = 900

    _argv = field_validator("argv")(_check_argv)


class Target(_Strict):
    name: str = ""
    cc: str
    ar: str
    exe: str = ""
    static: int = 0
    runner: list[str] = Field(default_factory=list)
    runner_env: dict[str, str] = Field(default_factory=dict)
    perf: bool = False
    suites: list[str]

    @property
    def os(self) -> str:
        return self.name.split("-", 1)[0]

    @property
    def arch(self) -> str:
        return self.name.split("-", 1)[1]


class Suite(_Strict):
    name: str = ""
    description: str = ""
    argv: list[str]
    timeout: float = 300

    _argv = field_validator("argv")(_check_argv)


class Benchmark(_Strict):
    name: str = ""
    argv: list[str]
    timeout: float = 600
    repetitions: int = Field(default=1, ge=1, le=50)
    # "instructions": also run the benchmark under callgrind and report the instructions it
    # executed, a figure that does not move with the host's load (time on a shared VM does).
    counter: Literal["instructions"] | None = None
    metrics: dict[str, Literal["higher", "lower"]]

    _argv = field_validator("argv")(_check_argv)


class Catalog(_Strict):
    schema_: Literal[1] = Field(alias="schema")
    build: Build
    targets: dict[str, Target]
    suites: dict[str, Suite]
    benchmarks: dict[str, Benchmark] = Field(default_factory=dict)

    def target(self, name: str) -> Target:
        if name not in self.targets:
            raise CatalogError(f"unknown target {name!r}; known targets: {', '.join(sorted(self.targets))}")
        return self.targets[name]

    def suite(self, name: str) -> Suite:
        if name not in self.suites:
            raise CatalogError(f"unknown suite {name!r}; known suites: {', '.join(sorted(self.suites))}")
        return self.suites[name]

    def benchmark(self, name: str) -> Benchmark:
        if name not in self.benchmarks:
            raise CatalogError(
                f"unknown benchmark {name!r}; known benchmarks: {', '.join(sorted(self.benchmarks))}"
            )
        return self.benchmarks[name]

    def suites_for(self, target: str, only: list[str] | None = None) -> list[str]:
        """The suites a run executes on ``target``: the target's list, narrowed by ``only``."""
        names = self.target(target).suites
        if only is None:
            return list(names)
        for s in only:
            self.suite(s)
        return [s for s in names if s in only]


def parse(text: str, origin: str) -> Catalog:
    try:
        raw = tomllib.loads(text)
        for section in ("targets", "suites", "benchmarks"):
            for name, entry in raw.get(section, {}).items():
                if isinstance(entry, dict):
                    entry["name"] = name
        cat = Catalog.model_validate(raw)
    except (tomllib.TOMLDecodeError, ValidationError) as e:
        raise CatalogError(f"{origin}: invalid job catalog: {e}") from e
    for name, t in cat.targets.items():
        if not TARGET_RE.match(name):
            raise CatalogError(f"{origin}: target name {name!r} is not <os>-<arch>")
        for s in t.suites:
            if s not in cat.suites:
                raise CatalogError(f"{origin}: target {name} lists suite {s!r}, which [suites] does not define")
    return cat


def load_file(path: Path) -> Catalog:
    try:
        return parse(path.read_text(), str(path))
    except FileNotFoundError as e:
        raise CatalogError(f"job catalog not found at {path}") from e


def load_at_rev(repo: Path, rev: str) -> Catalog:
    """The catalog as committed at ``rev`` in ``repo`` (never the working tree)."""
    proc = subprocess.run(
        ["git", "-C", str(repo), "show", f"{rev}:{CATALOG_PATH}"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise CatalogError(
            f"cannot read {CATALOG_PATH} at revision {rev} in {repo}: {proc.stderr.strip()} "
            "(is the revision fetched into the worker's repository?)"
        )
    return parse(proc.stdout, f"{repo}@{rev[:12]}:{CATALOG_PATH}")


def expand(argv: list[str], values: dict[str, str]) -> list[str]:
    """Fill a catalog argv template. Values are substituted into single argv items, never
    passed through a shell, so a value cannot inject a command."""
    return [arg.format_map(values) for arg in argv]
