"""The compose lab (issue #15, docker/compose.yaml and docker/lab.py): the images are built with
podman, the lab comes up (two gearmand behind mutual-TLS stunnel, four MinIO nodes in one
erasure set over HTTPS, PostgreSQL with client certificates, the collector and build, test and
perf workers each in its own container), and `./nightly.bash --config <the lab's config>` runs
green from the container host. Then a second nightly loses one gearmand and one MinIO node in
its middle and must still end green with every job's result and every artifact there.

Slow (the images take about 2 minutes cold, the lab about 40 s to come up, each nightly a few
minutes on 2 cores); skipped, saying why, where podman cannot run a container.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.db.results import ResultsDB
from gearfarm.gearman import admin
from gearfarm.hosts.connection import ssl_context
from gearfarm.s3.store import ArtifactStore
from tests.farmkit import ROOT, make_repo

sys.path.insert(0, str(ROOT / "docker"))
import lab  # noqa: E402  (docker/lab.py: the lab's own tool, not a package module)

pytestmark = pytest.mark.slow
TARGETS = ["linux-x86_64", "linux-i686", "linux-aarch64"]
ENV = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "docker" / "containers.conf"))}


def _podman_works() -> str | None:
    """Why podman cannot run the lab here, or None."""
    for tool in ("podman", "podman-compose", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make setup installs podman, runc, podman-compose and debootstrap)"
    return None


@pytest.fixture(scope="module")
def images() -> None:
    why = _podman_works()
    if why:
        pytest.skip(why)
    t0 = time.monotonic()
    out = subprocess.run(["make", "-s", "images"], cwd=ROOT, env=ENV, capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout)[-3000:]
        if "OCI permission denied" in tail or "cannot set up namespace" in tail:
            pytest.skip(f"podman cannot start containers on this machine: {tail.strip().splitlines()[-1]}")
        pytest.fail(f"make images failed ({out.returncode}):\n{tail}")
    print(f"make images: {time.monotonic() - t0:.1f}s\n{out.stdout}")


@pytest.fixture(scope="module")
def the_lab(images: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("lab")
    repo = make_repo(tmp / "engine")
    where = tmp / "lab"
    lab.init(where, str(repo), ",".join(TARGETS), "linux-x86_64")
    t0 = time.monotonic()
    try:
        lab.up(where)
        print(f"lab up: {time.monotonic() - t0:.1f}s")
        yield where
    finally:
        for service in (*lab.SERVERS, *(h for h, _ in lab.HOSTS)):
            logs = lab.compose(where, "logs", service, check=False)
            (tmp / f"{service}.log").write_text(logs.stdout + logs.stderr)
        lab.down(where)


def _nightly(where: Path, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(ROOT / "nightly.bash"), "--config", str(where / "hosts" / "nightly" / "farm.toml"),
                             "--run-id", run_id, "--report-dir", str(where / "reports")],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen[str], timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"the lab's nightly exited {proc.returncode}:\n{out[-6000:]}"
    return out


def _check_run(where: Path, run_id: str) -> None:
    """Every job the run expected has a passed result, and every build's artifact is in S3 with
    the sha256 its record names."""
    cfg = lab.nightly_config(where)
    db = ResultsDB(cfg.database.url)
    run = db.get_run(run_id)
    assert run is not None and run.state == "finished", run
    results = {str(r.job_id): r for r in db.jobs(run_id)}
    assert sorted(results) == sorted(run.expected), "a job of the run has no result"
    bad = {j: r.status for j, r in results.items() if r.status != "passed"}
    assert not bad, bad
    assert sorted(run.targets) == sorted(TARGETS)
    store = ArtifactStore(cfg.s3, retry_for=30)
    builds = [r for r in results.values() if r.kind == "build"]
    assert sorted(r.target for r in builds) == sorted(TARGETS)
    for r in builds:
        assert r.artifact_key and store.exists(r.artifact_key), f"{r.target}: artifact {r.artifact_key} is missing"
    report = (where / "reports" / run_id / "report.txt").read_text()
    for t in TARGETS:
        assert t in report, f"the report does not list {t}:\n{report}"


@pytest.mark.timeout(1800)  # the first test also builds the images (minutes on a new machine)
def test_a_nightly_against_the_compose_lab_is_green(the_lab: Path) -> None:
    t0 = time.monotonic()
    out = _finish(_nightly(the_lab, "lab-1"))
    print(f"lab nightly: {time.monotonic() - t0:.1f}s")
    _check_run(the_lab, "lab-1")
    # Everything went through TLS with client certificates: no plain address is configured.
    cfg = config_mod.load(the_lab / "hosts" / "nightly" / "farm.toml")
    assert cfg.gearman.tls_cert and cfg.s3.endpoint.startswith("https://") and "sslmode=verify-full" in cfg.database.url
    assert "lab-1" in out


def _held(cfg: config_mod.Config, server: int) -> int:
    """Jobs of the farm (builds, tests, benchmarks) that one gearmand holds now, running or not."""
    host, port = cfg.gearman.addresses()[server]
    st = admin.status(host, port, ssl_context=ssl_context(cfg))
    return sum(s.queued for f, s in st.items() if f.split(":")[0] in ("build", "test", "perf"))


@pytest.mark.timeout(1800)
def test_the_lab_nightly_survives_losing_a_gearmand_and_a_minio_node(the_lab: Path) -> None:
    cfg = lab.nightly_config(the_lab)
    t0 = time.monotonic()
    proc = _nightly(the_lab, "lab-2")
    db = ResultsDB(cfg.database.url)
    # Stop them in the middle: once the first build has passed and gearmand1 holds jobs of the
    # run (tests and benchmarks to go), so the stop takes something with it.
    deadline, held = time.monotonic() + 600, 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            built = any(r.kind == "build" and r.status == "passed" for r in db.jobs("lab-2"))
        except Exception:  # noqa: BLE001 - the run's rows do not exist yet
            built = False
        if built and (held := _held(cfg, 0)) > 0:
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the nightly ended before anything could be stopped"
    assert held > 0, "gearmand1 never held a job of the run: stopping it would prove nothing"
    lab.compose(the_lab, "stop", "-t", "5", "gearmand1", "minio3")
    stopped = time.monotonic() - t0
    try:
        out = _finish(proc)
        again = [r for r in db.jobs("lab-2") if r.attempt > 1]
        print(f"lab nightly with gearmand1 (holding {held} jobs) and minio3 stopped at {stopped:.0f}s: "
              f"{time.monotonic() - t0:.1f}s, {len(again)} jobs ran again: {sorted(str(r.job_id) for r in again)}")
        print("\n".join(line for line in out.splitlines() if "submitting attempt" in line))
        # With both still stopped: every result and every artifact is there (three of MinIO's
        # four drives serve the erasure set; the other gearmand carried the rest of the run).
        _check_run(the_lab, "lab-2")
    finally:
        lab.compose(the_lab, "start", "gearmand1", "minio3", check=False)
