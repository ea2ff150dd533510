"""Any team's project, through the whole farm on real gearmand and MinIO: three projects built
by Make (tests print TAP), CMake (tests run by CTest) and a lib/Makefile whose tests are plain
programs judged by exit status, each for two targets, by workers that have no repository at all
(the source and the catalog reach them through S3). A commit made after the workers started is
what gets built; a second nightly of the same revisions moves no bytes; a planted bug is
reported as a new failure."""

from __future__ import annotations

import json
import os
import sqlite3
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3.store import ArtifactStore
from tests import projects
from tests.farmkit import gearfarm

TARGETS = list(projects.TARGETS)
CASES = {  # every test case of each project, by its suite
    "tapkv": {"tap": ["put a", "get a", "put and get b", "delete a", "compaction", "put and get c"]},
    "cmring": {"ctest": ["push_pop", "wrap", "empty"]},
    "plainc": {"crc": ["crc"], "vectors": ["vectors"]},
}


class Lab:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.tapkv = projects.tapkv(base / "tapkv")
        self.cmring = projects.cmring(base / "cmring")
        self.plainc = projects.plainc(base / "plainc")
        (base / "plainc.toml").write_text(projects.CATALOG_PLAINC)
        # The workers' "repository": an empty directory. Nothing may appear in it.
        self.empty = base / "no-repo"
        self.empty.mkdir()
        self.projects = [
            ProjectConfig(name="tapkv", repo=str(self.tapkv), catalog=".gearfarm/catalog.toml"),
            ProjectConfig(name="cmring", repo=str(self.cmring)),
            # A URL: the nightly fetches it into its own mirror.
            ProjectConfig(name="plainc", repo=f"file://{self.plainc}", catalog_file=str(base / "plainc.toml")),
        ]
        # The workers' git: it records that it was called and fails. Workers must never call it.
        shim = base / "no-git"
        shim.mkdir()
        self.git_calls = base / "git-calls.log"
        (shim / "git").write_text(f"#!/bin/sh\necho \"$*\" >> {self.git_calls}\nexit 127\n")
        (shim / "git").chmod(0o755)
        self.farm = EmbeddedFarm(base / "state", self.empty, projects=self.projects,
                                 worker_env={"PATH": f"{shim}:{os.environ['PATH']}"})

    @property
    def config(self) -> Path:
        return self.farm.config_path

    def nightly(self, *args: str, config: Path | None = None) -> tuple[int, str]:
        p = gearfarm("nightly", "--config", str(config or self.config), "--benchmarks", "none", *args, timeout=600)
        return p.returncode, p.stdout + p.stderr

    def runs(self) -> list[tuple[str, str, str]]:
        with sqlite3.connect(self.farm.state / "results.db") as db:
            return db.execute("SELECT run_id, project, rev FROM runs WHERE parent_run_id IS NULL "
                              "ORDER BY created_at").fetchall()

    def jobs(self, run_id: str) -> dict[str, tuple[str, str]]:
        with sqlite3.connect(self.farm.state / "results.db") as db:
            return {j: (st, json.loads(rec)["rev"]) for j, st, rec in
                    db.execute("SELECT job_id, status, record FROM jobs WHERE run_id = ?", (run_id,))}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = Lab(tmp_path_factory.mktemp("projects"))
    cats = [catalog_mod.load_file(lab.tapkv / ".gearfarm" / "catalog.toml"),
            catalog_mod.load_file(lab.cmring / "jobs" / "catalog.toml"),
            catalog_mod.load_file(lab.base / "plainc.toml")]
    lab.farm.start(cats, TARGETS)
    try:
        yield lab
    finally:
        lab.farm.stop()


def s3_objects(lab: Lab, prefix: str) -> dict[str, tuple[str, str]]:
    store = ArtifactStore(config_mod.load(lab.config).s3)
    out = {}
    for page in store.s3.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = (o["ETag"], str(o["LastModified"]))
    return out


def junit_cases(path: Path) -> dict[str, str]:
    """(classname/name) -> status of every test case in a run's JUnit report."""
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        status = "failed" if tc.find("failure") is not None or tc.find("error") is not None else \
            "skipped" if tc.find("skipped") is not None else "passed"
        out[f"{tc.get('classname')}/{tc.get('name')}"] = status
    return out


def test_three_projects_built_and_tested_by_workers_without_a_repository(lab: Lab) -> None:
    # Committed after the workers started: they cannot have it, except through S3.
    rev = projects.tapkv_add_case(lab.tapkv)
    code, out = lab.nightly()
    assert code == 0, out
    runs = lab.runs()
    assert sorted(p for _, p, _ in runs) == ["cmring", "plainc", "tapkv"], runs
    assert dict((p, r) for _, p, r in runs)["tapkv"] == rev
    for run_id, project, run_rev in runs:
        jobs = lab.jobs(run_id)
        suites = CASES[project]
        assert set(jobs) == {f"{run_id}:{t}:{s}" for t in TARGETS for s in ["build"] + [f"test-{n}" for n in suites]}
        assert all(st == "passed" and r == run_rev for st, r in jobs.values()), jobs
        # Every test case is in the run's report with its status, on both targets.
        got = junit_cases(lab.farm.state / "runs" / run_id / "junit.xml")
        for names in suites.values():
            for name in names:
                for t in TARGETS:
                    hits = [st for k, st in got.items() if k.endswith(f"/{name}") and t in k]
                    assert hits == ["skipped" if name == "compaction" else "passed"], (project, t, name, got)
        report = json.loads((lab.farm.state / "runs" / run_id / "report.json").read_text())
        assert report["project"] == project and report["all_green"], report["headline"]
    # ... and in the history, per project.
    hist = gearfarm("history", "put and get c", "--config", str(lab.config))
    rows = [line for line in hist.stdout.splitlines() if "tapkv" in line]
    assert hist.returncode == 0 and len(rows) == 2, hist.stdout + hist.stderr
    assert all(rev[:12] in line and "│ passed │" in line for line in rows)
    assert "wrap" in gearfarm("history", "ctest/wrap", "--config", str(lab.config)).stdout
    # Every case of every project is in the history, once per target, with its status.
    db = ResultsDB(f"sqlite:///{lab.farm.state / 'results.db'}")
    for project, suites in CASES.items():
        for suite, names in suites.items():
            for name in names:
                got_hist = sorted((c.target, c.status) for c, _ in db.cases_of(name, suite=suite, project=project))
                want = "skipped" if name == "compaction" else "passed"
                assert got_hist == sorted((t, want) for t in TARGETS), (project, suite, name, got_hist)
    # The workers never had a repository, got none, and never ran git.
    assert not any(lab.empty.iterdir())
    assert not lab.git_calls.exists(), lab.git_calls.read_text()
    # One mail for the whole nightly, a section per project.
    eml = (lab.farm.state / "runs" / runs[0][0] / "report.eml").read_text()
    assert all(p in eml for p in ("tapkv", "cmring", "plainc"))


def test_a_second_nightly_of_the_same_revisions_moves_no_bytes(lab: Lab) -> None:
    before = {**s3_objects(lab, "sources/"), **s3_objects(lab, "artifacts/"), **s3_objects(lab, "catalogs/")}
    assert any(k.startswith("sources/") for k in before) and any(k.startswith("artifacts/") for k in before)
    code, out = lab.nightly()
    assert code == 0, out
    for project in ("tapkv", "cmring", "plainc"):
        assert f"project {project}: moved 0 bytes of source and 0 bytes of artifacts (2 of 2 builds reused)" in out, out
    after = {**s3_objects(lab, "sources/"), **s3_objects(lab, "artifacts/"), **s3_objects(lab, "catalogs/")}
    assert after == before  # no object added or rewritten
    assert not lab.git_calls.exists()


def test_a_planted_bug_is_reported_as_a_new_failure(lab: Lab) -> None:
    projects.tapkv_break_delete(lab.tapkv)
    code, out = lab.nightly("--project", "tapkv")
    assert code == 1, out
    run_id = lab.runs()[-1][0]
    report = json.loads((lab.farm.state / "runs" / run_id / "report.json").read_text())
    assert report["project"] == "tapkv"
    new = report["new"]
    assert {(e["target"], e["test"]) for e in new} >= {(t, "tap/delete a") for t in TARGETS}, new
    assert "new failure" in report["headline"]
    got = junit_cases(lab.farm.state / "runs" / run_id / "junit.xml")
    assert [st for k, st in got.items() if k.endswith("/delete a")] == ["failed", "failed"]
    assert [st for k, st in got.items() if k.endswith("/put a")] == ["passed", "passed"]


def test_a_worker_without_targets_learns_them_from_the_projects_catalogs_in_s3(lab: Lab) -> None:
    """No repository and no --targets: the worker serves what the projects' newest catalogs
    (stored by the nightly) define and this host can run."""
    import subprocess
    import sys
    import time

    from gearfarm.gearman import admin

    host, port = config_mod.load(lab.config).gearman.addresses()[0]
    before = admin.status(host, port)
    log = lab.base / "worker-no-targets.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gearfarm.cli", "worker", "--role", "test", "--config",
                                 str(lab.config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = admin.status(host, port)
            if all(now[f"test:{t}"].workers == before[f"test:{t}"].workers + 1 for t in TARGETS):
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.3)
        else:
            pytest.fail(f"the worker did not register test:{TARGETS}: {log.read_text()}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not any(lab.empty.iterdir())


def check(*args: str) -> tuple[int, str]:
    p = gearfarm("project", "check", *args, timeout=300)
    return p.returncode, p.stdout + p.stderr


def test_project_check_prints_what_the_farm_would_run_and_tries_the_build(tmp_path: Path) -> None:
    repo = projects.tapkv(tmp_path / "tapkv")
    code, out = check("--repo", str(repo), "--catalog", ".gearfarm/catalog.toml", "--target", "linux-i686")
    assert code == 0, out
    assert "catalog valid" in out and "2 targets, 1 suite," in out
    assert "build   (in .): make CC=i686-linux-gnu-gcc LDFLAGS=-static" in out
    assert "test-tap (tap, in .): {root}/t_kv" in out
    assert "building linux-i686 here" in out and "suite tap (tap): passed, 5 test cases 4 passed, 1 skipped" in out

    projects.tapkv_break_delete(repo)
    code, out = check("--repo", str(repo), "--catalog", ".gearfarm/catalog.toml")
    assert code == 1 and "failed: delete a" in out, out


def test_project_check_names_the_file_the_key_and_the_fix(tmp_path: Path) -> None:
    from tests.farmkit import commit

    repo = projects.tapkv(tmp_path / "tapkv")
    cat = repo / ".gearfarm" / "catalog.toml"
    good = cat.read_text()
    cat.write_text(good.replace("timeout = 60", "timout = 60"))
    commit(repo, "typo")
    code, out = check("--repo", str(repo), "--catalog", ".gearfarm/catalog.toml", "--no-run")
    assert code == 2 and "[suites.tap] unknown key 'timout': remove it or check its spelling" in out, out
    assert ".gearfarm/catalog.toml" in out
    cat.write_text(good.replace('outputs = ["libkv.a", "t_kv"]', 'outputs = ["libkv.a", "bin/t_kv"]'))
    commit(repo, "wrong output path")
    code, out = check("--repo", str(repo), "--catalog", ".gearfarm/catalog.toml")
    assert code == 1 and "build output 'bin/t_kv' (catalog key build.outputs) matched nothing" in out, out
    code, out = check("--repo", str(repo))
    assert code == 2 and "no catalog at jobs/catalog.toml" in out and "catalog / catalog_file" in out, out


def test_a_projects_targets_are_all_its_nightly_builds_and_must_be_in_its_catalog(lab: Lab) -> None:
    """[[projects]] targets: a lab serving only some of the catalog's targets names them, and
    the nightly runs those targets' jobs and no other (nor waits for their workers)."""
    cfg = config_mod.load(lab.config)
    cmring = cfg.project("cmring")
    cfg.projects = [cmring.model_copy(update={"targets": ["linux-x86_64"]})]
    only = lab.config.with_name("linux-only.toml")  # beside the farm's: its relative paths hold
    config_mod.dump(cfg, only)
    code, out = lab.nightly(config=only)
    assert code == 0, out
    run_id, project, _ = lab.runs()[-1]
    assert project == "cmring"
    assert set(lab.jobs(run_id)) == {f"{run_id}:linux-x86_64:{s}" for s in ("build", "test-ctest")}
    report = json.loads((lab.farm.state / "runs" / run_id / "report.json").read_text())
    assert report["targets"] == ["linux-x86_64"], report["targets"]
    # --targets still decides when given.
    code, out = lab.nightly("--targets", "linux-i686", config=only)
    assert code == 0, out
    assert {j.split(":")[1] for j in lab.jobs(lab.runs()[-1][0])} == {"linux-i686"}

    cfg.projects = [cmring.model_copy(update={"targets": ["linux-x86_64", "windows-x86_64"]})]
    config_mod.dump(cfg, only)
    code, out = lab.nightly(config=only)
    assert code == 2, out
    assert ("project cmring: [[projects]] targets: unknown target 'windows-x86_64'; known targets: "
            f"{', '.join(sorted(TARGETS))}") in out, out
    code, out = check("--config", str(only), "--no-run")
    assert code == 2 and "unknown target 'windows-x86_64'" in out, out
