"""The builds' compiler cache ([farm] ccache): a project's second build of the same code is served
by ccache from the first one's objects, and a project's build can write only its own part of the
cache, never another project's (which would let it plant objects in that project's builds)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gearfarm.formats import catalog as catalog_mod
from gearfarm.step import runner
from gearfarm.step.sandbox import Sandbox

pytestmark = pytest.mark.skipif(shutil.which("ccache") is None, reason="needs ccache")

CATALOG = """schema = 2

[build]
argv = ["sh", "build.sh"]
outputs = ["hello"]

[targets.linux-x86_64]
tools = ["gcc"]
"""


def build(tmp_path: Path, box: Sandbox, project: str, n: int, script: str) -> runner.BuildRun:
    root = tmp_path / f"{project}-{n}" / "root"
    root.mkdir(parents=True)
    (root / "hello.c").write_text('#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n')
    (root / "build.sh").write_text(script)
    scratch = root.parent / "scratch"
    scratch.mkdir()
    cat = catalog_mod.parse(CATALOG, "catalog.toml")
    return runner.run_build(cat, cat.target("linux-x86_64"), root, scratch, root.parent / "build.log", box,
                            project=project)


def stats(cache: Path) -> str:
    return subprocess.run(["ccache", "--print-stats"], env={"CCACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True).stdout


def test_a_second_build_is_served_from_the_projects_cache(tmp_path: Path) -> None:
    box = Sandbox("bwrap", ccache=tmp_path / "ccache")
    script = "set -e\nccache gcc -O2 -c hello.c -o hello.o\ngcc -o hello hello.o\n"
    for n in (1, 2):
        run = build(tmp_path, box, "alpha", n, script)
        assert run.status == "passed", (tmp_path / f"alpha-{n}" / "build.log").read_text()
    counts = dict(line.split("\t")[:2] for line in stats(tmp_path / "ccache" / "alpha").splitlines() if "\t" in line)
    assert int(counts["direct_cache_hit"]) + int(counts.get("preprocessed_cache_hit", 0)) == 1, counts
    assert int(counts["cache_miss"]) == 1, counts


def test_a_project_cannot_write_another_projects_cache(tmp_path: Path) -> None:
    box = Sandbox("bwrap", ccache=tmp_path / "ccache")
    assert build(tmp_path, box, "alpha", 1, "set -e\ngcc -o hello hello.c\n").status == "passed"
    planted = tmp_path / "ccache" / "alpha" / "planted"
    hostile = ("gcc -o hello hello.c\necho \"cache: $CCACHE_DIR\"\n"
               f"touch \"$CCACHE_DIR/../alpha/planted\" {planted} 2>&1 || true\n"
               "touch \"$CCACHE_DIR/mine\"\n")
    run = build(tmp_path, box, "mallory", 1, hostile)
    assert run.status == "passed", (tmp_path / "mallory-1" / "build.log").read_text()
    assert f"cache: {tmp_path / 'ccache' / 'mallory'}" in (tmp_path / "mallory-1" / "build.log").read_text()
    assert (tmp_path / "ccache" / "mallory" / "mine").exists()  # its own part it writes
    assert not planted.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as the slots' uids only under a root worker")
def test_two_slots_with_uids_of_their_own_share_a_projects_cache(tmp_path: Path) -> None:
    """Each slot runs its jobs as a uid of its own, all of one group: what one slot's build put in
    the project's cache, the other's build is served from, and writes beside."""
    tmp_path.chmod(0o755)  # the job uids reach the cache through it, as through a lab's ccache directory
    script = "set -e\nccache gcc -O2 -c hello.c -o hello.o\ngcc -o hello hello.o\n"
    for n, uid in ((1, 2_000_000_200), (2, 2_000_000_201)):
        box = Sandbox("bwrap", uid=uid, gid=2_000_000_200, ccache=tmp_path / "ccache")
        run = build(tmp_path, box, "alpha", n, script)
        assert run.status == "passed", (tmp_path / f"alpha-{n}" / "build.log").read_text()
    counts = dict(line.split("\t")[:2] for line in stats(tmp_path / "ccache" / "alpha").splitlines() if "\t" in line)
    assert int(counts["direct_cache_hit"]) + int(counts.get("preprocessed_cache_hit", 0)) == 1, counts
    top = (tmp_path / "ccache" / "alpha").stat()
    assert (top.st_uid, top.st_gid, top.st_mode & 0o7777) == (0, 2_000_000_200, 0o2770)
    # Whatever either slot wrote there, the other may write over: the group's, group-writable.
    made = [p for p in (tmp_path / "ccache" / "alpha").rglob("*") if not p.is_symlink()]
    assert made and all(p.stat().st_gid == 2_000_000_200 and p.stat().st_mode & 0o020 for p in made), \
        [(str(p), p.stat().st_uid, p.stat().st_gid, oct(p.stat().st_mode)) for p in made][:5]
