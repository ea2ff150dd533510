"""A job's claim and its preparation (workers.base.Admission), with a real gearmand, MinIO and
test worker: the slot fetches, verifies and unpacks the job's artifact while the ledger answers
its claim, so the two no longer come one after the other; and nothing of a job whose claim is
refused runs, reaches S3 or is recorded, though it was prepared. The collector here is the
test's own Gearman worker of `collect`, so that it can hold a claim's answer and look at the
worker's job dir meanwhile."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from pathlib import Path

import pytest

from gearfarm.config import Config, FarmConfig, GearmanConfig
from gearfarm.formats.job import COLLECT_FUNCTION, Artifact, JobId, Source, make_payload, sign
from gearfarm.formats.lease import open_lease
from gearfarm.formats.result import open_record, unpack_file
from gearfarm.formats.seal import Signer, keyring
from gearfarm.gearman import Job
from gearfarm.hosts.connection import gearman_client, gearman_worker
from gearfarm.hosts.gearmand import Gearmand
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.run import snapshot
from gearfarm.s3 import artifact, keys
from gearfarm.s3.store import ArtifactStore
from gearfarm.workers import base
from gearfarm.workers import test as test_worker
from gearfarm.workers.collector import is_lease
from tests.farmkit import keyed

TARGET = "linux-x86_64"
REV = "c" * 40
CATALOG = """schema = 2

[build]
argv = ["true"]
outputs = ["gfe"]
timeout = 60

[suites.unit]
argv = ["sh", "-c", "echo 'ok 1 - ran'"]
format = "tap"
timeout = 60

[suites.slow]
argv = ["sh", "-c", "sleep 30; echo 'ok 1 - slept'"]
format = "tap"
timeout = 60

[targets.linux-x86_64]
tools = ["sh"]
suites = ["unit", "slow"]
"""


class Collector:
    """The `collect` function: a claim is answered ``answers[job]`` once the worker's job dir
    holds the unpacked artifact (or after 5 s), and whether it did is kept; records are kept."""

    def __init__(self, cfg: Config, work: Path, host: Signer, unpacked: str = "gfe") -> None:
        self.work, self.lookup, self.unpacked = work, keyring([host.public_text]), unpacked
        self.answers: dict[str, str] = {}
        self.unpacked_when_asked: dict[str, bool] = {}
        self.records: list[bytes] = []
        self.stop = threading.Event()
        self.worker = gearman_worker(cfg, "test-collector")
        self.worker.register(COLLECT_FUNCTION, self.handle)
        self.thread = threading.Thread(target=self.worker.work, args=(self.stop,), daemon=True)

    def handle(self, job: Job) -> bytes:
        if not is_lease(job.data):
            self.records.append(job.data)
            return b"applied"
        lease, _ = open_lease(job.data, self.lookup)
        if lease.beat:
            return b"granted "
        deadline = time.monotonic() + 5
        # The job's tree is on its slot's job disk (gearfarm.hosts.jobdisk), in its owner's dir.
        while not list(self.work.glob(f"*/disk/test*/root/{self.unpacked}")) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.unpacked_when_asked[lease.job_id] = bool(list(self.work.glob(f"*/disk/test*/root/{self.unpacked}")))
        return self.answers[lease.job_id].encode()


@pytest.fixture
def farm(tmp_path: Path):  # noqa: ANN201 - the lab's parts
    settings = keyed(tmp_path / "state", f"sqlite:///{tmp_path / 'r.db'}")
    with Gearmand(tmp_path / "gm") as gm, MinioServer(tmp_path / "minio") as minio:
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]), s3=minio.s3_config(),
                     farm=FarmConfig(repo=str(tmp_path), state_dir=str(tmp_path / "state"), **settings))  # type: ignore[arg-type]
        yield cfg, tmp_path


def stored(cfg: Config, tmp_path: Path, rev: str = REV) -> tuple[str, Artifact]:
    """CATALOG and a build's artifact of ``rev`` in S3: the catalog's sha256 and the artifact."""
    store = ArtifactStore(cfg.s3)
    cat_sha, _ = snapshot.publish_catalog(store, CATALOG)
    out = tmp_path / "out"
    out.mkdir()
    (out / "gfe").write_bytes(b"#!/bin/sh\necho engine\n")
    archive = tmp_path / "build.tar.zst"
    artifact.pack(out, ["gfe"], {"rev": rev, "target": TARGET}, archive)
    art = Artifact(f"artifacts/{rev[:12]}/build.tar.zst", hashlib.sha256(archive.read_bytes()).hexdigest())
    store.put_file(art.key, archive)
    return cat_sha, art


def test_a_job_is_prepared_while_its_claim_is_asked_and_nothing_of_a_refused_one_runs_or_is_kept(
        farm: tuple[Config, Path], caplog: pytest.LogCaptureFixture) -> None:
    cfg, tmp_path = farm
    store = ArtifactStore(cfg.s3)
    cat_sha, art = stored(cfg, tmp_path)
    nightly = cfg.nightly_signer()
    collector = Collector(cfg, tmp_path / "state" / "work", cfg.host_signer())  # claims are the host's
    collector.thread.start()
    stop = threading.Event()
    functions = [("test", f"test:{TARGET}", test_worker.handle)]
    slot = threading.Thread(target=base.serve, args=(cfg, functions, stop), daemon=True)
    slot.start()
    client = gearman_client(cfg)
    caplog.set_level(logging.INFO, logger="gearfarm")
    try:
        def run(run_id: str, answer: str) -> bytes:
            jid = JobId(run_id, TARGET, "test-unit")
            collector.answers[str(jid)] = answer
            p = make_payload(jid, source=Source("admission", REV, "5" * 64, cat_sha), deadline=time.time() + 600,
                             artifact=art)
            return client.submit(f"test:{TARGET}", sign(p, nightly), unique=p.unique, timeout=60)

        # Granted: the artifact was unpacked in the job dir by the time the claim was answered.
        assert run("granted", "granted ") == f"granted:{TARGET}:test-unit passed".encode()
        assert collector.unpacked_when_asked == {f"granted:{TARGET}:test-unit": True}
        assert caplog.text.count(f"COMMAND START job=granted:{TARGET}:test-unit ") == 1
        deadline = time.monotonic() + 10
        while not collector.records:
            assert time.monotonic() < deadline, "the granted job's record never came"
            time.sleep(0.05)
        # Its log travels in the record (a small one), not to S3 on the job's way.
        rec, _ = open_record(collector.records[0], keyring([cfg.host_signer().public_text]))
        assert rec.log_key == keys.job_file("granted", TARGET, "test-unit", "log.txt", rec.file_sums["log.txt"].sha256)
        assert b"ok 1 - ran" in unpack_file(rec.files["log.txt"])
        assert rec.log_key not in set(store.list("runs/granted/"))

        # Refused ("ran already"): prepared as well, then dropped. No command, no log or record.
        got = run("replayed", f"done attempt 1 of replayed:{TARGET}:test-unit ran already (on elsewhere)")
        assert got.startswith(b"dropped: attempt 1 of replayed:"), got
        assert collector.unpacked_when_asked[f"replayed:{TARGET}:test-unit"] is True
        assert f"COMMAND START job=replayed:{TARGET}" not in caplog.text
        time.sleep(1)  # what the outbox would have published by now
        assert len(collector.records) == 1 and not list(store.list("runs/replayed/"))
        # Its job dir is gone, and the granted one's: left for later (the record first), they go
        # when the slot is idle (process.tidy) if no next command came.
        deadline = time.monotonic() + 10
        work = tmp_path / "state" / "work"
        while list(work.glob("*/test*")) or list(work.glob("*/disk/test*")):
            assert time.monotonic() < deadline, "the jobs' dirs were left behind"
            time.sleep(0.05)
    finally:
        stop.set()
        collector.stop.set()
        client.close()
        slot.join(30)
        collector.worker.wake()
        collector.thread.join(10)
