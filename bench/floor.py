"""The least a job can cost with the farm's parts (issue #38): the hops a gearfarm job must make,
made with the same servers and libraries and nothing else, so that `bench/scale.py`'s
`farm cost: X ms per job` can be read against what these parts alone cost on this machine.

One gearmand (its queue persistent, as the farm's), MinIO, PostgreSQL, a "collector" process
and --slots "slot" processes, all on loopback; --jobs background jobs queued before the slots
start. A slot's job, as a gearfarm test job makes it, in the same order, each step in its
thinnest form:

* the job handed over by gearmand (GRAB_JOB, JOB_ASSIGN), its payload's ed25519 signature
  checked and its JSON parsed;
* the claim: a foreground job to the collector, which checks its signature and inserts the
  lease in one statement; asked in a thread while the slot makes the job dir and unpacks the
  cached artifact (its sha256, zstd, tar, each file's sha256 against the manifest), as
  gearfarm's Admission does;
* the command: a sleep of --command-ms, which the cost does not count;
* the log and the JUnit file (40 cases) PUT to MinIO with boto3, both at once;
* the record (the cases, timings, the host's facts; ~6 KB of JSON) signed, written to the
  spool and fsync'd, submitted to the collector as a background job, the job dir removed;
* the collector checks the record's signature and applies it in one statement (the job's row
  with the record as JSON, its cases, the delivery row).

By default the files go to S3 as the farm's did until 2026-12-03; --files-in-record makes them
travel as the farm's now do. --confined runs the command as the farm does (gearfarm's Sandbox:
its supervisor, setpriv to a job uid, bubblewrap's namespaces) instead of sleeping in the slot:
its seconds are the job's, as the farm's records count them, but its CPU is on the cores.

--release makes the jobs a build's release, as a lab sees one: every slot started and idle
first, then the jobs submitted at once. At 64 simulated hosts on two cores (bench/scale.py) a
release of 49 suites lands on 128 idle slots; the floor of that burst is what no farm built of
these parts could beat on this machine, whatever its own code (issue #38).

What gearfarm does beyond these (its checks, logging, heartbeats, the host lock, the nightly's
poll, the report, SQLAlchemy and pydantic) is what its cost has above this floor. The cost per
job is counted as `bench/scale.py` counts it: a slot's time from one job's end (its files
stored) to the next one's, less the command, plus the record's finish → applied (a slot's
first job of a release: from the release on). Printed beside it: each part's mean, the
processes' CPU a job and the cores' speed (scale.probe_ms: compare runs at like speeds).

    .venv/bin/python bench/floor.py [--jobs 500] [--slots 2] [--command-ms 60]
    .venv/bin/python bench/floor.py --files-in-record --confined --release --slots 128 --jobs 98 \
        --command-ms 3000       # 64 simulated hosts, a 100-job night's release of 98 suites
    ... --confined --release --spread --slots 128 --jobs 5000 --command-ms 16000
                                # 64 hosts, 5,000 jobs at the rate of bench/scale.py's night
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import statistics
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import scale  # noqa: E402  (its THIS_CHECKOUT import of gearfarm, its probe, its PostgreSQL)

from gearfarm.config import FarmConfig  # noqa: E402
from gearfarm.gearman import BackgroundJob, Client, Job, Worker  # noqa: E402
from gearfarm.hosts.connection import IDLE_POLL  # noqa: E402  (as the farm's slots and collector wait)
from gearfarm.hosts.gearmand import Gearmand  # noqa: E402
from gearfarm.hosts.minio_server import MinioServer  # noqa: E402

TEST, COLLECT = "floor-test", "floor-collect"
JOB_UID = FarmConfig().job_uid  # --confined: the job uid the farm's sandbox switches to by default
CASES = 40
SCHEMA = """
CREATE TABLE lease (job_id text, attempt int, host text, at double precision, PRIMARY KEY (job_id, attempt));
CREATE TABLE job (job_id text PRIMARY KEY, run_id text, target text, status text, attempt int,
                  started_at double precision, finished_at double precision, record jsonb);
CREATE TABLE cases (job_id text, classname text, name text, status text, time double precision);
CREATE INDEX cases_job ON cases (job_id);
CREATE TABLE delivery (id bigserial PRIMARY KEY, job_id text, outcome text, at double precision);
CREATE TABLE job_file (job_id text, name text, content bytea, PRIMARY KEY (job_id, name));
"""
APPLY = """
WITH j AS (INSERT INTO job VALUES (%(job_id)s, %(run_id)s, %(target)s, %(status)s, %(attempt)s, %(started)s,
                                   %(finished)s, %(record)s)
           ON CONFLICT (job_id) DO UPDATE SET record = EXCLUDED.record),
     c AS (INSERT INTO cases SELECT %(job_id)s, * FROM unnest(%(cls)s::text[], %(names)s::text[],
                                                              %(sts)s::text[], %(times)s::float8[])),
     f AS (INSERT INTO job_file SELECT %(job_id)s, * FROM unnest(%(fnames)s::text[], %(fdata)s::bytea[]))
INSERT INTO delivery (job_id, outcome, at) VALUES (%(job_id)s, 'applied', extract(epoch FROM clock_timestamp()))
"""
CLAIM = """INSERT INTO lease VALUES (%s, 1, %s, extract(epoch FROM clock_timestamp()))
ON CONFLICT DO NOTHING RETURNING host"""


def sign(key: Any, body: bytes) -> bytes:
    return key.sign(body) + body


def opened(pub: Any, data: bytes) -> bytes:
    pub.verify(data[:64], data[64:])
    return data[64:]


def junit(suite: str) -> bytes:
    cases = "".join(f'<testcase classname="{suite}" name="case_{i}" time="0.001"/>\n' for i in range(CASES))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="{suite}" tests="{CASES}">\n{cases}'
            "</testsuite>\n").encode()


def artifact(dest: Path) -> str:
    """A build's artifact as the farm packs one (a suite script and its manifest, tar in zstd);
    its sha256."""
    import zstandard

    script = b"#!/bin/sh\nsleep \"$1\"\n"
    manifest = json.dumps({"files": {"out/suite.sh": {"sha256": hashlib.sha256(script).hexdigest(), "mode": "755"}},
                           "rev": "0" * 40, "target": "floor"}).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in (("manifest.json", manifest), ("out/suite.sh", script)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dest.write_bytes(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw.getvalue()))
    return hashlib.sha256(dest.read_bytes()).hexdigest()


def unpack(archive: Path, sha256: str, into: Path) -> None:
    import zstandard

    data = archive.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError("artifact sha256 differs")
    with tarfile.open(fileobj=io.BytesIO(zstandard.ZstdDecompressor().decompress(data)), mode="r:") as tar:
        tar.extractall(into, filter="data")
    manifest = json.loads((into / "manifest.json").read_bytes())
    for name, info in manifest["files"].items():
        if hashlib.sha256((into / name).read_bytes()).hexdigest() != info["sha256"]:
            raise RuntimeError(f"{name} sha256 differs")


def s3_client(s3: dict[str, str]) -> Any:
    import boto3
    from botocore.config import Config as BotoConfig

    return boto3.session.Session().client(
        "s3", endpoint_url=s3["endpoint"], aws_access_key_id=s3["access_key"],
        aws_secret_access_key=s3["secret_key"], region_name="us-east-1",
        config=BotoConfig(signature_version="s3v4", s3={"addressing_style": "path"},
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required", retries={"max_attempts": 1}))


def collector(port: int, db: str, keys: dict[str, bytes], out: Path, ready: Any, stop: Any) -> None:
    """Claims and records, each in one statement, on two threads (a claim does not wait behind
    a record)."""
    import psycopg
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    pubs = {host: load_pem_public_key(pem) for host, pem in keys.items()}
    done = threading.Event()

    def serve(n: int) -> None:
        conn = psycopg.connect(db, autocommit=True)

        def handle(job: Job) -> bytes:
            kind, host, signed = job.data[:1], job.data[1:17].decode().strip(), job.data[17:]
            body = opened(pubs[host], signed)
            if kind == b"C":
                job_id = json.loads(body)["job_id"]
                row = conn.execute(CLAIM, (job_id, host), prepare=True).fetchone()
                return b"granted" if row else b"held"
            rec = json.loads(body)
            cases = rec["cases"]
            conn.execute(APPLY, dict(job_id=rec["job_id"], run_id=rec["run_id"], target=rec["target"],
                                     status=rec["status"], attempt=rec["attempt"], started=rec["started_at"],
                                     finished=rec["finished_at"], record=body.decode(),
                                     cls=[c["classname"] for c in cases], names=[c["name"] for c in cases],
                                     sts=[c["status"] for c in cases], times=[c["time"] for c in cases],
                                     fnames=list(rec.get("files", {})),
                                     fdata=[v.encode() for v in rec.get("files", {}).values()]),
                         prepare=True)
            return b"applied"

        worker = Worker([("127.0.0.1", port)], f"floor-collector-{n}", poll_interval=IDLE_POLL)
        worker.register(COLLECT, handle)
        worker.work(done)
        worker.close()

    threads = [threading.Thread(target=serve, args=(n,), daemon=True) for n in range(2)]
    for t in threads:
        t.start()
    cpu0 = _cpu()  # the jobs' CPU, not the imports'
    ready.set()
    stop.wait()
    done.set()
    for t in threads:
        t.join(10)
    out.write_text(json.dumps({"cpu": _cpu() - cpu0}))


def slot(n: int, port: int, s3: dict[str, str], key_pem: bytes, nightly_pem: bytes, cache: Path, sha256: str,
         work: Path, command: float, spread: bool, inline: bool, confined: bool, out: Path, ready: Any,
         stop: Any) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

    from gearfarm.step.sandbox import Sandbox

    box = Sandbox("bwrap", uid=JOB_UID) if confined else None

    key, nightly = load_pem_private_key(key_pem, None), load_pem_public_key(nightly_pem)
    host = f"floor-host-{n}".ljust(16).encode()
    client, store = Client([("127.0.0.1", port)]), s3_client(s3)
    claims, puts = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    spool = work / f"spool-{n}"
    spool.mkdir()
    rows: list[dict[str, float]] = []
    junit_bytes = junit("suite")
    cases = [dict(classname="suite", name=f"case_{i}", status="passed", time=0.001, message="") for i in range(CASES)]
    facts = {k: f"{k}-value" for k in ("hostname", "os", "arch", "kernel", "cpu", "cores", "memory", "python",
                                       "libc", "class")}

    def handle(job: Job) -> bytes:
        got = time.time()
        p = json.loads(opened(nightly, job.data))
        claim = claims.submit(client.submit, COLLECT, b"C" + host + sign(key, json.dumps(p).encode()),
                              unique=f"claim-{p['job_id']}", timeout=30, priority="high")
        tmpd = Path(tempfile.mkdtemp(dir=work))
        (tmpd / "root").mkdir()
        unpack(cache, sha256, tmpd / "root")
        if claim.result() != b"granted":
            raise RuntimeError(f"claim of {p['job_id']} not granted")
        started = time.time()
        log = tmpd / "test.log"
        secs = command * random.Random(p["seed"]).uniform(0.5, 1.5) if spread else command
        if box is None:
            time.sleep(secs)
        else:
            box.give([tmpd / "root"])
            rc = box.run(["sh", "out/suite.sh", repr(secs)], log, 600, tmpd / "root", box.environment(),
                         [tmpd / "root"]).rc
            if rc != 0:
                raise RuntimeError(f"the confined command failed: {log.read_text()}")
        ran = time.time()
        with log.open("a") as f:
            f.write(f"gearfarm {p['job_id']} on {host.decode().strip()}\nran suite: {CASES} cases passed\n")
        (tmpd / "junit.xml").write_bytes(junit_bytes)
        files = {}
        if inline:
            files = {name: (tmpd / name).read_text() for name in ("test.log", "junit.xml")}
        else:
            beside = puts.submit(store.put_object, Bucket="gearfarm", Key=f"floor/{p['job_id']}/junit.xml",
                                 Body=(tmpd / "junit.xml").read_bytes(), ContentType="application/xml")
            with log.open("rb") as f:
                store.put_object(Bucket="gearfarm", Key=f"floor/{p['job_id']}/log.txt", Body=f,
                                 ContentType="text/plain; charset=utf-8")
            beside.result()
        finished = time.time()
        rec = dict(p, status="passed", attempt=1, worker=host.decode().strip(), host=facts, started_at=started,
                   finished_at=finished, cases=cases, log_key=f"floor/{p['job_id']}/log.txt", message="",
                   timings={"test": ran - started, "queue_wait": got - p["submitted_at"]}, files=files)
        body = b"R" + host + sign(key, json.dumps(rec).encode())
        fd, tmp = tempfile.mkstemp(dir=spool)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        path = spool / f"{p['unique']}.json"
        os.replace(tmp, path)
        client.submit_background(COLLECT, body, unique=f"rec-{p['job_id']}")
        path.unlink()
        shutil.rmtree(tmpd)
        ended = time.time()
        rows.append(dict(job=p["job_id"], got=got, started=started, ran=ran, finished=finished, ended=ended,
                         secs=secs))
        return b"passed"

    worker = Worker([("127.0.0.1", port)], f"floor-slot-{n}", poll_interval=IDLE_POLL)
    worker.register(TEST, handle)
    cpu0 = _cpu()  # the jobs' CPU, not the imports'
    ready.set()
    done = threading.Event()
    threading.Thread(target=lambda: (stop.wait(), done.set()), daemon=True).start()
    worker.work(done)
    worker.close()
    out.write_text(json.dumps({"rows": rows, "cpu": _cpu() - cpu0}))


def ended(procs: list[Any]) -> None:
    """No process of the bench outlives it: whatever did not stop when asked is killed."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is not None:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)


def _cpu() -> float:
    """This process's CPU seconds and its waited-for descendants' (a confined command's supervisor,
    setpriv, bubblewrap and the command)."""
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage,
                                                     (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def machine_busy() -> float:
    """CPU seconds every core of the machine has been busy since boot (/proc/stat: user to steal),
    the kernel's own work for the jobs' namespaces (done in its workers) included."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--command-ms", type=float, default=60.0, help="each job's command (a sleep), not counted")
    ap.add_argument("--confined", action="store_true",
                    help="the command runs in the farm's sandbox (supervisor, setpriv, bubblewrap): its seconds "
                         "the job's, as the farm's records count them, its CPU on the cores")
    ap.add_argument("--spread", action="store_true",
                    help="each job's command from 0.5 to 1.5 times --command-ms (drawn by its seed), so that the "
                         "slots end apart, as a night's suites do")
    ap.add_argument("--release", action="store_true",
                    help="every slot idle first, then the jobs submitted at once (a build's release)")
    ap.add_argument("--files-in-record", action="store_true",
                    help="the log and JUnit travel in the record and the collector stores them in PostgreSQL, "
                         "in the same statement: no PUT on a job's path")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))  # stopped, it still stops what it started

    import psycopg
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

    def pem(k: Ed25519PrivateKey) -> tuple[bytes, bytes]:
        return (k.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()),
                k.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))

    nightly = Ed25519PrivateKey.generate()
    hosts = [Ed25519PrivateKey.generate() for _ in range(a.slots)]
    spawn = multiprocessing.get_context("spawn")
    speeds: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gf-floor-") as tmp, contextlib.ExitStack() as stack:
        base = Path(tmp)
        gm = stack.enter_context(Gearmand(base / "gm", queue_db=base / "gm" / "q.db", job_retries=3))
        minio = stack.enter_context(MinioServer(base / "minio"))
        url, postmaster = stack.enter_context(scale.postgres())
        db = url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(SCHEMA)
        cache = base / "artifact.tar.zst"
        sha256 = artifact(cache)
        s3 = dict(endpoint=minio.endpoint, access_key=minio.access_key, secret_key=minio.secret_key)
        stop = spawn.Event()
        keys = {f"floor-host-{n}": pem(k)[1] for n, k in enumerate(hosts)}
        ready = [spawn.Event()]
        procs = [spawn.Process(target=collector, args=(gm.port, db, keys, base / "collector.json", ready[0], stop))]
        stack.callback(ended, procs)  # also when the bench fails or is interrupted
        for n, k in enumerate(hosts):
            ready.append(spawn.Event())
            procs.append(spawn.Process(target=slot, args=(n, gm.port, s3, pem(k)[0], pem(nightly)[1], cache, sha256,
                                                          base, a.command_ms / 1000, a.spread, a.files_in_record,
                                                          a.confined, base / f"slot-{n}.json",
                                                          ready[-1], stop)))

        def submit() -> float:
            with Client([("127.0.0.1", gm.port)]) as client:
                now = time.time()
                client.submit_background_many([
                    BackgroundJob(TEST, sign(nightly, json.dumps(dict(
                        job_id=f"floor/t/test-{i:05d}", run_id="floor", target="t", kind="test",
                        step=f"test-{i:05d}", rev="0" * 40, catalog_sha256="0" * 64, artifact_sha256=sha256, seed=i,
                        deadline=now + 3600, submitted_at=now, function=TEST, unique=f"floor-{i}")).encode()),
                                  f"floor-{i}")
                    for i in range(a.jobs)])
            return now

        # Without --release the jobs wait in gearmand's queue before any slot takes one, as a
        # night's suites do when the slots are busy; with it, they come to idle slots at once.
        released = None if a.release else submit()
        cpu0 = {name: proc_cpu(pid) for name, pid in (("gearmand", gm.pid), ("MinIO", minio.pid))}
        for p in procs:
            p.start()
        for r in ready:
            r.wait(120)
        if a.release:
            time.sleep(1)  # every slot asleep in gearmand (PRE_SLEEP), as idle slots are
            released = submit()
        t0, busy0 = time.time(), machine_busy()
        with scale.every_second(lambda: speeds.append(scale.probe_ms())):
            with psycopg.connect(db, autocommit=True) as conn:
                while conn.execute("SELECT count(*) FROM delivery").fetchone()[0] < a.jobs:
                    late = time.time() - t0 > 60 + a.jobs * (a.command_ms / 1000 + 0.1)
                    if late or not all(p.is_alive() for p in procs):
                        sys.exit("the floor's jobs did not all arrive")
                    time.sleep(0.2)
                applied = dict(conn.execute("SELECT job_id, at FROM delivery").fetchall())
                pg_cpu = sum(proc_cpu(int(pid)) for (pid,) in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()").fetchall())
        wall, busy = time.time() - t0, machine_busy() - busy0
        cpu = {name: proc_cpu(pid) - cpu0[name] for name, pid in (("gearmand", gm.pid), ("MinIO", minio.pid))}
        stop.set()
        for p in procs:
            p.join(30)
        slots = [json.loads((base / f"slot-{n}.json").read_text()) for n in range(a.slots)]
        cpu["collector"] = json.loads((base / "collector.json").read_text())["cpu"]
        cpu["slots"] = sum(s["cpu"] for s in slots)
        cpu["PostgreSQL backends"] = pg_cpu
        del postmaster

    files = "log + JUnit" + ("" if a.files_in_record else " (PUTs)")
    cycle, parts = [], {"hand-over": [], "payload, unpack, claim": [], files: [],
                        "seal, spool, submit, job dir": [], "record finish → applied": []}

    def command(row: dict[str, float]) -> float:
        # As bench/scale.py and the farm's records count it: a confined command's start and end
        # (its supervisor, the sandbox) are the job's seconds, not the farm's cost. Their CPU
        # still takes the cores from everything else a release starts.
        return row["ran"] - row["started"]

    first, rest = [], []  # each job's floor: a slot's first job of a release, the others
    for s in slots:
        rows = s["rows"]
        if released is not None and a.release and rows:
            # A slot's first job: it and the slot were both free from the release on.
            cycle.append(rows[0]["finished"] - released - command(rows[0]))
            parts["hand-over"].append(rows[0]["got"] - released)
            first.append(cycle[-1] + applied[rows[0]["job"]] - rows[0]["finished"])
        for prev, row in zip(rows, rows[1:], strict=False):
            cycle.append(row["finished"] - prev["finished"] - command(row))
            parts["hand-over"].append(row["got"] - prev["ended"])
            rest.append(cycle[-1] + applied[row["job"]] - row["finished"])
        for row in rows:
            parts["seal, spool, submit, job dir"].append(row["ended"] - row["finished"])
            parts["payload, unpack, claim"].append(row["started"] - row["got"])
            parts[files].append(row["finished"] - row["started"] - command(row))
        parts["record finish → applied"] += [applied[r["job"]] - r["finished"] for r in rows]
    ms = {k: 1000 * statistics.fmean(v) for k, v in parts.items()}
    cost = 1000 * statistics.fmean(cycle) + ms["record finish → applied"]
    n = a.jobs
    how = ("files in the record" if a.files_in_record else "files PUT") + (", confined" if a.confined else "") + (
        ", released at once to idle slots" if a.release else "") + (", commands spread ±50 %" if a.spread else "")
    print(f"| {n} jobs, {a.slots} slots, command {a.command_ms:.0f} ms, {how} | |\n|---|---|")
    for k, v in ms.items():
        print(f"| {k}, ms a job (mean) | {v:.1f} |")
    for k, v in cpu.items():
        print(f"| {k} CPU ms a job | {1000 * v / n:.1f} |")
    print(f"| all of them, CPU ms a job | {1000 * sum(cpu.values()) / n:.1f} |")
    print(f"| the machine's cores busy, ms a job (the probe of the cores' speed included) | {1000 * busy / n:.1f} |")
    if a.confined:
        beyond = [r["ran"] - r["started"] - r["secs"] for sl in slots for r in sl["rows"]]
        print(f"| the command's seconds beyond its sleep (supervisor, sandbox), mean ms | "
              f"{1000 * statistics.fmean(beyond):.1f} |")
    if first and rest:
        print(f"| floor of a slot's first job of the release / of the others, ms a job (jobs) | "
              f"{1000 * statistics.fmean(first):.1f} ({len(first)}) / {1000 * statistics.fmean(rest):.1f} "
              f"({len(rest)}) |")
    print(f"| wall s | {wall:.1f} |")
    print(f"| the cores' speed: CPU ms of scale.py's fixed work, p50 | {statistics.median(speeds):.2f} |")
    print(f"\nfloor: {cost:.1f} ms per job")


if __name__ == "__main__":
    main()
