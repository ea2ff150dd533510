"""Jenkins (issue #15, issue #36): the JUnit XML the farm writes loads in Jenkins, and the
pipeline in docker/jenkins/Jenkinsfile asks the nightly for what it really produces: its stages,
its time limits against the run's deadline, a JUnit report that must be there, and the build's
description naming the gearfarm runs (Jenkins itself cannot be installed here: the Jenkinsfile
is read as text).

The schema is the one Jenkins' xUnit plugin validates JUnit files against (junit-10.xsd),
fetched by `make setup` from pytest's source release on PyPI (pytest validates its own JUnit
output with it); the validator is libxml2's xmllint, not code of ours.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from gearfarm.config import ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.result import CaseResult, ResultRecord
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.step import junit
from tests import projects
from tests.farmkit import ROOT, gearfarm

JENKINSFILE = ROOT / "docker" / "jenkins" / "Jenkinsfile"


def nightly_flags(text: str) -> list[str]:
    """The Jenkinsfile's fixed arguments of the nightly: its `def args = [...]` and the
    `--deadline` it adds, computed from its own constant."""
    args = re.search(r"def args = \[(.*?)\]", text)
    assert args, "the Jenkinsfile's nightly arguments moved"
    deadline = re.search(r"args \+= \['--deadline', \((\w+) \* 3600\)\.toString\(\)\]", text)
    assert deadline, "the Jenkinsfile no longer passes --deadline from its constant"
    return [*re.findall(r"'([^']*)'", args.group(1)), "--deadline", str(constants(text)[deadline.group(1)] * 3600)]


def constants(text: str) -> dict[str, int]:
    """The Jenkinsfile's top-level `def NAME = <int>` constants."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^def ([A-Z_]+) = (\d+)\b", text, re.M)}


def hours(expr: str, consts: dict[str, int]) -> int:
    """A timeout's `time:` expression (constants and integers added up) in hours."""
    return sum(int(t) if t.strip().isdigit() else consts[t.strip()] for t in expr.split("+"))


def stages(text: str) -> dict[str, str]:
    """Each stage's name and its text (up to the next stage, or to `post` after the last)."""
    body = text[text.index("stages {"):text.index("\n    post {")]
    parts = re.split(r"stage\('([^']+)'\)", body)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


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
    flags = nightly_flags(JENKINSFILE.read_text())
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
    assert "if (nightlyExit == 1) {\n                            unstable(" in text and "error(" in text
    junit_glob = re.search(r"junit\(testResults: '([^']+)'", text)
    archive_glob = re.search(r"archiveArtifacts\(artifacts: '([^']+)'", text)
    assert junit_glob and archive_glob
    found = sorted(workspace.glob(junit_glob.group(1)))
    assert len(found) == 1, (junit_glob.group(1), list(workspace.rglob("*")))
    p = validate(schema, found[0])
    assert p.returncode == 0, p.stderr
    cases = {c.name: c.status for c in junit.parse(found[0])}
    assert any(status == "failed" and "delete a" in name for name, status in cases.items()), cases
    # Ant's patterns, comma-separated; "dir/**" (Jenkins) is every file under dir, while
    # pathlib's "**" alone yields only directories.
    patterns = archive_glob.group(1).split(", ")
    archived = [f for ant in patterns for f in workspace.glob(ant + "/*" if ant.endswith("**") else ant)
                if f.is_file()]
    names = {f.name for f in archived}
    assert {"report.html", "report.txt", "report.json", "junit.xml", "log.txt"} <= names, names
    # The run id file the build's description is made from: the run, its project, and no
    # dashboard link on a farm without [web] url (the description then links the archived report).
    runs_file = re.search(r"'--run-id-file', '([^']+)'", text)
    assert runs_file and runs_file.group(1) in names, "the run id file is not archived"
    lines = (workspace / runs_file.group(1)).read_text().splitlines()
    assert [line.split("\t") for line in lines] == [[found[0].parent.name, "tapkv", ""]], lines


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


def test_the_jenkinsfile_has_setup_nightly_and_report_stages() -> None:
    text = JENKINSFILE.read_text()
    st = stages(text)
    assert list(st) == ["Setup", "Nightly", "Report"]
    # Setup installs the nightly host's role only, and clears the last build's files first.
    assert "sh 'make setup-nightly'" in st["Setup"]
    assert "rm -rf gearfarm-reports gearfarm-runs.tsv" in st["Setup"]
    # The Makefile has that target: its own, or setup-ROLE for each of its ROLES.
    makefile = (ROOT / "Makefile").read_text()
    roles = re.search(r"^ROLES := (.*)$", makefile, re.M)
    assert re.search(r"^setup-nightly:", makefile, re.M) or (
        re.search(r"^setup-%:", makefile, re.M) and roles and "nightly" in roles.group(1).split()), "no setup-nightly"
    assert "./nightly.bash " in st["Nightly"] and "nightlyExit = sh(returnStatus: true" in st["Nightly"]
    # The result is decided in Report, after the JUnit: a failed nightly still publishes its tests.
    report = st["Report"]
    assert report.index("junit(") < report.index("unstable(") < report.index("error(")


def test_a_missing_junit_report_fails_the_build() -> None:
    text = JENKINSFILE.read_text()
    assert "allowEmptyResults" not in text
    junit_calls = re.findall(r"junit\((.*)\)", text)
    assert junit_calls == ["testResults: 'gearfarm-reports/*/junit.xml', skipPublishingChecks: true"], junit_calls


def test_the_jenkinsfile_timeouts_come_from_the_run_deadline() -> None:
    text = JENKINSFILE.read_text()
    consts = constants(text)
    example = tomllib.loads((ROOT / "docs" / "farm.example.toml").read_text())
    deadline = example["farm"]["run_deadline"]
    # The nightly gets the example config's deadline (so Jenkins never cuts a run that would
    # have ended by itself), from the same constant the time limits are made of.
    assert nightly_flags(text)[-2:] == ["--deadline", str(deadline)]
    assert consts["RUN_DEADLINE_HOURS"] * 3600 == deadline
    timeouts = {name: hours(m.group(1), consts) for name, body in stages(text).items()
                if (m := re.search(r"timeout\(time: ([^,]+), unit: 'HOURS'\)", body))}
    whole = re.search(r"options \{\n.*?timeout\(time: ([^,]+), unit: 'HOURS'\)", text, re.S)
    assert whole and set(timeouts) == {"Setup", "Nightly", "Report"}, timeouts
    total = hours(whole.group(1), consts)
    # The whole build: the deadline plus the setup allowance at least, and no stage's limit cut
    # short by it.
    assert total * 3600 >= deadline + timeouts["Setup"] * 3600 and timeouts["Setup"] >= 1
    assert total == sum(timeouts.values()), (total, timeouts)
    # The nightly's own stage outlasts the deadline by the report and the bisection's budget.
    bisect_hours = example["bisect"]["hours"]
    assert timeouts["Nightly"] * 3600 >= deadline + bisect_hours * 3600, timeouts


def test_the_build_description_names_the_runs_and_the_dashboard() -> None:
    text = JENKINSFILE.read_text()
    runs_file = re.search(r"'--run-id-file', '([^']+)'", text)
    assert runs_file, "the nightly is not asked for its run ids"
    describe = text[text.index("def describeRuns("):text.index("\npipeline {")]
    # Read from the file the nightly writes (id, project, dashboard link; tab-separated), and
    # linked to the archived report when the farm has no dashboard.
    assert f"readFile('{runs_file.group(1)}')" in describe and "split('\\t', -1)" in describe
    assert "currentBuild.description = " in describe and "artifact/gearfarm-reports/${f[0]}/report.html" in describe
    # Set in Report, and on an aborted build (a timeout) too.
    assert "describeRuns(nightlyExit)" in stages(text)["Report"]
    assert re.search(r"aborted \{\n.*\n.*describeRuns\(nightlyExit\)", text)


def test_the_run_id_file_names_each_run_and_its_dashboard_page(tmp_path: Path) -> None:
    """`gearfarm nightly --run-id-file` as Jenkins reads it: with [web] url, each run's line
    links its page on the dashboard (a farm without gearmand fails after submitting nothing)."""
    from gearfarm.cli.nightly_cmd import _ConsoleObserver

    out = tmp_path / "runs.tsv"
    observer = _ConsoleObserver(out, "https://farm.lab/")
    for run_id, project in (("20260101-020000-engine-abc", "engine"), ("20260101-020000-tools-def", "tools")):
        # What the observer reads of a submitted run's plan.
        observer.submitted(SimpleNamespace(run_id=run_id, project=project, rev="a" * 40,  # type: ignore[arg-type]
                                           targets=["linux-x86_64"], expected=[]), True)
    assert out.read_text().splitlines() == [
        "20260101-020000-engine-abc\tengine\thttps://farm.lab/run/20260101-020000-engine-abc",
        "20260101-020000-tools-def\ttools\thttps://farm.lab/run/20260101-020000-tools-def"]
    # A new nightly empties it first, even one that then fails before submitting anything.
    cfg = tmp_path / "farm.toml"
    cfg.write_text('[gearman]\nservers = ["127.0.0.1:1"]\n[s3]\nendpoint = "http://127.0.0.1:1"\n'
                   f'[farm]\nrepo = "{ROOT}"\nstate_dir = "{tmp_path}/state"\n')
    p = gearfarm("nightly", "--config", str(cfg), "--run-id-file", str(out), timeout=120)
    assert p.returncode == 2 and out.read_text() == "", p.stdout + p.stderr
