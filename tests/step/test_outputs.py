"""A build's outputs in a tree the build made deep (gearfarm.step.runner.collect_outputs): a
directory output is walked without recursion, and a `**` pattern Python 3.11 cannot search that
deep fails the build naming the pattern, never the worker (`infra: RecursionError`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearfarm.hosts import jobtree
from gearfarm.step import runner
from tests.hosts.test_jobtree import deep


def test_a_deep_output_directory_is_collected_and_a_deep_glob_fails_the_build(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    deep(root / "out", 1200)
    try:
        found = runner.collect_outputs(root, ["out"])
        assert found == ["out/" + "d/" * 1200 + "bottom.txt"]
        with pytest.raises(runner.OutputsUnsafe, match=r"'out/\*\*/\*.txt' .* too deep to search"):
            runner.collect_outputs(root, ["out/**/*.txt"])
    finally:
        jobtree.remove(root)  # pytest's own cleanup is shutil.rmtree, which this depth breaks
