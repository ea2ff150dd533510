"""The nightly path end to end on real gearmand and real MinIO: `gearfarm nightly` builds the
engine for the host target, stores the artifact, runs the suites, collects and reports."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.db.results import ResultsDB
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.report import joblog
from gearfarm.s3.artifact import unpack
from gearfarm.s3.store import ArtifactStore
from tests.farmkit import commit, gearfarm, keyed, make_repo

TARGET = "linux-x86_64"


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("nightly")
    repo = make_repo(base / "repo")
    state = base / "state"
    yield repo, state
    gearfarm("farm", "stop", "--state-dir", str(state))


def rows(state: Path, run_id: str) -> list[tuple[str, str]]:
    with sqlite3.connect(state / "results.db") as db:
        return sorted(db.execute("SELECT job_id, status FROM jobs WHERE run_id = ?", (run_id,)).fetchall())


def nightly(repo: Path, state: Path, *args: str) -> tuple[int, str]:
    p = gearfarm("nightly", "--repo", str(repo), "--state-dir", str(state), "--targets", TARGET,
                 "--benchmarks", "none", *args)
    return p.returncode, p.stdout + p.stderr


def test_host_nightly_builds_stores_tests_and_reports(farm) -> None:  # type: ignore[no-untyped-def]
    repo, state = farm
    code, out = nightly(repo, state, "--run-id", "n1", "--keep")
    assert code == 0, out
    # Progress names the project of each job (a night of several projects has one build per target each).
    assert re.search(rf"^  engine: {TARGET}:build +passed$", out, re.M), out
    expected = {f"n1:{TARGET}:{s}" for s in ("build", "test-unit", "test-model", "test-recovery")}
    got = rows(state, "n1")
    assert {j for j, _ in got} == expected and len(got) == len(expected)  # exactly one row per job
    assert all(st == "passed" for _, st in got), got

    report = json.loads((state / "runs" / "n1" / "report.json").read_text())
    assert {j["job_id"] for j in report["jobs"]} == expected
    assert report["matrix"][TARGET]["build"]["status"] == "passed"
    assert report["headline"].startswith("all green")
    assert "queue_wait" in report["stage_seconds"] and report["stage_seconds"]["build"] > 0
    # Each job's CPU, its commands' included: the compiler's work is most of a build's.
    db = ResultsDB(f"sqlite:///{state / 'results.db'}")
    cpu = {r.step: r.timings["cpu"] for r in db.jobs("n1")}
    assert cpu["build"] > 0.5 and all(c > 0 for c in cpu.values()), cpu
    html = (state / "runs" / "n1" / "report.html").read_text()
    # Log links point at the copies beside the report, which outlive the farm's MinIO.
    assert f'href="logs/{TARGET}/test-recovery/log.txt"' in html and "X-Amz-Signature" not in html
    assert (state / "runs" / "n1" / "logs" / TARGET / "test-recovery" / "log.txt").stat().st_size > 0

    # The artifact is in S3 with a manifest whose sha256 values match the files.
    cfg = config_mod.load(state / "farm.toml")
    store = ArtifactStore(cfg.s3)
    build = next(j for j in report["jobs"] if j["step"] == "build")
    manifest = json.loads(store.get_bytes(build["artifact_key"].replace("artifact.tar.zst", "manifest.json")))
    assert manifest["target"] == TARGET and manifest["rev"] == build["rev"]
    assert manifest["tools"].startswith("gcc")
    store.get_file(build["artifact_key"], state.parent / "a.tar.gz")
    inner = unpack(state.parent / "a.tar.gz", state.parent / "unpacked", manifest["archive_sha256"])
    assert set(inner["files"]) == {f"engine/build/{TARGET}/{f}" for f in ("gfe", "gfe-suite", "gfe-bench", "libgfe.a")}
    junit = joblog.stream(ResultsDB(cfg.database.url), store, state / "runs" / "n1", "n1", TARGET, "test-unit",
                          "junit.xml")  # carried in its record, or in S3
    assert junit is not None and b"<testcase" in b"".join(junit)
    assert store.exists("runs/n1/report.html")

    # The farm was kept: status shows gearmand's functions with their workers, and the run.
    p = gearfarm("status", "--state-dir", str(state))
    assert p.returncode == 0, p.stderr
    assert "build:linux-x86_64" in p.stdout and "test:linux-x86_64" in p.stdout and "collect" in p.stdout
    assert "n1" in p.stdout and "finished" in p.stdout
    # A cron job with nothing to do says nothing (everything is younger than [retention] days).
    p = gearfarm("store", "prune", "--state-dir", str(state))
    assert (p.returncode, p.stdout, p.stderr) == (0, "", ""), p
    p = gearfarm("farm", "stop", "--state-dir", str(state))
    assert "gearmand" in p.stdout and "minio" in p.stdout


def timed(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    p = gearfarm(*args, timeout=120)
    return p, time.monotonic() - start


def test_the_morning_after_each_command_answers_within_5s_with_one_message(farm) -> None:  # type: ignore[no-untyped-def]
    """The farm of the nightly above has stopped (issue #36): what needs it says so at once,
    once, with how to start it; the report and a test's history come from the database."""
    _, state = farm
    assert not (state / "farm.json").exists()  # stopped: nothing left running
    start = f"start it with './nightly.bash --keep --state-dir {state}'"
    for args, needs in ((("status",), "gearmand at 127.0.0.1:"), (("store", "usage"), "S3 (MinIO) at http://")):
        p, took = timed(*args, "--state-dir", str(state))
        assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1, p
        assert p.stderr.startswith(f"error: the embedded farm in {state} is not running ({needs}"), p.stderr
        assert start in p.stderr, p.stderr
        assert took < 5, f"{' '.join(args)} took {took:.1f}s"
        print(f"{' '.join(args)}: {took:.2f}s: {p.stderr.strip()}")
    p, took = timed("report", "n1", "--state-dir", str(state))
    assert p.returncode == 0 and p.stdout.startswith("engine: all green"), p
    assert "report: " + str(state / "runs" / "n1" / "report.html") in p.stdout
    (note,) = p.stderr.splitlines()
    assert note.startswith("the report links the logs' copies on disk: the embedded farm in") and start in note, note
    assert took < 5, f"report took {took:.1f}s"
    print(f"report n1: {took:.2f}s: {note}")
    p, took = timed("history", "unit/limits_and_bad_arguments", "--state-dir", str(state))
    assert p.returncode == 0 and p.stderr == "" and "n1" in p.stdout and "passed" in p.stdout, p
    assert took < 5, f"history took {took:.1f}s"
    print(f"history: {took:.2f}s")


def test_resubmitting_a_run_adds_nothing_and_same_rev_reuses_the_artifact(farm) -> None:  # type: ignore[no-untyped-def]
    repo, state = farm
    before = rows(state, "n1")
    code, out = nightly(repo, state, "--run-id", "n1")
    assert code == 0, out
    assert "already known" in out
    assert rows(state, "n1") == before

    code, out = nightly(repo, state, "--run-id", "n2", "--suites", "unit")
    assert code == 0, out
    report = json.loads((state / "runs" / "n2" / "report.json").read_text())
    build = next(j for j in report["jobs"] if j["step"] == "build")
    assert build["reused_artifact"] is True and build["bytes_uploaded"] == 0
    assert {j["step"] for j in report["jobs"]} == {"build", "test-unit"}


def test_a_build_that_does_not_compile_is_failed_with_its_error_and_tests_skipped(farm) -> None:  # type: ignore[no-untyped-def]
    repo, state = farm
    src = next((repo / "engine" / "src").glob("*.c"))
    src.write_text(src.read_text() + "\n#error gearfarm-test-broken-build\n")
    rev = commit(repo, "break the build")
    try:
        code, out = nightly(repo, state, "--run-id", "n3")
    finally:
        subprocess_revert(repo)
    assert code == 1, out
    got = dict(rows(state, "n3"))
    assert got.pop(f"n3:{TARGET}:build") == "failed"
    assert set(got.values()) == {"skipped"} and len(got) == 3
    report = json.loads((state / "runs" / "n3" / "report.json").read_text())
    failure = report["failures"][0]
    assert failure["step"] == "build" and "gearfarm-test-broken-build" in failure["log_tail"]
    assert report["rev"] == rev
    assert "gearfarm-test-broken-build" in (state / "runs" / "n3" / "report.html").read_text()


def subprocess_revert(repo: Path) -> None:
    import subprocess

    subprocess.run(["git", "revert", "--no-edit", "HEAD"], cwd=repo, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_unknown_target_or_suite_exits_2_listing_the_known_ones(farm) -> None:  # type: ignore[no-untyped-def]
    repo, state = farm
    p = gearfarm("nightly", "--repo", str(repo), "--state-dir", str(state), "--targets", "plan9-mips")
    assert p.returncode == 2 and "known targets: linux-aarch64, linux-i686, linux-x86_64, windows-x86_64" in p.stderr
    p = gearfarm("nightly", "--repo", str(repo), "--state-dir", str(state), "--suites", "unit,bogus")
    assert p.returncode == 2 and "unknown suite 'bogus'" in p.stderr and "known suites" in p.stderr


def test_unreachable_gearmand_or_minio_exits_2_naming_the_address(tmp_path: Path, farm) -> None:  # type: ignore[no-untyped-def]
    from gearfarm.config import Config, DatabaseConfig, FarmConfig, GearmanConfig, S3Config, dump
    from gearfarm.hosts.net import free_port

    repo, _ = farm
    dead = free_port()
    with MinioServer(tmp_path / "minio") as minio:
        db_url = f"sqlite:///{tmp_path / 'r.db'}"
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{dead}"]), s3=minio.s3_config(),
                     database=DatabaseConfig(url=db_url),
                     farm=FarmConfig(repo=str(repo), state_dir=str(tmp_path), **keyed(tmp_path, db_url)))
        dump(cfg, tmp_path / "lab.toml")
        p = gearfarm("nightly", "--config", str(tmp_path / "lab.toml"), "--targets", TARGET, timeout=120)
        assert p.returncode == 2, p.stderr
        assert f"127.0.0.1:{dead}" in p.stderr and "gearmand is unreachable" in p.stderr
        assert "start gearfarm-gearmand.service" in p.stderr  # and where, as the lab's unit
    cfg.s3 = S3Config(endpoint=f"http://127.0.0.1:{dead}", secret_key="x")
    dump(cfg, tmp_path / "lab.toml")
    p = gearfarm("nightly", "--config", str(tmp_path / "lab.toml"), "--targets", TARGET, timeout=180)
    assert p.returncode == 2, p.stderr
    assert f"http://127.0.0.1:{dead}" in p.stderr and "start MinIO" in p.stderr
