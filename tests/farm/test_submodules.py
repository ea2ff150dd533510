"""docs/projects.md's project with submodules through the whole farm on real gearmand and MinIO:
calc, whose test program compiles files of its submodule picotest and of picotest's own
submodule tinyfmt, built and tested on two targets by workers that have no repository and no
git; the submodules fetched once into the nightly's mirrors; a second nightly moving nothing; a
snapshot stored before the farm packed submodules refused, saying what to delete."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore
from tests import subprojects
from tests.farm.test_projects import junit_cases, s3_objects
from tests.farmkit import gearfarm

TARGETS = list(subprojects.TARGETS)


class Lab:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.calc = subprojects.calc(base / "server")
        # The docs' [[projects]] entry, its server URL swapped for the test's.
        self.project = ProjectConfig(**{**subprojects.doc_project(), "repo": self.calc.url})
        self.empty = base / "no-repo"
        self.empty.mkdir()
        shim = base / "no-git"  # the workers' git: records a call and fails
        shim.mkdir()
        self.git_calls = base / "git-calls.log"
        (shim / "git").write_text(f'#!/bin/sh\necho "$*" >> {self.git_calls}\nexit 127\n')
        (shim / "git").chmod(0o755)
        self.farm = EmbeddedFarm(
            base / "state", self.empty, projects=[self.project], worker_env={"PATH": f"{shim}:{os.environ['PATH']}"}
        )

    @property
    def config(self) -> Path:
        return self.farm.config_path

    def nightly(self, *args: str) -> tuple[int, str]:
        p = gearfarm("nightly", "--config", str(self.config), "--benchmarks", "none", *args, timeout=600)
        return p.returncode, p.stdout + p.stderr

    def last_run(self) -> tuple[str, str]:
        with sqlite3.connect(self.farm.state / "results.db") as db:
            return db.execute(
                "SELECT run_id, rev FROM runs WHERE parent_run_id IS NULL ORDER BY created_at DESC"
            ).fetchone()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = Lab(tmp_path_factory.mktemp("submodules"))
    lab.farm.start([catalog_mod.parse(subprojects.doc_block("# calc/jobs/catalog.toml"), "calc")], TARGETS)
    try:
        yield lab
    finally:
        lab.farm.stop()


def test_a_project_with_nested_submodules_builds_and_passes_on_two_targets(lab: Lab) -> None:
    code, out = lab.nightly()
    assert code == 0, out
    run_id, rev = lab.last_run()
    assert rev == subprojects.git(lab.calc.work("calc"), "rev-parse", "HEAD")
    with sqlite3.connect(lab.farm.state / "results.db") as db:
        jobs = dict(db.execute("SELECT job_id, status FROM jobs WHERE run_id = ?", (run_id,)).fetchall())
    assert jobs == {f"{run_id}:{t}:{s}": "passed" for t in TARGETS for s in ("build", "test-calc")}, jobs
    got = junit_cases(lab.farm.state / "runs" / run_id / "junit.xml")
    for name in subprojects.CASES:
        for t in TARGETS:
            assert [st for k, st in got.items() if k.endswith(f"/{name}") and t in k] == ["passed"], (t, name, got)
    # Each submodule mirrored once on the nightly's host; the manifest lists them.
    mirrors = lab.farm.state / "repos" / "calc" / "modules"
    assert sorted(p.name.rsplit("-", 1)[0] for p in mirrors.iterdir()) == ["picotest", "tinyfmt"]
    store = ArtifactStore(config_mod.load(lab.config).s3)
    manifest = json.loads(store.get_bytes(keys.source_manifest(rev)))
    assert [m["path"] for m in manifest["submodules"]] == ["picotest", "picotest/fmt"]
    # The workers had no repository, got none, and never ran git.
    assert not any(lab.empty.iterdir())
    assert not lab.git_calls.exists(), lab.git_calls.read_text()


def test_a_second_nightly_moves_no_bytes_and_fetches_nothing(lab: Lab) -> None:
    before = {**s3_objects(lab, "sources/"), **s3_objects(lab, "artifacts/")}  # type: ignore[arg-type]
    # The submodules' server is gone: nothing of it is needed for a revision already stored.
    away = lab.base / "server" / "git-away"
    (lab.base / "server" / "git" / "picotest.git").rename(away)
    try:
        code, out = lab.nightly()
    finally:
        away.rename(lab.base / "server" / "git" / "picotest.git")
    assert code == 0, out
    assert "project calc: moved 0 bytes of source and 0 bytes of artifacts (2 of 2 builds reused)" in out, out
    assert {**s3_objects(lab, "sources/"), **s3_objects(lab, "artifacts/")} == before  # type: ignore[arg-type]


def test_a_snapshot_stored_before_submodules_were_packed_is_refused(lab: Lab) -> None:
    """A revision whose snapshot an older farm stored without its submodules: reusing it would
    fail the build again for no visible reason, so the nightly stops and says what to delete."""
    rev = lab.calc.commit("calc", "README", {"README": "calc\n"})
    store = ArtifactStore(config_mod.load(lab.config).s3)
    store.put_bytes(
        keys.source_manifest(rev), json.dumps({"rev": rev, "sha256": "0" * 64, "size": 1}).encode(), "application/json"
    )
    code, out = lab.nightly()
    assert code == 1, out  # the project could not run; the others would have
    assert "was made before the farm packed submodules and lacks them" in out, out
    assert f"delete {keys.source(rev)} and {keys.source_manifest(rev)} by hand" in out, out


def test_a_submodule_commit_nobody_pushed_fails_its_project_naming_it(lab: Lab) -> None:
    # picotest's new commit stays on its author's machine; calc pins it.
    lost = lab.calc.commit("picotest", "local only", {"NOTES": "x\n"}, push=False)
    lab.calc.commit("calc", "bump picotest", links={"picotest": lost})
    code, out = lab.nightly()
    assert code == 1, out  # the project could not run; the others would have
    assert "cannot make the source snapshot of" in out and "cannot store the source" not in out, out
    assert "submodule picotest" in out and lost in out, out
