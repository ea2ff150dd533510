"""The OS/arch matrix: every target built by its toolchain into a binary of the right format,
its unit suite passing natively, under qemu-aarch64 or under wine; workers registering only
what they can serve; and a target with no worker ending as "no worker" instead of hanging."""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.gearman import admin
from gearfarm.report import joblog
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3.artifact import unpack
from gearfarm.s3.store import ArtifactStore
from tests.farmkit import gearfarm, make_repo

# (ELF class, ELF machine) per Linux target; 'PE' for Windows.
FORMATS = {"linux-x86_64": (2, 62), "linux-i686": (1, 3), "linux-aarch64": (2, 183), "windows-x86_64": "PE"}


def binary_format(path: Path) -> object:
    data = path.read_bytes()[:4096]
    if data[:4] == b"\x7fELF":
        endian = "<" if data[5] == 1 else ">"
        return data[4], struct.unpack(endian + "H", data[18:20])[0]
    if data[:2] == b"MZ":
        pe = struct.unpack("<I", data[0x3C:0x40])[0]
        assert data[pe:pe + 4] == b"PE\0\0"
        machine = struct.unpack("<H", data[pe + 4:pe + 6])[0]
        assert machine == 0x8664, hex(machine)
        return "PE"
    return None


@pytest.fixture(scope="module")
def matrix_run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("matrix")
    repo = make_repo(base / "repo")
    state = base / "state"
    p = gearfarm("nightly", "--repo", str(repo), "--state-dir", str(state), "--run-id", "m1", "--suites", "unit",
                 "--benchmarks", "none",
                 "--keep", timeout=1500)
    yield repo, state, p
    gearfarm("farm", "stop", "--state-dir", str(state))


def test_all_four_targets_build_and_pass_their_unit_suite(matrix_run) -> None:  # type: ignore[no-untyped-def]
    _, state, p = matrix_run
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads((state / "runs" / "m1" / "report.json").read_text())
    assert set(report["matrix"]) == set(FORMATS)
    for target, cells in report["matrix"].items():
        assert cells["build"]["status"] == "passed", target
        assert cells["test-unit"]["status"] == "passed", target


def test_each_build_yields_a_binary_of_the_right_format(matrix_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, state, _ = matrix_run
    store = ArtifactStore(config_mod.load(state / "farm.toml").s3)
    report = json.loads((state / "runs" / "m1" / "report.json").read_text())
    for job in report["jobs"]:
        if job["step"] != "build":
            continue
        target = job["target"]
        store.get_file(job["artifact_key"], tmp_path / f"{target}.tar.gz")
        manifest = unpack(tmp_path / f"{target}.tar.gz", tmp_path / target, job["artifact_sha256"])
        exe = ".exe" if target.startswith("windows") else ""
        assert binary_format(tmp_path / target / "engine" / "build" / target / f"gfe-suite{exe}") == \
            FORMATS[target], target
        cc = catalog_mod.load_file(Path(__file__).resolve().parents[2] / "jobs" / "catalog.toml").target(target).cc
        assert cc and manifest["tools"].split()[0].startswith(cc)


def test_emulated_suites_ran_through_their_runner(matrix_run) -> None:  # type: ignore[no-untyped-def]
    _, state, _ = matrix_run
    cfg = config_mod.load(state / "farm.toml")
    store, db = ArtifactStore(cfg.s3), ResultsDB(cfg.database.url)

    def log(target: str) -> str:  # where the farm's readers find it: carried in its record, or in S3
        chunks = joblog.stream(db, store, cfg.runs_dir() / "m1", "m1", target, "test-unit")
        assert chunks is not None, target
        return b"".join(chunks).decode()

    aarch64, windows = log("linux-aarch64"), log("windows-x86_64")
    assert "$ qemu-aarch64 " in aarch64
    assert "$ wine " in windows and "gfe-suite.exe unit" in windows


def test_a_worker_serves_only_its_target_and_an_unserved_target_ends_as_no_worker(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    farm = EmbeddedFarm(tmp_path / "state", repo)
    cat = catalog_mod.load_file(repo / "jobs" / "catalog.toml")
    try:
        cfg = farm.start(cat, ["linux-aarch64"])
        host, port = cfg.gearman.addresses()[0]
        registered = {f for w in admin.workers(host, port) for f in w.functions}
        assert registered == {"collect", "build:linux-aarch64", "test:linux-aarch64"}
        p = gearfarm("nightly", "--config", str(farm.config_path), "--targets", "linux-aarch64,linux-x86_64",
                     "--suites", "unit", "--benchmarks", "none", "--run-id", "r1", "--no-worker-wait", "3", timeout=600)
        assert p.returncode == 1, p.stdout + p.stderr
        assert "no worker registered for build:linux-x86_64" in p.stderr
        with sqlite3.connect(tmp_path / "state" / "results.db") as db:
            rows = dict(db.execute("SELECT job_id, status FROM jobs").fetchall())
            workers = dict(db.execute("SELECT job_id, worker FROM jobs").fetchall())
        assert rows == {"r1:linux-aarch64:build": "passed", "r1:linux-aarch64:test-unit": "passed",
                        "r1:linux-x86_64:build": "no_worker", "r1:linux-x86_64:test-unit": "skipped"}
        assert "-build-" in workers["r1:linux-aarch64:build"]
        # The x86_64 job was never handed to the aarch64 worker: gearmand still holds it.
        assert admin.status(host, port)["build:linux-x86_64"].queued == 1
    finally:
        farm.stop()


def test_a_worker_asked_for_a_target_it_cannot_serve_fails_at_start(tmp_path: Path) -> None:
    """The worker has no repository: it learns the projects' targets from their newest catalogs
    in S3 (stored by the nightly), and refuses at start a target this host cannot serve."""
    from gearfarm.hosts.minio_server import MinioServer
    from gearfarm.run import snapshot

    repo = make_repo(tmp_path / "repo")
    text = (repo / "jobs" / "catalog.toml").read_text() + """
[targets.linux-mips]
tools = ["mips-linux-gnu-gcc", "make"]
vars = { cc = "mips-linux-gnu-gcc", ar = "mips-linux-gnu-ar", static = "1" }
runner = ["qemu-mips"]
suites = ["unit"]
"""
    with MinioServer(tmp_path / "minio") as minio:
        cfg = config_mod.Config(s3=minio.s3_config(), farm=config_mod.FarmConfig(repo=str(tmp_path / "none")))
        store = ArtifactStore(cfg.s3)
        sha, _ = snapshot.publish_catalog(store, text)
        snapshot.publish_latest(store, "engine", "a" * 40, sha)
        cfg_path = tmp_path / "lab.toml"
        config_mod.dump(cfg, cfg_path)
        p = gearfarm("worker", "--role", "build", "--targets", "linux-mips", "--config", str(cfg_path), timeout=60)
        assert p.returncode == 2, p.stdout + p.stderr
        assert "cannot serve build for linux-mips: mips-linux-gnu-gcc not found" in p.stderr
        p = gearfarm("worker", "--role", "test", "--targets", "linux-x86_64,nosuch", "--config", str(cfg_path))
        assert p.returncode == 2 and "'nosuch' is not a target name" in p.stderr
