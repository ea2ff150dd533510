"""A job's files (its log, a suite's JUnit) travel in its record when they are small, so no
request to S3 is on the job's way, and go to S3 before the record when they are not; the ledger
keeps the carried ones with the job's row, and every reader (the dashboard's log view, the
copies on disk) finds each where it is. Real gearmand, MinIO and test worker; the collector is
the test's own Gearman worker of `collect` (tests/workers/test_admission.py), and the records
it gets are applied by a ledger on SQLite."""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from pathlib import Path

import pytest
import zstandard

from gearfarm.config import Config
from gearfarm.db.results import ResultsDB
from gearfarm.formats.job import Artifact, JobId, Source, make_payload, sign
from gearfarm.formats.result import FILES_MAX, ResultRecord, open_record, pack_file, unpack_file
from gearfarm.formats.seal import keyring
from gearfarm.hosts.connection import gearman_client
from gearfarm.report import joblog
from gearfarm.run import snapshot
from gearfarm.run.ledger import Ledger
from gearfarm.s3 import artifact
from gearfarm.s3.store import ArtifactStore
from gearfarm.workers import base
from gearfarm.workers import test as test_worker
from tests.workers.test_admission import Collector, farm  # noqa: F401 - its fixture, the same lab

TARGET = "linux-x86_64"
REV = "d" * 40
# "small" prints a line and writes a JUnit file of 40 cases; "large" prints 200 KB that do not
# compress (random bytes in base64), more than a record carries. Both scripts are the build's.
SMALL_SH = """echo small ran
{ echo '<testsuite name="small">'
  i=0; while [ $i -lt 40 ]; do echo "<testcase classname=\\"small\\" name=\\"c$i\\"/>"; i=$((i+1)); done
  echo '</testsuite>'; } > "$1"
"""
CATALOG = """schema = 2

[build]
argv = ["true"]
outputs = ["small.sh"]
timeout = 60

[suites.small]
argv = ["sh", "{root}/small.sh", "{junit}"]
format = "junit"
timeout = 60

[suites.large]
argv = ["sh", "-c", "head -c 150000 /dev/urandom | base64"]
format = "exit-code"
timeout = 60

[targets.linux-x86_64]
tools = ["sh", "head", "base64"]
suites = ["small", "large"]
"""


def test_small_files_travel_in_the_record_and_large_ones_go_to_s3_and_readers_find_each(
        farm: tuple[Config, Path]) -> None:  # noqa: F811 - the fixture imported above
    cfg, tmp_path = farm
    store = ArtifactStore(cfg.s3)
    cat_sha, _ = snapshot.publish_catalog(store, CATALOG)
    out = tmp_path / "out"
    out.mkdir()
    (out / "small.sh").write_text(SMALL_SH)
    archive = tmp_path / "build.tar.zst"
    artifact.pack(out, ["small.sh"], {"rev": REV, "target": TARGET}, archive)
    art = Artifact("artifacts/files/build.tar.zst", hashlib.sha256(archive.read_bytes()).hexdigest())
    store.put_file(art.key, archive)
    collector = Collector(cfg, tmp_path / "state" / "work", cfg.host_signer(), unpacked="small.sh")
    collector.thread.start()
    stop = threading.Event()
    slot = threading.Thread(target=base.serve, args=(cfg, [("test", f"test:{TARGET}", test_worker.handle)], stop),
                            daemon=True)
    slot.start()
    client = gearman_client(cfg)
    jids = [JobId("files", TARGET, "test-small"), JobId("files", TARGET, "test-large")]
    try:
        for jid in jids:
            collector.answers[str(jid)] = "granted "
            p = make_payload(jid, source=Source("files", REV, "5" * 64, cat_sha), deadline=time.time() + 600,
                             artifact=art)
            assert client.submit(f"test:{TARGET}", sign(p, cfg.nightly_signer()), unique=p.unique, timeout=60) \
                == f"{jid} passed".encode()
        deadline = time.monotonic() + 10
        while len(collector.records) < 2:
            assert time.monotonic() < deadline, "the records never came"
            time.sleep(0.05)
    finally:
        stop.set()
        collector.stop.set()
        client.close()
        slot.join(30)
        collector.worker.wake()
        collector.thread.join(10)

    host = keyring([cfg.host_signer().public_text])
    small, large = sorted((open_record(r, host)[0] for r in collector.records), key=lambda r: r.step, reverse=True)
    in_s3 = set(store.list("runs/files/"))
    # The small suite's log and JUnit: in its record, nothing of them in S3.
    assert set(small.files) == {"log.txt", "junit.xml"}
    assert b"small ran" in unpack_file(small.files["log.txt"])
    assert unpack_file(small.files["junit.xml"]).count(b"<testcase") == 40 and len(small.cases) == 40
    assert small.log_key not in in_s3 and small.junit_key not in in_s3
    # The large one's log: in S3 at its key, before the record named it; not carried.
    assert large.files == {} and large.log_key in in_s3
    assert len(store.get_bytes(large.log_key)) > 150_000

    # Applied by the ledger: the carried files are kept with the job's row, not in its record.
    db = ResultsDB(f"sqlite:///{tmp_path / 'applied.db'}")
    assert db.create_run("files", REV, [TARGET], [str(j) for j in jids])
    ledger = Ledger(db)
    for rec in (small, large):
        assert ledger.apply(rec, "nightly") == "applied"
    assert db.job(str(jids[0])).files == {}  # type: ignore[union-attr]
    # The dashboard's log view: the carried log from the database, the large one from S3.
    runs = tmp_path / "runs"
    got = joblog.stream(db, store, runs / "files", "files", TARGET, "test-small", "log.txt")
    assert got is not None and b"small ran" in b"".join(got)
    got = joblog.stream(db, store, runs / "files", "files", TARGET, "test-large", "log.txt")
    assert got is not None and b"".join(got) == store.get_bytes(large.log_key)
    # The copies on disk, from wherever each file is.
    assert joblog.copy_all(store, db, db.jobs("files", cases=False), runs) == []
    assert b"small ran" in (runs / "files" / joblog.relative(TARGET, "test-small")).read_bytes()
    assert (runs / "files" / joblog.relative(TARGET, "test-small", "junit.xml")).read_bytes().count(b"<testcase") == 40
    assert (runs / "files" / joblog.relative(TARGET, "test-large")).read_bytes() == store.get_bytes(large.log_key)


def test_a_record_carries_only_the_jobs_files_within_their_bound_and_each_must_read_back() -> None:
    """What a worker's record may carry is checked wherever the record is read (its model: the
    collector, the reconcile): another name, more than FILES_MAX, or bytes that are not a
    compressed file within FILE_MAX_BYTES are refused, saying which."""
    base_rec = dict(job_id=f"f:{TARGET}:test-unit", run_id="f", target=TARGET, kind="test", step="test-unit",
                    name="unit", rev=REV, status="passed")
    with pytest.raises(ValueError, match="carries only log.txt, junit.xml, not passwd"):
        ResultRecord(**base_rec, files={"passwd": pack_file(b"x")})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"over the {FILES_MAX}"):
        ResultRecord(**base_rec, files={"log.txt": "A" * (FILES_MAX + 4)})  # type: ignore[arg-type]
    # A zstd bomb: a few KB that would decompress to gigabytes is refused once past the bound.
    bomb = base64.b64encode(zstandard.ZstdCompressor(level=19).compress(b"\0" * (24 << 20))).decode()
    with pytest.raises(ValueError, match="decompresses to more than"):
        unpack_file(bomb)
    assert len(bomb) < FILES_MAX
    with pytest.raises(ValueError, match="its log.txt cannot be read: it decompresses to more than"):
        ResultRecord(**base_rec, files={"log.txt": bomb})  # type: ignore[arg-type]
    # Bytes that are not a compressed file: refused where the record is read, so never applied.
    with pytest.raises(ValueError, match="its log.txt cannot be read"):
        ResultRecord(**base_rec, files={"log.txt": base64.b64encode(b"not zstd").decode()})  # type: ignore[arg-type]
