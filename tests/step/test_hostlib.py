"""The loader's accounts a suite leaves (gearfarm.step.hostlib.findings) are the job's files: a
FIFO named like one (issue #76, case 1: `mkfifo "$LD_DEBUG_OUTPUT.fifo"`) hung the worker's
open for good; it is refused at once, named in a note, and the real accounts are still read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gearfarm.hosts import jobtree
from gearfarm.step import hostlib
from tests.hosts.test_jobtree import deep


@pytest.mark.timeout(60)
def test_a_fifo_among_the_loaders_files_is_named_and_not_opened(tmp_path: Path) -> None:
    tree, out = tmp_path / "tree", tmp_path / "loader"
    (tree / "lib").mkdir(parents=True)
    (tree / "lib" / "libz.so.1").write_bytes(b"\x7fELF")
    env = hostlib.environment(out)
    os.mkfifo(env["LD_DEBUG_OUTPUT"] + ".fifo")
    # A real account: the tree's program took the host's libz.
    (out / "ld.123").write_text(
        "     123:\tfind library=libz.so.1 [0]; searching\n"
        "     123:\t  trying file=/usr/lib/x86_64-linux-gnu/libz.so.1\n"
        "     123:\n"
        f"     123:\ttransferring control: {tree}/prog\n")
    t0 = time.monotonic()
    copies, notes = hostlib.findings(out, tree)
    assert time.monotonic() - t0 < 10
    assert notes == [f"the loader's account {out}/ld.fifo is a FIFO, not a regular file: the worker reads only "
                     "regular files a job leaves, and follows no link; it was not read"]
    assert [(c.program, c.loaded) for c in copies] == [(f"{tree}/prog", "/usr/lib/x86_64-linux-gnu/libz.so.1")]


def test_a_tree_3000_deep_does_not_stop_the_check(tmp_path: Path) -> None:
    """A relative program name is looked for in the tree: Path.rglob recursed and raised."""
    tree, out = tmp_path / "tree", tmp_path / "loader"
    tree.mkdir()
    deep(tree, 1200)  # deeper than the recursion limit, shallower than PATH_MAX
    (tree / "libz.so.1").write_bytes(b"\x7fELF")
    hostlib.environment(out)
    (out / "ld.9").write_text("     9:\t  trying file=/usr/lib/libz.so.1\n     9:\n"
                              "     9:\ttransferring control: ./nowhere/prog\n")
    assert hostlib.findings(out, tree) == ([], [])
    jobtree.remove(tree)  # pytest's own cleanup is shutil.rmtree, which this depth breaks
