"""Jenkins (issue #15): the JUnit XML the farm writes loads in Jenkins, and the pipeline in
docker/jenkins/Jenkinsfile asks the nightly for what it really produces.

The schema is the one Jenkins' xUnit plugin validates JUnit files against (junit-10.xsd),
fetched by `make setup` from pytest's source release on PyPI (pytest validates its own JUnit
output with it); the validator is libxml2's xmllint, not code of ours.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gearfarm.config import ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.result import CaseResult, ResultRecord
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.step import junit
from tests import projects
from tests.farmkit import ROOT, gearfarm

JENKINSFILE = ROOT / "docker" / "jenkins" / "Jenkinsfile"


@pytest.fixture(scope="module")
def schema() -> Path:
    cache = Path(os.environ.get("GEARFARM_CACHE", Path.home() / ".cache" / "gearfarm"))
    xsd = cache / "junit-10.xsd"
    if not xsd.is_file():
        pytest.fail(f"{xsd} is missing: run 'make setup' (it fetches Jenkins' JUnit schema)")
    if shutil.which("xmllint") is None:
        pytest.fail("xmllint is missing: run 'make setup' (Debian package libxml2-utils)")
    return xsd


def validate(xsd: Path, xml: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["xmllint", "--noout", "--schema", str(xsd), str(xml)], capture_output=True, text=True)


def test_the_validator_rejects_what_jenkins_would(schema: Path, tmp_path: Path) -> None:
    """The control: files the schema refuses are refused, so the checks below can fail."""
    bad = {
        "no name": '<testsuite tests="1"><testcase classname="a" time="0.1"/></testsuite>',
        "control byte": '<testsuite name="s" tests="1"><testcase classname="a" name="b\x01"/></testsuite>',
        "time in words": '<testsuite name="s" tests="1"><testcase classname="a" name="b" time="fast"/></testsuite>',
    }
    for case, text in bad.items():
        path = tmp_path / f"{case.replace(' ', '-')}.xml"
        path.write_text(text)
        assert validate(schema, path).returncode != 0, case


def test_tricky_results_make_valid_junit(schema: Path, tmp_path: Path) -> None:
    out = "boom <&> \x01\x1b[31m ]]> \ud7ff end"
    rec = ResultRecord(job_id="r:linux-x86_64:test-unit", run_id="r", target="linux-x86_64", kind="test",
                       step="test-unit", rev="a" * 40, status="failed", worker="w", started_at=1.0, finished_at=2.5,
                       cases=[CaseResult(classname="unit", name="ok", status="passed", time=0.1),
                              CaseResult(classname="unit", name="bad\x02", status="failed", time=0.2, message=out),
                              CaseResult(classname="unit", name="skip", status="skipped", message="not here"),
                              CaseResult(classname="unit", name="crash", status="error", message="signal 11")])
    timeout = ResultRecord(job_id="r:linux-aarch64:build", run_id="r", target="linux-aarch64", kind="build",
                           step="build", rev="a" * 40, status="timed_out", worker="w", message="build timed out")
    path = tmp_path / "junit.xml"
    junit.write_run([rec, timeout], path)
    p = validate(schema, path)
    assert p.returncode == 0, p.stderr
    text = path.read_text()
    # Failures and errors apart, as Jenkins counts them; nothing dropped unseen.
    assert 'failures="1" errors="1" skipped="1"' in text and 'failures="0" errors="1"' in text
    back = {c.name: c for c in junit.parse(path)}
    assert back["bad\\x02"].status == "failed" and "\\x01\\x1b[31m ]]>" in back["bad\\x02"].message
    assert back["crash"].status == "error" and back["build"].status == "error"


@pytest.fixture(scope="module")
def jenkins_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    """A real nightly of a project with a failing test, run as the Jenkinsfile runs it."""
    base = tmp_path_factory.mktemp("jenkins")
    repo = projects.tapkv(base / "tapkv")
    projects.tapkv_break_delete(repo)
    farm = EmbeddedFarm(base / "state", repo, projects=[
        ProjectConfig(name="tapkv", repo=str(repo), catalog=".gearfarm/catalog.toml")], slots=2)
    cat = catalog_mod.parse((repo / ".gearfarm" / "catalog.toml").read_text(), "tapkv")
    workspace = base / "workspace"
    workspace.mkdir()
    args = re.search(r"def args = \[(.*?)\]", JENKINSFILE.read_text())
    assert args, "the Jenkinsfile's nightly arguments moved"
    flags = re.findall(r"'([^']*)'", args.group(1))
    try:
        farm.start(cat, targets=["linux-x86_64"])
        p = gearfarm("nightly", "--config", str(farm.config_path), "--targets", "linux-x86_64",
                     *[f if not f.startswith("gearfarm-") else str(workspace / f) for f in flags], timeout=600)
    finally:
        farm.stop()
    return p.returncode, p.stdout + p.stderr, workspace


def test_the_nightly_writes_what_the_jenkinsfile_publishes(jenkins_run: tuple[int, str, Path], schema: Path) -> None:
    code, output, workspace = jenkins_run
    # A failing test: exit 1, which the Jenkinsfile turns into UNSTABLE (not FAILURE).
    assert code == 1, output
    text = JENKINSFILE.read_text()
    assert "if (code == 1) {\n                        unstable(" in text and "error(" in text
    junit_glob = re.search(r"junit\(testResults: '([^']+)'", text)
    archive_glob = re.search(r"archiveArtifacts\(artifacts: '([^']+)'", text)
    assert junit_glob and archive_glob
    found = sorted(workspace.glob(junit_glob.group(1)))
    assert len(found) == 1, (junit_glob.group(1), list(workspace.rglob("*")))
    p = validate(schema, found[0])
    assert p.returncode == 0, p.stderr
    cases = {c.name: c.status for c in junit.parse(found[0])}
    assert any(status == "failed" and "delete a" in name for name, status in cases.items()), cases
    # Ant's "dir/**" (Jenkins) is every file under dir; pathlib's "**" alone yields only directories.
    ant = archive_glob.group(1)
    archived = [f for f in workspace.glob(ant + "/*" if ant.endswith("**") else ant) if f.is_file()]
    names = {f.name for f in archived}
    assert {"report.html", "report.txt", "report.json", "junit.xml", "log.txt"} <= names, names


def test_exit_codes_the_jenkinsfile_relies_on_are_the_nightlys(tmp_path: Path) -> None:
    from gearfarm.formats import exitcode

    assert (exitcode.EXIT_OK, exitcode.EXIT_FAILED, exitcode.EXIT_FARM) == (0, 1, 2)
    for line in ("0  everything passed", "1  a build, test or benchmark failed", "2  the farm itself could not run"):
        assert line in JENKINSFILE.read_text()
    # A farm error really is 2: a config pointing at a gearmand that is not there.
    cfg = tmp_path / "farm.toml"
    cfg.write_text('[gearman]\nservers = ["127.0.0.1:1"]\n[s3]\nendpoint = "http://127.0.0.1:1"\n'
                   f'[farm]\nrepo = "{ROOT}"\nstate_dir = "{tmp_path}/state"\n')
    p = gearfarm("nightly", "--config", str(cfg), "--report-dir", str(tmp_path / "r"), timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
