"""A job's files in S3 are bound to its signed record (issue #76, case 8). A test host's S3 keys
can write its role's keys of every run (no static policy knows which jobs are a host's now:
docs/security.md, "Files in S3"), so the record names each file's sha256 and size, and every
reader checks them: the dashboard's raw log and step pages and the report's copies on disk refuse
a file that was changed after the job, and say so, rather than serving it as the job's.

A real embedded farm runs a night of a project whose suite prints 300 KB (over the 48 KiB a
record carries, so its log and its JUnit file go to S3); then, with the test role's own MinIO
keys, the log and the JUnit file of that finished, passed job are rewritten in S3."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.report import joblog
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3.store import ArtifactStore
from gearfarm.web.app import create_app
from tests.farmkit import gearfarm
from tests.projects import _init

T = "linux-x86_64"
# 225,000 random bytes in base64: 300 KB that do not compress, far over what a record carries.
BIG = """head -c 225000 /dev/urandom | base64
echo the-genuine-last-line
{ echo '<testsuite name="big"><testcase classname="big" name="c1"><system-out>'
  head -c 90000 /dev/urandom | base64
  echo '</system-out></testcase></testsuite>'; } > "$1"
"""
CATALOG = """schema = 2

[build]
argv = ["true"]
outputs = ["big.sh"]
timeout = 120

[suites.big]
description = "300 KB of log and a 120 KB JUnit file"
argv = ["sh", "{root}/big.sh", "{junit}"]
format = "junit"
timeout = 300

[suites.small]
description = "a line of log, carried in its record"
argv = ["sh", "-c", "echo small-and-carried"]
format = "exit-code"
timeout = 60

[targets.linux-x86_64]
tools = ["sh", "head", "base64"]
suites = ["big", "small"]
"""
FORGED = b"All 1,024 tests passed. Nothing to see here.\n" * 7000  # 300 KB too


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("binding")
    repo, state = base / "victim", base / "state"
    (base / "no-repo").mkdir()
    repo.mkdir()
    _init(repo, {"jobs/catalog.toml": CATALOG, "big.sh": BIG})
    farm = EmbeddedFarm(state, base / "no-repo", projects=[ProjectConfig(name="victim", repo=str(repo))], slots=1)
    try:
        farm.start(catalog_mod.parse(CATALOG, "victim"))
        p = gearfarm("nightly", "--config", str(farm.config_path), "--benchmarks", "none", timeout=900)
        cfg = config_mod.load(farm.config_path)
        run_dir = next(d for d in (state / "runs").iterdir() if d.is_dir() and not d.name.endswith(".rerun"))
        yield {"p": p, "cfg": cfg, "db": ResultsDB(cfg.database.url), "run_dir": run_dir}
    finally:
        farm.stop()


def test_a_log_rewritten_in_s3_with_the_test_roles_keys_is_refused_and_said_so(night: dict[str, Any]) -> None:
    p, cfg, db, run_dir = night["p"], night["cfg"], night["db"], night["run_dir"]
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run_id = run_dir.name
    big = next(r for r in db.jobs(run_id) if r.step == "test-big")
    assert big.status == "passed", big.message
    assert db.job_files([big.job_id])[big.job_id].carried == {}  # its files are in S3, not carried
    farm_store = ArtifactStore(cfg.s3)
    genuine = farm_store.get_bytes(big.log_key)  # type: ignore[arg-type]
    assert len(genuine) > 290_000 and b"the-genuine-last-line" in genuine
    assert (big.file_sums["log.txt"].size, big.file_sums["log.txt"].sha256) == \
        (len(genuine), hashlib.sha256(genuine).hexdigest())
    client = create_app(cfg, db).test_client()
    raw = f"/run/{run_id}/log/{T}/test-big"
    page = f"/run/{run_id}/step/{T}/test-big"
    assert client.get(raw).data == genuine  # before: the job's own log, served

    # The attack: the test role's own keys (every test host has them) rewrite the finished job's
    # log and JUnit file.
    attacker = ArtifactStore(cfg.s3.for_role("test"), retry_for=0, attempts=1)
    assert attacker.cfg.access_key != cfg.s3.access_key
    attacker.put_bytes(big.log_key, FORGED, "text/plain")  # type: ignore[arg-type]
    attacker.put_bytes(big.junit_key, b"<testsuite name='big'/>", "application/xml")  # type: ignore[arg-type]

    said = "does not match the sha256 its signed record gives"
    resp = client.get(raw)
    body = resp.get_data(as_text=True)
    assert b"Nothing to see here" not in resp.data, (
        f"the dashboard's raw log page served the forged log as the job's (HTTP {resp.status_code}, "
        f"{len(resp.data)} bytes: {body[:120]!r})")
    assert resp.status_code == 409 and said in body and "not shown" in body, body[:500]
    resp = client.get(f"{raw}?file=junit.xml")
    assert resp.status_code == 409 and said in resp.get_data(as_text=True), resp.data[:300]
    html = client.get(page).get_data(as_text=True)
    assert "Nothing to see here" not in html, "the step page showed the forged log as the job's"
    assert said in html and "passed" in html  # the record's own status is still shown
    # The innocent job beside it, whose log its record carried, is shown as ever.
    small = client.get(f"/run/{run_id}/step/{T}/test-small").get_data(as_text=True)
    assert "small-and-carried" in small and "log-unchecked" not in small  # checked against its record

    # The report's copy on disk, made again from the store: it says so in place of the log, and
    # the copy is counted among the problems.
    runs = run_dir.parent
    copy = run_dir / joblog.relative(T, "test-big")
    copy.unlink()
    problems = joblog.copy_all(farm_store, db, db.jobs(run_id, cases=False), runs)
    text = copy.read_text()
    assert "Nothing to see here" not in text and said in text, text[:300]
    assert any("test-big log.txt" in p and said in p for p in problems), problems
    # With the store away, the dashboard reads that copy on disk: it too is refused, saying so.
    with pytest.raises(joblog.Altered, match=said):
        joblog.stream(db, None, run_dir, run_id, T, "test-big", "log.txt")


def test_a_build_replaced_in_s3_is_not_downloaded_as_the_job_s(night: dict[str, Any]) -> None:
    """The dashboard's download of a build checks the sha256 its record gives (the archive's
    own replacement, with the build role's keys, is the farm's case 10: here only the download)."""
    cfg, db, run_dir = night["cfg"], night["db"], night["run_dir"]
    build = next(r for r in db.jobs(run_dir.name) if r.step == "build")
    assert build.status == "passed" and build.artifact_key and build.artifact_sha256
    web = cfg.model_copy(update={"web": cfg.web.model_copy(update={"public_artifacts": True})})
    client = create_app(web, db).test_client()
    url = f"/run/{run_dir.name}/artifact/{T}/build"
    genuine = client.get(url)
    assert genuine.status_code == 200 and hashlib.sha256(genuine.data).hexdigest() == build.artifact_sha256
    ArtifactStore(cfg.s3.for_role("build"), retry_for=0, attempts=1).put_bytes(build.artifact_key, b"a replaced build")
    resp = client.get(url)
    assert b"a replaced build" not in resp.data, "the dashboard handed out the replaced build as the job's"
    assert resp.status_code == 409 and b"does not match the sha256 its signed record gives" in resp.data
