"""A build per target (issue #35): one small library whose Linux build leaves libfoo.so and
test_foo and whose Windows build (mingw, tested under wine) leaves foo.dll and test_foo.exe,
each target's outputs its own and no list padded with the other's files, through a whole
nightly of an embedded farm and through `gearfarm project check`. Changing one target's build
rebuilds that target only."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3.artifact import unpack
from gearfarm.s3.store import ArtifactStore
from tests import projects
from tests.farmkit import gearfarm

TARGETS = list(projects.LIBFOO_TARGETS)
FILES = {"linux-x86_64": ["libfoo.so", "test_foo"], "windows-x86_64": ["foo.dll", "test_foo.exe"]}


class Lab:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.repo = projects.libfoo(base / "libfoo")
        # Beside the farm config, so a changed build is the same revision with another catalog:
        # what an artifact key is made of then differs only by the build definitions.
        self.catalog = base / "libfoo.toml"
        self.catalog.write_text(projects.CATALOG_LIBFOO)
        self.farm = EmbeddedFarm(base / "state", self.repo, projects=[
            ProjectConfig(name="libfoo", repo=str(self.repo), catalog_file=str(self.catalog))])

    def nightly(self) -> tuple[int, str, dict]:  # type: ignore[type-arg]
        p = gearfarm("nightly", "--config", str(self.farm.config_path), "--benchmarks", "none", timeout=600)
        with sqlite3.connect(self.farm.state / "results.db") as db:
            (run_id,) = db.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()
        report = json.loads((self.farm.state / "runs" / run_id / "report.json").read_text())
        return p.returncode, p.stdout + p.stderr, report


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = Lab(tmp_path_factory.mktemp("target-builds"))
    lab.farm.start(catalog_mod.load_file(lab.catalog), TARGETS)
    try:
        yield lab
    finally:
        lab.farm.stop()


def builds(report: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {j["target"]: j for j in report["jobs"] if j["step"] == "build"}


def test_each_target_builds_and_tests_its_own_files(lab: Lab, tmp_path: Path) -> None:
    code, out, report = lab.nightly()
    assert code == 0, out
    assert report["all_green"], report["headline"]
    for target in TARGETS:
        cells = report["matrix"][target]
        assert cells["build"]["status"] == "passed" and cells["test-foo"]["status"] == "passed", (target, cells)
    store = ArtifactStore(config_mod.load(lab.farm.config_path).s3)
    for target, job in builds(report).items():
        archive = tmp_path / f"{target}.tar"
        store.get_file(job["artifact_key"], archive)
        unpack(archive, tmp_path / target, job["artifact_sha256"])
        # Exactly the target's own outputs: nothing of the other target's, nothing padded.
        packed = sorted(p.name for p in (tmp_path / target).iterdir() if p.name != ".gearfarm")  # the manifest
        assert packed == sorted(FILES[target]), target
        magic = (tmp_path / target / FILES[target][1]).read_bytes()[:4]
        assert magic == (b"MZ\x90\x00" if target.startswith("windows") else b"\x7fELF"), (target, magic)


def test_changing_one_targets_build_rebuilds_that_target_only(lab: Lab) -> None:
    _, _, before = lab.nightly()  # the same revision and catalog: both builds reused
    assert all(j["reused_artifact"] for j in builds(before).values()), builds(before)
    stripped = projects.CATALOG_LIBFOO.replace('LDFLAGS = "-static-libgcc"', 'LDFLAGS = "-static-libgcc -s"')
    assert stripped != projects.CATALOG_LIBFOO
    lab.catalog.write_text(stripped)
    code, out, after = lab.nightly()
    assert code == 0, out
    old, new = builds(before), builds(after)
    assert new["linux-x86_64"]["artifact_key"] == old["linux-x86_64"]["artifact_key"]
    assert new["linux-x86_64"]["reused_artifact"]
    assert new["windows-x86_64"]["artifact_key"] != old["windows-x86_64"]["artifact_key"]
    assert not new["windows-x86_64"]["reused_artifact"]
    assert "(1 of 2 builds reused)" in out, out


def test_project_check_prints_each_targets_build_and_runs_the_windows_one_under_wine(lab: Lab) -> None:
    # The farm's config: the check uses the wine template its workers made.
    p = gearfarm("project", "check", "--config", str(lab.farm.config_path), "--repo", str(lab.repo),
                 "--target", "windows-x86_64", timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    linux, windows = out.split("\ntarget linux-x86_64")[1].split("\ntarget windows-x86_64")
    assert "build   (in .): make CC=gcc\n" in linux and "outputs: libfoo.so, test_foo\n" in linux
    assert "env: CFLAGS=-O2 -Wall -Werror -DFOO_SHARED_FLAGS\n" in linux and "[targets." not in linux
    assert "build   (in .): make CC=x86_64-w64-mingw32-gcc windows\n" in windows
    # env merged: [build]'s CFLAGS and the target's own LDFLAGS.
    assert "env: CFLAGS=-O2 -Wall -Werror -DFOO_SHARED_FLAGS LDFLAGS=-static-libgcc\n" in windows
    assert "outputs: foo.dll, test_foo.exe\n" in windows
    assert "[targets.windows-x86_64.build] sets argv, env, outputs over [build]" in windows
    assert "build passed; artifact would hold 2 files:\n  foo.dll\n  test_foo.exe\n" in out
    assert "suite foo (exit-code): passed, 1 test case 1 passed" in out
