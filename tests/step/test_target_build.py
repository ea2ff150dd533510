"""run_build runs a target's own build (Catalog.build_for): its argv, its env over [build]'s, its
outputs only; and a mistake in it is reported under the target's own catalog key."""

from __future__ import annotations

from pathlib import Path

from gearfarm.formats import catalog as catalog_mod
from gearfarm.step import runner as step
from gearfarm.step.sandbox import Sandbox

CATALOG = """schema = 2
[build]
argv = ["sh", "-c", "echo \\"$CFLAGS\\" > libfoo.so"]
env = { CFLAGS = "-O2" }
outputs = ["libfoo.so"]
[targets.linux-x86_64]
[targets.windows-x86_64]
exe = ".exe"
[targets.windows-x86_64.build]
argv = ["sh", "-c", "echo \\"$CFLAGS $LDFLAGS\\" > foo.dll"]
env = { LDFLAGS = "-static-libgcc" }
outputs = ["foo.dll"]
"""


def _build(tmp_path: Path, text: str, target: str) -> step.BuildRun:
    cat = catalog_mod.parse(text, "cat.toml")
    root, scratch = tmp_path / target / "root", tmp_path / target / "scratch"
    root.mkdir(parents=True)
    scratch.mkdir()
    return step.run_build(cat, cat.target(target), root, scratch, tmp_path / target / "build.log", Sandbox("none"))


def test_each_target_runs_its_own_build_and_packs_its_own_outputs(tmp_path: Path) -> None:
    linux = _build(tmp_path, CATALOG, "linux-x86_64")
    windows = _build(tmp_path, CATALOG, "windows-x86_64")
    assert (linux.status, linux.outputs) == ("passed", ["libfoo.so"]), linux.error
    assert (windows.status, windows.outputs) == ("passed", ["foo.dll"]), windows.error
    assert (tmp_path / "linux-x86_64" / "root" / "libfoo.so").read_text() == "-O2\n"
    # [build]'s env reached the Windows build, with the target's own added.
    assert (tmp_path / "windows-x86_64" / "root" / "foo.dll").read_text() == "-O2 -static-libgcc\n"


def test_a_mistake_in_a_targets_build_names_the_targets_key(tmp_path: Path) -> None:
    run = _build(tmp_path, CATALOG.replace('outputs = ["foo.dll"]', 'outputs = ["zlib1.dll"]'), "windows-x86_64")
    assert run.status == "failed"
    assert "build output 'zlib1.dll' (catalog key targets.windows-x86_64.build.outputs) matched nothing" in run.error
    assert run.error in (tmp_path / "windows-x86_64" / "build.log").read_text()
    run = _build(tmp_path, CATALOG.replace('outputs = ["libfoo.so"]', 'outputs = ["libfoo.dylib"]'), "linux-x86_64")
    assert "(catalog key build.outputs) matched nothing" in run.error
    run = _build(tmp_path / "cwd", CATALOG + 'cwd = "win32"\n', "windows-x86_64")
    assert run.status == "failed" and run.error.startswith(
        "targets.windows-x86_64.build.cwd 'win32' is not a directory of the source tree: fix the catalog's "
        "targets.windows-x86_64.build.cwd"), run.error
