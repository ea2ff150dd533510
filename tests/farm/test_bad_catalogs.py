"""One project's bad catalog costs that project only (issue #76, case 4). One night of the
engine beside three projects whose commits broke their catalogs: an array nested 5,000 deep
(which made the whole nightly die of a RecursionError, exit 1, nothing submitted for anyone),
an env that sets WINEPREFIX (refused, rightly, but it stopped every other project's night), and a
suite timeout of a year (above `[farm] max_timeout`); and two more, one whose repository cannot
be fetched and one whose source snapshot cannot be made (a submodule nobody can fetch). Real
gearmand, MinIO, workers and collector on the embedded farm: the engine's jobs all run and
pass; each bad project has its run recorded and closed as failed, with its error, in the report
(HTML, JSON, text, JUnit) and in the mail; the nightly exits 1 (a project failed), with no
traceback. A worker stricter than its nightly refuses the catalog for that job only."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from email import policy
from email.parser import BytesParser
from pathlib import Path

import pytest
from markupsafe import escape

from tests.farm.test_jenkins import schema, validate  # noqa: F401 (schema: a fixture)
from tests.farm.test_projects_file import nightly_bash
from tests.farmkit import GIT, ROOT, gearfarm, make_repo
from tests.projects import _init

PROJECTS_TOML = """# The engine, three projects whose catalogs cannot run, one whose repository cannot be
# fetched and one whose source snapshot cannot be made.
[[projects]]
name = "engine"
repo = "engine"

[[projects]]
name = "gone"
repo = "file:///nonexistent/gearfarm-test/gone.git"

[[projects]]
name = "broken"
repo = "broken"

[[projects]]
name = "deep"
repo = "deep"

[[projects]]
name = "wine"
repo = "wine"

[[projects]]
name = "forever"
repo = "forever"

[farm]
slots = 2
"""

BASE = """schema = 2

[build]
argv = ["sh", "-c", "echo built > out.txt"]
outputs = ["out.txt"]

[suites.unit]
argv = ["sh", "-c", "exit 0"]
format = "exit-code"
{suite}

[targets.linux-x86_64]
tools = ["sh"]
suites = ["unit"]
"""

BAD = {
    "deep": "deep = " + "[" * 5000 + "]" * 5000 + "\n" + BASE.format(suite=""),
    "wine": BASE.format(suite='env = { WINEPREFIX = "/home" }'),
    "forever": BASE.format(suite="timeout = 31536000"),
}
SAID = {
    "deep": "deep@{rev}:jobs/catalog.toml: arrays or tables nested too deeply to read",
    "wine": "[suites.unit] env.WINEPREFIX: WINEPREFIX is set by the worker for every job",
    "forever": "[suites.unit.timeout] 31536000 s is above the farm's limit, [farm] max_timeout = 21600 s: set "
               "suites.unit.timeout to 21600 or less",
}


# Why the two other projects do not run (their revision is unknown to the test: none, or the
# snapshot's).
OTHERS = {
    "gone": "project gone: cannot clone file:///nonexistent/gearfarm-test/gone.git",
    "broken": "project broken: cannot make the source snapshot of {rev}: submodule lib (../nowhere.git",
}


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, dict[str, str]]:
    top = tmp_path_factory.mktemp("badcat")
    make_repo(top / "engine")
    revs = {name: _init(top / name, {"jobs/catalog.toml": text}) for name, text in BAD.items()}
    _init(top / "broken", {"jobs/catalog.toml": BASE.format(suite=""),
                           ".gitmodules": '[submodule "lib"]\n\tpath = lib\n\turl = ../nowhere.git\n'})
    for args in (["update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},lib"],
                 ["commit", "-q", "-m", "a submodule nobody can fetch"]):
        subprocess.run(GIT + args, cwd=top / "broken", check=True)
    revs["broken"] = subprocess.run(GIT + ["rev-parse", "HEAD"], cwd=top / "broken", check=True, text=True,
                                    capture_output=True).stdout.strip()
    (top / "projects.toml").write_text(PROJECTS_TOML)
    p = nightly_bash("--projects", str(top / "projects.toml"), "--state-dir", str(top / "state"),
                     "--targets", "linux-x86_64", "--benchmarks", "none", cwd=ROOT)
    return top / "state", p, revs


def _runs(state: Path) -> dict[str, tuple[str, str, dict]]:
    with sqlite3.connect(state / "results.db") as db:
        return {project: (run_id, st, json.loads(notes)) for run_id, project, st, notes in
                db.execute("SELECT run_id, project, state, notes FROM runs WHERE parent_run_id IS NULL")}


def _said(revs: dict[str, str]) -> dict[str, str]:
    return {name: text.format(rev=revs.get(name, "")[:12]) for name, text in {**SAID, **OTHERS}.items()}


def test_bad_projects_fail_their_own_nights_and_the_engine_passes(night) -> None:  # type: ignore[no-untyped-def]
    state, p, revs = night
    out = p.stdout + p.stderr
    # Exit 1 (a project failed; 2 is the farm's own trouble), said, with no traceback.
    assert p.returncode == 1, out[-6000:]
    assert "Traceback" not in out and "RecursionError" not in out, out[-6000:]
    runs = _runs(state)
    assert sorted(runs) == ["broken", "deep", "engine", "forever", "gone", "wine"], runs
    # The engine's jobs all ran and passed.
    run_id, st, _ = runs["engine"]
    assert st == "finished"
    with sqlite3.connect(state / "results.db") as db:
        jobs = dict(db.execute("SELECT job_id, status FROM jobs WHERE run_id = ?", (run_id,)))
    assert set(jobs.values()) == {"passed"}, jobs
    assert {j.split(":", 1)[1] for j in jobs} == {f"linux-x86_64:{s}" for s in
                                                   ("build", "test-unit", "test-model", "test-recovery")}, jobs
    # Each bad project: its run recorded and closed as failed, with the error and its fix.
    for name, said in _said(revs).items():
        run_id, st, notes = runs[name]
        assert st == "failed", (name, st)
        assert said in notes["error"], (name, notes)
        assert f"project {name} does not run tonight" in p.stderr, p.stderr[-4000:]
        with sqlite3.connect(state / "results.db") as db:
            assert db.execute("SELECT COUNT(*) FROM jobs WHERE run_id = ?", (run_id,)).fetchone()[0] == 0


def test_each_bad_project_has_its_error_in_every_report_and_the_mail(  # type: ignore[no-untyped-def]
        night, schema: Path) -> None:  # noqa: F811 (the schema fixture)
    state, p, revs = night
    runs = _runs(state)
    for name, said in _said(revs).items():
        out = state / "runs" / runs[name][0]
        report = json.loads((out / "report.json").read_text())
        assert said in report["not_run"] and not report["all_green"], report
        assert report["headline"].startswith("could not run: project " + name), report["headline"]
        html = (out / "report.html").read_text()
        assert "Not run tonight" in html and str(escape(said)) in html, html[:3000]
        text = (out / "report.txt").read_text()
        assert "NOT RUN TONIGHT" in text and said in text, text[:3000]
        junit = (out / "junit.xml").read_text()
        assert 'type="not_run"' in junit and f'classname="{name}"' in junit, junit
        checked = validate(schema, out / "junit.xml")  # as Jenkins' xUnit plugin reads it
        assert checked.returncode == 0, checked.stderr
        # Printed with the night's reports too.
        assert f"{name}: could not run: project {name}" in p.stdout
    innocent = json.loads((state / "runs" / runs["engine"][0] / "report.json").read_text())
    assert innocent["all_green"] and "not_run" not in innocent, innocent["headline"]
    # One mail for the night, beside the first run's report: every project's section in it.
    (eml,) = list((state / "runs").glob("*/report.eml"))
    msg = BytesParser(policy=policy.default).parsebytes(eml.read_bytes())
    subject = str(msg["subject"])
    for name in _said(revs):
        assert f"{name} could not run" in subject, subject
    assert "engine passed" in subject and len(subject) < 200, subject
    body = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    for said in _said(revs).values():
        assert said in body, body[:4000]


def test_the_dashboard_shows_each_project_that_could_not_run_with_its_error(night) -> None:  # type: ignore[no-untyped-def]
    from gearfarm.config import Config, DatabaseConfig, FarmConfig, S3Config
    from gearfarm.hosts.net import free_port
    from gearfarm.web.app import create_app

    state, _, revs = night
    url = f"sqlite:///{state / 'results.db'}"
    cfg = Config(database=DatabaseConfig(url=url), s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"),
                 farm=FarmConfig(state_dir=str(state)))
    client = create_app(cfg).test_client()
    front = client.get("/")
    assert front.status_code == 200
    for name, said in _said(revs).items():
        run_id = _runs(state)[name][0]
        assert run_id in front.get_data(as_text=True)
        page = client.get(f"/run/{run_id}")
        assert page.status_code == 200, page.get_data(as_text=True)[:2000]
        html = page.get_data(as_text=True)
        assert "Not run tonight" in html and str(escape(said)) in html, html[:3000]
        api = client.get(f"/api/run/{run_id}").get_json()
        assert said in api["not_run"] and api["state"] == "failed", api


STRICT = BASE.format(suite="timeout = 200").replace('outputs = ["out.txt"]', 'outputs = ["out.txt"]\ntimeout = 60')
FINE = BASE.format(suite="timeout = 30").replace('outputs = ["out.txt"]', 'outputs = ["out.txt"]\ntimeout = 60')


def test_a_worker_stricter_than_the_nightly_refuses_the_catalog_and_its_slot_goes_on(tmp_path: Path) -> None:
    """A lab's worker host may be stricter than its nightly's host: the catalog passed the
    nightly (max_timeout 6 h) but not the worker (100 s). The job ends `infra` saying why, the
    slot (one) takes the next night's job of another project, which passes."""
    from gearfarm import config as config_mod
    from gearfarm.config import EmbeddedSettings, ProjectConfig
    from gearfarm.formats import catalog as catalog_mod
    from gearfarm.run.farm import EmbeddedFarm

    for name, text in (("strict", STRICT), ("fine", FINE)):
        _init(tmp_path / name, {"jobs/catalog.toml": text})
    state = tmp_path / "state"
    farm = EmbeddedFarm(state, tmp_path / "no-repo", slots=1, settings=EmbeddedSettings(max_timeout=100),
                        projects=[ProjectConfig(name=n, repo=str(tmp_path / n)) for n in ("strict", "fine")])
    try:
        cfg = farm.start(catalog_mod.parse(FINE, "fine"))
        assert cfg.farm.max_timeout == 100  # the workers' config
        lax = cfg.model_copy(deep=True)
        lax.farm.max_timeout = 21600
        config_mod.dump(lax, tmp_path / "nightly.toml")
        (tmp_path / "nightly.toml").chmod(0o600)
        args = ("nightly", "--config", str(tmp_path / "nightly.toml"), "--benchmarks", "none")
        strict = gearfarm(*args, "--project", "strict", timeout=600)
        fine = gearfarm(*args, "--project", "fine", timeout=600)
    finally:
        farm.stop()
    assert strict.returncode == 1, strict.stdout[-3000:] + strict.stderr[-3000:]
    assert "Traceback" not in strict.stdout + strict.stderr
    with sqlite3.connect(state / "results.db") as db:
        rows = {(project, job_id.split(":", 1)[1]): (status, json.loads(rec)["message"])
                for project, job_id, status, rec in
                db.execute("SELECT r.project, j.job_id, j.status, j.record FROM jobs j JOIN runs r USING (run_id)")}
    status, message = rows["strict", "linux-x86_64:build"]
    assert status == "infra", rows
    assert message.startswith("catalog refused on this worker: catalogs/") and \
        "[suites.unit.timeout] 200 s is above the farm's limit, [farm] max_timeout = 100 s" in message, message
    assert rows["strict", "linux-x86_64:test-unit"][0] == "skipped", rows
    # The same (only) slot ran the next night's jobs.
    assert fine.returncode == 0, fine.stdout[-3000:] + fine.stderr[-3000:]
    assert rows["fine", "linux-x86_64:build"][0] == "passed" and rows["fine", "linux-x86_64:test-unit"][0] == "passed"
