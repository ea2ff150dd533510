"""A step's limits as the catalog lowers them (gearfarm/step/runner.py): a suite whose own
`limits` are below the farm's is stopped at its own, and fails naming it, whatever its exit
status; a suite within them passes. Real cgroups of this host, under the test's own."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm.formats import catalog as catalog_mod
from gearfarm.hosts import cgroup
from gearfarm.step import runner
from gearfarm.step.sandbox import Sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root (or a delegated cgroup)")
MiB = 1024 * 1024

CATALOG = """schema = 2

[limits]
processes = 100

[build]
argv = ["true"]
outputs = ["."]

[suites.hog]
argv = ["sh", "-c", "python3 -c 'b = bytearray(200 << 20)' || true"]
format = "exit-code"
limits = { memory = "64 MiB" }

[suites.forks]
argv = ["sh", "-c", "for i in $(seq 30); do sleep 3 & done; wait"]
format = "exit-code"
limits = { processes = 10 }

[suites.fine]
argv = ["sh", "-c", "python3 -c 'b = bytearray(100 << 20)'; for i in $(seq 30); do sleep 1 & done; wait"]
format = "exit-code"

[targets.linux-x86_64]
suites = ["hog", "forks", "fine"]
"""


@pytest.fixture
def box() -> Iterator[Sandbox]:
    tree = cgroup.detect()
    yield Sandbox("bwrap", uid=2_000_000_000, cgroups=tree, limits=cgroup.Limits(200, 256 * MiB, 100))
    tree.release()


def _suite(box: Sandbox, tmp_path: Path, name: str) -> tuple[runner.SuiteRun, str]:
    cat = catalog_mod.parse(CATALOG, "catalog.toml")
    tree, scratch = tmp_path / "tree", tmp_path / "scratch"
    tree.mkdir()
    scratch.mkdir()
    log = tmp_path / "log.txt"
    run = runner.run_suite(cat, cat.target("linux-x86_64"), cat.suite(name), tree, scratch, log, 1, box)
    return run, log.read_text()


@pytest.mark.parametrize(("name", "said"), [("hog", "suite hog: memory limit 64 MiB reached"),
                                            ("forks", "suite forks: process limit 10 reached")])
def test_a_suite_stops_at_its_own_lower_limit_and_fails_naming_it(box: Sandbox, tmp_path: Path, name: str,
                                                                   said: str) -> None:
    run, log = _suite(box, tmp_path, name)
    if name == "hog":  # its shell shrugs off its killed child and exits 0: the limit decides
        assert "--- exit status 0 after" in log, log
    assert (run.status, run.message) == ("failed", said), log
    assert f"*** {said.split(': ', 1)[1]} (at most" in log


def test_a_suite_within_its_limits_passes(box: Sandbox, tmp_path: Path) -> None:
    run, log = _suite(box, tmp_path, "fine")
    assert run.status == "passed", (run.message, log)
