"""CTest on every target, against what was built: a CMake tree moved to a test job's directory
runs each test under the target's runner whatever form of add_test registered it (qemu for
linux-aarch64, wine for windows-x86_64), and a test whose program would load the host's copy of
a library the build made runs against the build's copy, or fails saying so."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gearfarm.formats import catalog as catalog_mod
from gearfarm.step import ctestfile, runner, wine
from gearfarm.step.sandbox import Sandbox
from tests import crossproject

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")

TOOLS = {"linux-x86_64": "gcc", "linux-aarch64": "qemu-aarch64", "windows-x86_64": "wine"}


def moved_build(repo: Path, target: str, tmp_path: Path) -> tuple[catalog_mod.Catalog, Path]:
    """Build ``repo`` for ``target`` as the farm's build step does, then give the tree to a
    "test host": copied under another root, the build's own directory gone."""
    cat = catalog_mod.load_file(repo / "jobs" / "catalog.toml")
    t = cat.targets[target]
    vals = catalog_mod.values(cat, t, {"root": str(repo), "scratch": "", "junit": "", "seed": "1"})
    env = {k: v.format_map(vals) for k, v in cat.build.env.items()}
    crossproject.build_here(repo, {**os.environ, **env})
    tree = tmp_path / "job" / "tree"
    shutil.copytree(repo, tree, symlinks=True)
    shutil.rmtree(repo)
    return cat, tree


def run(cat: catalog_mod.Catalog, target: str, tree: Path, tmp_path: Path, box: Sandbox | None = None,
        **kw: bool) -> runner.SuiteRun:
    box = box or Sandbox("bwrap")
    job = tree.parent
    scratch = job / "scratch"
    scratch.mkdir()
    prefix = wine.job_prefix(box, tmp_path / "wine-cache", cat.targets[target].runner, job)
    return runner.run_suite(cat, cat.targets[target], cat.suite("ctest"), tree, scratch, job / "log.txt", 1, box,
                            prefix, **kw)


@pytest.mark.parametrize("target", crossproject.CROSS_TARGETS)
def test_every_add_test_form_runs_under_the_targets_runner(target: str, tmp_path: Path) -> None:
    if shutil.which(TOOLS[target]) is None:
        pytest.skip(f"needs {TOOLS[target]}")
    cat, tree = moved_build(crossproject.crossring(tmp_path / "src"), target, tmp_path)
    got = run(cat, target, tree, tmp_path)
    statuses = {c.name: c.status for c in got.cases}
    assert statuses == crossproject.CROSS_CASES, (statuses, got.message, (tree.parent / "log.txt").read_text()[-3000:])
    fails = next(c for c in got.cases if c.name == "fails")
    assert crossproject.ASSERTION in fails.message
    assert got.status == "failed" and "1 failed: fails" in got.message


def test_a_test_of_a_moved_tree_runs_against_the_library_it_built(tmp_path: Path) -> None:
    # The host has a libz.so.1 (Debian's zlib); the build made its own. CMake linked the test
    # with RUNPATH = the build directory, which is gone on the test host.
    assert Path("/lib/x86_64-linux-gnu/libz.so.1").exists()
    cat, tree = moved_build(crossproject.fakez(tmp_path / "src"), "linux-x86_64", tmp_path)
    got = run(cat, "linux-x86_64", tree, tmp_path)
    assert [(c.name, c.status) for c in got.cases] == [("version", "passed")], got.message
    # The test's own word (it fails unless the library it called is the one built).
    assert got.results is not None and f"zlibVersion() = {crossproject.BUILT_VERSION}" in got.results.read_text()
    log = (tree.parent / "log.txt").read_text()
    assert "RUNPATH of build/t_version: " in log and "-> $ORIGIN" in log


def test_without_the_rewrite_the_host_copy_fails_the_case_naming_both_paths(tmp_path: Path) -> None:
    cat, tree = moved_build(crossproject.fakez(tmp_path / "src"), "linux-x86_64", tmp_path)
    got = run(cat, "linux-x86_64", tree, tmp_path, relink=False)
    case = {c.name: c for c in got.cases}["version"]
    assert case.status == "failed" and got.status == "failed"
    # Both the loader's choice and the build's own library, by path; and the test's assertion.
    assert "libz.so.1, the host's copy, in place of the build's " + str(tree / "build" / "libz.so.1") in case.message
    assert "loaded /" in case.message and "x86_64-linux-gnu/libz.so.1" in case.message
    assert "the library tested is not the one built" in case.message


def test_prepare_names_what_it_could_not_wrap(tmp_path: Path) -> None:
    build = tmp_path / "tree" / "build"
    build.mkdir(parents=True)
    (build / "prog").write_bytes(b"\x7fELF" + b"\0" * 60)
    (build / "run.sh").write_text("#!/bin/sh\nexec ./prog\n")
    (build / "CTestTestfile.cmake").write_text(
        f"# Build directory: {build}\n"
        'add_test([=[a b]=] "./prog" "--flag" "x;y")\n'
        'add_test(script "./run.sh")\n'
        'add_test(host "sh" "-c" "true")\n'
        f'add_test(emulated "qemu-aarch64" "{build}/prog")\n')
    done = ctestfile.prepare(build, tmp_path / "tree", ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"])
    text = (build / "CTestTestfile.cmake").read_text()
    # The program's arguments are kept as they were, one of them holding a ';'.
    assert (f'add_test([=[a b]=] "qemu-aarch64" "-L" "/usr/aarch64-linux-gnu" "{build}/prog" "--flag" "x;y")'
            in text)
    assert done.wrapped == ["a b"] and done.programs == {"a b": f"{build}/prog", "emulated": f"{build}/prog"}
    assert "not a program but a script" in done.unwrapped["script"]
    assert "no file of the build tree" in done.unwrapped["host"]
    assert 'add_test(emulated "qemu-aarch64" ' in text  # CMake's own emulator is left alone


def test_what_a_hostile_build_leaves_is_read_with_care(tmp_path: Path) -> None:
    import struct

    from gearfarm.step import hostlib, runpath

    tree = tmp_path / "tree"
    (tree / "build").mkdir(parents=True)
    # An ELF header whose one program header says PT_DYNAMIC lies far past the file's end.
    head = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    struct.pack_into("<Q", head, 32, 64)  # e_phoff
    struct.pack_into("<HH", head, 54, 56, 1)  # e_phentsize, e_phnum
    head += struct.pack("<IIQQQQQQ", 2, 0, 10**9, 0, 0, 4096, 4096, 8)
    (tree / "build" / "broken").write_bytes(bytes(head))
    assert runpath.relink(tree) == ([], [])  # neither read as a RUNPATH nor a crash
    # A CTestTestfile that is a link (inside the tree) is not rewritten through.
    target = tree / "elsewhere.cmake"
    target.write_text("# Build directory: /old/build\nadd_test(a \"/old/build/a\")\n")
    (tree / "build" / "sub").mkdir()
    (tree / "build" / "sub" / "CTestTestfile.cmake").symlink_to(target)
    (tree / "build" / "CTestTestfile.cmake").write_text("# Build directory: /old/build\n")
    ctestfile.prepare(tree / "build", tree, ["qemu-aarch64"])
    assert target.read_text().startswith("# Build directory: /old/build\n")
    # The suite replaced its loader directory with a link to the host's /etc: nothing is read.
    loader = tmp_path / "loader"
    loader.symlink_to("/etc")
    copies, notes = hostlib.findings(loader, tree)
    assert copies == [] and "was replaced by a link" in notes[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="a worker switches jobs to the job uid only as root")
def test_the_loaders_account_never_reaches_the_log(tmp_path: Path) -> None:
    # A root worker runs jobs as the job uid through unshare, setpriv and bwrap, which cannot
    # reach the job's directories before bwrap binds them: their own loaders must not be asked
    # to write an account (it would land in the job's log).
    cat, tree = moved_build(crossproject.fakez(tmp_path / "src"), "linux-x86_64", tmp_path)
    got = run(cat, "linux-x86_64", tree, tmp_path, box=Sandbox("bwrap", uid=2_000_000_000), relink=False)
    log = (tree.parent / "log.txt").read_text()
    assert "calling init" not in log and "transferring control" not in log, log[-2000:]
    assert {c.name: c.status for c in got.cases} == {"version": "failed"}  # and the check still works
    assert "the host's copy" in got.cases[0].message


def test_a_runpath_pointing_past_the_string_table_is_noted_not_a_crash(tmp_path: Path) -> None:
    import struct
    import subprocess

    from gearfarm.step import runpath

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "p.c").write_text("int main(void) { return 0; }\n")
    prog = tree / "prog"
    subprocess.run(["gcc", "-o", str(prog), str(tree / "p.c"), "-Wl,-rpath,/gone/build"], check=True)
    data = bytearray(prog.read_bytes())
    elf = runpath._parse(data)
    assert elf is not None and elf.paths
    tag, offset = elf.paths[0]
    entry = struct.pack("<qQ", tag, offset)
    assert data.count(entry) == 1
    # The dynamic entry now names a string a megabyte past the table: a build can write that.
    at = data.index(entry)
    data[at:at + 16] = struct.pack("<qQ", tag, 1 << 20)
    prog.write_bytes(bytes(data))
    done, notes = runpath.relink(tree)
    assert done == [] and notes == ["prog: its dynamic section cannot be read; left as it is"]


def test_a_runpath_into_another_jobs_dir_is_pointed_at_the_tree_while_that_dir_is_still_there(tmp_path: Path) -> None:
    """A build's RUNPATH names its job dir; the test of its artifact runs in a job dir of its
    own, on this host or another. That the build's dir is still there (the build's slot removes
    it once its record is out, or when its next command starts) must not keep the RUNPATH: the
    test's sandbox does not show another job's dir, so the program would load the host's
    library, and the chance of a moment decided whether the suite tested what was built."""
    import shutil
    import subprocess

    from gearfarm.step import runpath

    work = tmp_path / "work"
    build = work / "111-1-boot" / "buildabc" / "root" / "build"
    build.mkdir(parents=True)
    (build / "z.c").write_text("int zv(void) { return 7; }\n")
    (build / "p.c").write_text("int zv(void);\nint main(void) { return zv() == 7 ? 0 : 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(build / "libzv.so"), str(build / "z.c")], check=True)
    subprocess.run(["gcc", "-o", str(build / "prog"), str(build / "p.c"), f"-L{build}", "-lzv",
                    f"-Wl,-rpath,{build}"], check=True)
    tree = work / "222-1-boot" / "testdef" / "root"
    (tree / "build").mkdir(parents=True)
    for name in ("libzv.so", "prog"):
        shutil.copy2(build / name, tree / "build" / name)
    assert runpath.relink(tree) == ([], [])  # the build's dir is there: as before, left alone
    done, notes = runpath.relink(tree, work)
    assert [(d.path, d.before, d.after) for d in done] == [("build/prog", str(build), "$ORIGIN")] and not notes
    shutil.rmtree(build.parent.parent)
    assert subprocess.run([str(tree / "build" / "prog")]).returncode == 0  # loads the tree's own
