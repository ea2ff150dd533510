"""Size limits that lose nothing (issue #32, point 4). A suite's cases never make its result
record too large to deliver: past the envelope limit they travel in S3 beside the record, named by
a signed sha256, and every reader of the record loads and checks them (a tampered, truncated or
missing copy is a rejected record, never zero cases). A job's log is capped (head, a note of what
was dropped, tail) while it streams, so a 1 GiB output costs neither the worker's memory nor the
store's space. Unit tests on run_logged and the ledger (real MinIO), and a real embedded farm
running a 50,000-case suite and a suite printing 1 GiB."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from gearfarm import config as config_mod
from gearfarm.config import FarmConfig, ProjectConfig
from gearfarm.db.registry import Registry
from gearfarm.db.results import Case, DeliveryRow, ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import JobId
from gearfarm.formats.result import CaseResult, ResultRecord, seal_record
from gearfarm.formats.seal import MAX_ENVELOPE, Signer
from gearfarm.hosts import process
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.run.ledger import Ledger
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore
from gearfarm.step import runner as step
from gearfarm.step import sandbox
from tests.farmkit import claim, gearfarm
from tests.pg import pg_server, pg_url  # noqa: F401 - fixtures
from tests.projects import CATALOG_TINY, _init

MiB = 1024 * 1024
GiB = 1024 * MiB
ROOT = Path(__file__).resolve().parents[2]

# -- the log cap, on run_logged itself ---------------------------------------------------------

FLOOD = "echo first-line-of-the-flood; yes 0123456789abcdef | head -c {n}; echo; echo last-line-of-the-flood"

STREAMER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from gearfarm.hosts import process
    log, cmd, limit = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    kw = {} if limit == "default" else {"limit": int(limit)}
    rc, timed_out = process.run_logged(["sh", "-c", cmd], log, 600, **kw)
    # VmHWM, not getrusage's ru_maxrss: after exec, ru_maxrss still counts the address space of
    # the process this one was forked from (the test's own pytest, hundreds of MB late in a run).
    status = Path("/proc/self/status").read_text()
    hwm = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
    print(json.dumps({"rc": rc, "timed_out": timed_out, "maxrss_kib": hwm}))
""")


def stream(log: Path, cmd: str, limit: int | None = None) -> dict[str, Any]:
    """run_logged in a process of its own, so that its peak RSS is the streaming's alone."""
    p = subprocess.run([sys.executable, "-c", STREAMER, str(log), cmd, "default" if limit is None else str(limit)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def test_a_1gib_output_leaves_a_capped_log_and_the_streaming_process_small(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    got = stream(log, FLOOD.format(n=GiB))
    assert got["rc"] == 0 and not got["timed_out"]
    size = log.stat().st_size
    # The default cap ([farm] log_limit, 64 MiB) and a few lines: the command, the note.
    assert size <= 64 * MiB + 4096, f"the log is {size} bytes"
    assert FarmConfig().log_limit == process.LOG_LIMIT == 64 * MiB
    with log.open("rb") as f:
        head = f.read(4096)
        f.seek(-4096, 2)
        tail = f.read()
    assert head.startswith(b"$ sh -c ") and b"first-line-of-the-flood\n01234" in head
    tail, ended = _ended(tail)
    assert tail.endswith(b"\nlast-line-of-the-flood\n") and ended.startswith(b"--- exit status 0 after ")
    notes = [line for line in _lines_with(log, b"*** ") if b"dropped" in line]
    assert len(notes) == 1, notes
    # Every byte printed is either in the log or counted in the note (which has a line of its own).
    printed = len("first-line-of-the-flood\n") + GiB + len("\nlast-line-of-the-flood\n")
    kept = size - len(head.split(b"\n")[0] + b"\n") - len(b"\n" + notes[0] + b"\n") - len(ended)
    assert notes[0] == (f"*** {printed - kept} bytes of output dropped here (log capped at 64 MiB: [farm] "
                        "log_limit) ***").encode()
    # Measured, not assumed: the process that streamed 1 GiB peaked far below it.
    assert got["maxrss_kib"] < 300 * 1024, f"peak RSS {got['maxrss_kib']} KiB"


def _ended(data: bytes) -> tuple[bytes, bytes]:
    """The log without its last line, how the command ended (``--- exit status 0 after 1.2 s ---``),
    and that line."""
    body, _, last = data.rstrip(b"\n").rpartition(b"\n")
    assert last.startswith(b"--- ") and last.endswith(b" s ---"), last
    return body + b"\n", last + b"\n"


def _lines_with(path: Path, needle: bytes) -> list[bytes]:
    """The lines of a big file holding ``needle``, read in bounded chunks."""
    out = []
    with path.open("rb") as f:
        for line in f:
            if needle in line:
                out.append(line.rstrip(b"\n"))
    return out


def test_the_cap_keeps_the_head_and_the_tail_and_counts_every_dropped_byte(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    limit = 1 * MiB
    got = stream(log, "seq 1 2000000", limit)
    assert got["rc"] == 0
    printed = subprocess.run(["seq", "1", "2000000"], capture_output=True, check=True).stdout
    data, ended = _ended(log.read_bytes())
    command, rest = data.split(b"\n", 1)
    assert command == b"$ sh -c seq 1 2000000" and ended.startswith(b"--- exit status 0 after ")
    head, after = rest.split(b"\n*** ", 1)
    note, tail = after.split(b" ***\n", 1)
    dropped = int(note.split()[0])
    assert note == f"{dropped} bytes of output dropped here (log capped at 1 MiB: [farm] log_limit)".encode()
    # The head is the output's beginning, the tail its end, and nothing is lost unsaid.
    assert printed.startswith(head) and printed.endswith(tail)
    assert len(head) + dropped + len(tail) == len(printed)
    assert len(data) + len(ended) <= limit + 200
    assert len(tail) >= limit // 8, "the tail (where a failure usually is) is kept, not only the head"


def test_a_log_under_the_cap_is_left_whole(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    got = stream(log, "seq 1 1000; echo done >&2; exit 3", 1 * MiB)
    assert got["rc"] == 3
    printed = subprocess.run(["seq", "1", "1000"], capture_output=True, check=True).stdout
    data, ended = _ended(log.read_bytes())
    assert data == b"$ sh -c seq 1 1000; echo done >&2; exit 3\n" + printed + b"done\n"
    assert re.fullmatch(rb"--- exit status 3 after \d+\.\d s ---\n", ended)


def test_a_benchmark_runs_output_is_appended_to_the_job_log_within_the_cap(tmp_path: Path) -> None:
    """step.run_benchmark copies each run's output into the perf job's log: bounded too."""
    out, log = tmp_path / "out.log", tmp_path / "perf.log"
    out.write_bytes(b"".join(b"line %d\n" % i for i in range(200_000)))
    log.write_bytes(b"gearfarm perf header\n")
    process.append_capped(out, log, 64 * 1024, "--- new-1 ---\n")
    data = log.read_bytes()
    assert len(data) <= 64 * 1024 + 200
    assert data.startswith(b"gearfarm perf header\n--- new-1 ---\nline 0\n")
    assert data.endswith(b"line 199999\n")
    assert b"bytes of output dropped here" in data
    small = tmp_path / "small.log"
    small.write_bytes(b"x = 1\n")
    process.append_capped(small, log, 64 * 1024, "--- new-2 ---\n")
    assert log.read_bytes().endswith(b"--- new-2 ---\nx = 1\n")


def test_log_limit_is_read_from_the_config_in_bytes_or_mib(tmp_path: Path) -> None:
    assert FarmConfig(log_limit="8 MiB").log_limit == 8 * MiB  # type: ignore[arg-type]
    assert FarmConfig(log_limit=300_000).log_limit == 300_000
    assert FarmConfig(log_limit="1GiB").log_limit == GiB  # type: ignore[arg-type]
    path = tmp_path / "farm.toml"
    path.write_text('[farm]\nlog_limit = "12 parsecs"\n')
    with pytest.raises(config_mod.ConfigError, match=r"log_limit.*MiB"):
        config_mod.load(path)
    path.write_text("[farm]\nlog_limit = 10\n")
    with pytest.raises(config_mod.ConfigError, match="log_limit"):
        config_mod.load(path)
    # What a worker's jobs get: its sandbox carries the limit to every command it starts.
    path.write_text('[farm]\nlog_limit = "1 MiB"\n')
    path.chmod(0o600)
    box = sandbox.for_config(config_mod.load(path))
    work = tmp_path / "job"
    work.mkdir()
    log = tmp_path / "job.log"
    cat = catalog_mod.parse(CATALOG_TINY, "tiny")
    rc, _, _, _ = step._run(box, cat, None, ["sh", "-c", "head -c 3000000 /dev/zero"], log, 60, work,
                            box.environment(), [work])
    assert rc == 0 and MiB <= log.stat().st_size < MiB + 4096
    assert b"bytes of output dropped here (log capped at 1 MiB: [farm] log_limit)" in log.read_bytes()


# -- cases beside the record: the ledger's side, on a real MinIO -------------------------------

# The test host's key, registered in each test's results database (ledger_and_store, new_run).
KEYS = Signer.generate()
HOST = "limits-host"
REV = "b" * 40
T = "linux-x86_64"


def big_record(run_id: str, n: int) -> ResultRecord:
    jid = JobId(run_id, T, "test-many")
    cases = [CaseResult(classname="many", name=f"case {i}", status="passed") for i in range(1, n + 1)]
    return ResultRecord(job_id=str(jid), run_id=run_id, target=T, kind="test", step=jid.step, name="many", rev=REV,
                        status="passed", attempt=1, worker="w", started_at=1.0, finished_at=2.0, cases=cases,
                        host={"hostname": HOST})


@pytest.fixture
def ledger_and_store(minio: MinioServer, tmp_path: Path) -> Iterator[tuple[Ledger, ArtifactStore, ResultsDB]]:
    store = ArtifactStore(minio.s3_config())
    store.ensure_bucket()
    db = ResultsDB(f"sqlite:///{tmp_path / 'results.db'}")
    yield Ledger(db), store, db


def new_run(db: ResultsDB, rec: ResultRecord) -> None:
    """The run of ``rec``, its job submitted once, and the host that signs it registered."""
    assert db.create_run(rec.run_id, REV, [T], [rec.job_id])
    db.set_live(rec.run_id, {rec.job_id: ("queued", 1)})
    Registry(db).add(HOST, KEYS.public_text, ["test"], [T])
    assert claim(Ledger(db), KEYS, rec.job_id, 1, HOST) == "granted"


def count_cases(db: ResultsDB, job_id: str) -> int:
    with db.session() as s:
        return int(s.scalar(select(func.count()).select_from(Case).where(Case.job_id == job_id)) or 0)


def last_delivery(db: ResultsDB) -> DeliveryRow:
    with db.session() as s:
        row = s.scalars(select(DeliveryRow).order_by(DeliveryRow.id.desc()).limit(1)).one()
        s.expunge(row)
        return row


def test_a_record_over_the_envelope_limit_delivers_every_case_through_s3(
        ledger_and_store: tuple[Ledger, ArtifactStore, ResultsDB]) -> None:
    from gearfarm.formats.result import offload_cases

    ledger, store, db = ledger_and_store
    rec = big_record("r-limits-1", 50_000)
    assert len(seal_record(rec, KEYS)) > MAX_ENVELOPE  # the record the farm could never deliver
    new_run(db, rec)
    small, blob = offload_cases(rec)
    body = seal_record(small, KEYS)
    assert len(body) < MAX_ENVELOPE // 8
    assert small.cases == [] and small.cases_count == 50_000 and small.cases_key is not None
    assert small.cases_key.startswith(f"runs/{rec.run_id}/{T}/test-many/")
    # The role policies already allow it: the test role writes there, the collector reads there.
    assert any(_glob(p.format(target=T), small.cases_key) for p in keys.ROLE_WRITES["test"])
    assert any(_glob(p, small.cases_key) for p in keys.ROLE_READS["collector"])
    store.put_bytes(small.cases_key, blob, "application/zstd")
    outcome, got = ledger.accept(body, "collect", store)
    assert outcome == "applied", last_delivery(db).reason
    assert got is not None and len(got.cases) == 50_000
    assert count_cases(db, rec.job_id) == 50_000
    # The report and the dashboard read the stored record: every case is in it.
    stored = db.jobs(rec.run_id)[0]
    assert len(stored.cases) == 50_000 and stored.cases[-1].name == "case 50000"
    # The same record again (the reconcile from S3) is the same delivery: one digest either way.
    assert ledger.accept(body, "reconcile", store)[0] == "duplicate"
    assert stored.digest == small.digest == got.digest


def _glob(pattern: str, key: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(key, pattern)


@pytest.mark.parametrize("attack", ["tampered", "truncated", "count", "missing", "elsewhere", "no-store"])
def test_cases_that_do_not_match_the_signed_digest_reject_the_record(
        ledger_and_store: tuple[Ledger, ArtifactStore, ResultsDB], attack: str) -> None:
    from gearfarm.formats.result import cases_blob, offload_cases

    ledger, store, db = ledger_and_store
    rec = big_record(f"r-limits-{attack}", 4000)
    new_run(db, rec)
    small, blob = offload_cases(rec)
    assert small.cases_key is not None
    expect = {"tampered": "sha256", "truncated": "sha256", "count": "count", "missing": "missing",
              "elsewhere": "not this job's", "no-store": "no S3 store"}[attack]
    if attack == "tampered":
        # Another list of cases, with one failed, under the key the record names.
        worse = [c.model_copy(update={"status": "failed"}) if i == 7 else c for i, c in enumerate(rec.cases)]
        store.put_bytes(small.cases_key, cases_blob(worse), "application/zstd")
    elif attack == "truncated":
        store.put_bytes(small.cases_key, blob[: len(blob) // 2], "application/zstd")
    elif attack == "count":
        # A record signed with a count its cases do not have (a worker bug): said, not trusted.
        small = small.model_copy(update={"cases_count": 4001})
        store.put_bytes(small.cases_key, blob, "application/zstd")
    elif attack == "elsewhere":
        other = keys.job_file(rec.run_id, T, "build", "cases.json.zst")
        small = small.model_copy(update={"cases_key": other})
        store.put_bytes(other, blob, "application/zstd")
    elif attack == "no-store":
        store.put_bytes(small.cases_key, blob, "application/zstd")
    outcome, got = ledger.accept(seal_record(small, KEYS), "collect", None if attack == "no-store" else store)
    assert (outcome, got) == ("rejected", None)
    reason = last_delivery(db).reason
    assert expect in reason and rec.job_id in reason, reason
    assert count_cases(db, rec.job_id) == 0
    assert db.jobs(rec.run_id) == []


def test_a_spooled_record_sends_its_cases_first_and_reconcile_reads_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's side: a record too large for its envelope goes out with its cases in S3; when
    it cannot be delivered its cases wait in the spool beside it, go to S3 before it does, and
    the nightly's reconcile from S3 records every case. (No collector answers here: the record
    has its copy in S3 and stays spooled until one does.)"""
    from gearfarm.config import Config, GearmanConfig
    from gearfarm.formats.result import peek_record
    from gearfarm.hosts.gearmand import Gearmand
    from gearfarm.run.nightly import reconcile
    from gearfarm.workers import base
    from gearfarm.workers.base import Context
    from tests.farmkit import keyed

    monkeypatch.setattr(base, "PUBLISH_WAIT", 1.0)

    db_url = f"sqlite:///{tmp_path / 'results.db'}"
    with Gearmand(tmp_path / "gm") as gm, MinioServer(tmp_path / "minio") as minio:
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]), s3=minio.s3_config(),
                     farm=FarmConfig(repo=str(tmp_path), state_dir=str(tmp_path / "state"),
                                     **keyed(tmp_path / "state", db_url, host=HOST)))  # type: ignore[arg-type]
        ctx = Context(cfg, "test")
        rec = big_record("r-limits-spool", 50_000)
        gm.stop()
        ctx.deliver(rec)  # the collector is away: spooled, not lost
        spooled = list(ctx.spool.glob("*.json"))
        assert len(spooled) == 1 and len(spooled[0].read_bytes()) <= MAX_ENVELOPE
        sealed = peek_record(spooled[0].read_bytes())
        assert sealed.cases == [] and sealed.cases_count == 50_000 and sealed.cases_key is not None
        assert [f.name for f in (ctx.spool / "cases").iterdir()] == [f"{sealed.cases_sha256}.json.zst"]
        ctx.store.delete([sealed.cases_key])  # as if S3 never got them
        gm.start()  # same port
        ctx.flush_spool()
        assert list(ctx.spool.glob("*.json")) == spooled and list((ctx.spool / "cases").iterdir()) == []
        assert ctx.store.exists(sealed.cases_key)
        assert [k for k in ctx.store.list(f"runs/{rec.run_id}/") if "/results/" in k]  # its copy, for the reconcile
        db = ResultsDB(db_url)
        assert db.create_run(rec.run_id, REV, [T], [rec.job_id])
        db.set_live(rec.run_id, {rec.job_id: ("queued", 1)})
        assert claim(Ledger(db), ctx.signer, rec.job_id, 1, HOST) == "granted"
        assert reconcile(Ledger(db), ctx.store, rec.run_id, set()) == 1
        assert count_cases(db, rec.job_id) == 50_000
        ctx.client.close()


def test_huge_message_and_log_tail_cannot_push_a_record_over_the_limit() -> None:
    from gearfarm.formats.result import bounded

    rec = big_record("r-limits-msg", 1).model_copy(update={
        "message": "\u2603" * 1_000_000, "log_tail": "\U0001f4a5" * 1_000_000, "status": "failed"})
    small = bounded(rec)
    body = seal_record(small, KEYS)
    assert len(body) < MAX_ENVELOPE // 2
    assert small.message.startswith("\u2603") and "characters cut" in small.message
    # The tail is the end of the log: it keeps the end.
    assert small.log_tail.endswith("\U0001f4a5") and "characters cut" in small.log_tail


def test_a_record_that_fits_is_sealed_as_before() -> None:
    """Byte for byte: a collector of an earlier release (which forbids unknown fields) reads it,
    and its digest (its identity in the ledger) is the one it had."""
    import hashlib

    from gearfarm.formats.result import fit
    from gearfarm.formats.seal import canonical

    rec = big_record("r-limits-small", 3)
    got, body, blob = fit(rec, KEYS)
    assert got == rec and blob is None
    sealed = json.loads(body)["body"]
    assert not {"cases_key", "cases_sha256", "cases_count", "manifest_sha256"} & set(sealed)
    assert len(sealed["cases"]) == 3
    assert rec.digest == hashlib.sha256(canonical(sealed)).hexdigest()


def test_a_case_with_a_name_longer_than_its_column_is_recorded(db_url: str) -> None:
    """A suite printing a 5,000-character test name: the record is applied with the name cut to
    what the cases table holds, not refused by PostgreSQL (which the collector would take for an
    outage and retry forever)."""
    db = ResultsDB(db_url)
    rec = big_record("r-limits-names", 2)
    rec.cases[0] = CaseResult(classname="c" * 5000, name="n" * 5000, status="failed", message="m" * 9000)
    new_run(db, rec)
    assert Ledger(db).apply(rec, "collect") == "applied"
    with db.session() as s:
        names = sorted(s.scalars(select(Case.name).where(Case.job_id == rec.job_id)).all(), key=len)
    assert names[0] == "case 2" and names[1].startswith("nnn") and 200 <= len(names[1]) <= 300


# -- the farm: a 50,000-case suite and a 1 GiB log ---------------------------------------------

CATALOG = """schema = 2

[build]
argv = ["sh", "-c", "echo built > built.txt"]
outputs = ["built.txt", "many.sh", "flood.sh"]
timeout = 120

[suites.many]
description = "50,000 passing TAP cases"
argv = ["sh", "{root}/many.sh"]
format = "tap"
timeout = 600

[suites.flood]
description = "1 GiB on stdout"
argv = ["sh", "{root}/flood.sh"]
format = "exit-code"
timeout = 600

[targets.linux-x86_64]
tools = ["sh", "awk"]
suites = ["many", "flood"]
"""
MANY = """awk 'BEGIN{print "1..50000"; for(i=1;i<=50000;i++) print "ok " i " - case " i}'\n"""


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("limits")
    repo, state = base / "limits", base / "state"
    (base / "no-repo").mkdir()
    repo.mkdir()
    _init(repo, {"jobs/catalog.toml": CATALOG, "many.sh": MANY, "flood.sh": FLOOD.format(n=GiB) + "\n"})
    # Confined as every job is: the flood comes from the job's uid, through the sandbox.
    farm = EmbeddedFarm(state, base / "no-repo", projects=[ProjectConfig(name="limits", repo=str(repo))], slots=1)
    try:
        farm.start(catalog_mod.parse(CATALOG, "limits"))
        p = gearfarm("nightly", "--config", str(farm.config_path), "--benchmarks", "none", timeout=1200)
        # The worker's own peak, from the kernel (VmHWM), while it still runs.
        worker = farm.procs["slot-1"].pid  # type: ignore[attr-defined]
        status = Path(f"/proc/{worker}/status").read_text()
        hwm_kib = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
        restarts = dict(farm.restarts)
    finally:
        farm.stop()
    cfg = config_mod.load(farm.config_path)
    run_dir = next(d for d in (state / "runs").iterdir() if d.is_dir() and not d.name.endswith(".rerun"))
    yield {"p": p, "db": ResultsDB(cfg.database.url), "run_dir": run_dir, "hwm_kib": hwm_kib, "cfg": cfg,
           "restarts": restarts}


def test_a_suite_of_50000_cases_reports_every_case(night: dict[str, Any]) -> None:
    p, db, run_dir = night["p"], night["db"], night["run_dir"]
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run_id = run_dir.name
    many = next(r for r in db.jobs(run_id) if r.step == "test-many")
    assert (many.status, many.attempt) == ("passed", 1), many.message
    assert count_cases(db, many.job_id) == 50_000
    assert len(many.cases) == 50_000 and many.cases_count == 50_000 and many.cases_sha256
    with db.session() as s:
        rejected = s.scalars(select(DeliveryRow.reason).where(DeliveryRow.outcome == "rejected")).all()
    assert rejected == []
    # The report: the run's JUnit file has every case of the suite.
    suites = ET.parse(run_dir / "junit.xml").getroot()
    suite = next(s for s in suites.iter("testsuite") if s.get("name") == f"{T}.test-many")
    assert len(suite.findall("testcase")) == 50_000
    # The dashboard: a case from the end of the suite has its result in this run.
    from gearfarm.web import dashboard

    seen = dashboard.test(db, "many/case 49999")
    assert [(x["run_id"], x["status"]) for t in seen["targets"] for x in t["results"]] == [(run_id, "passed")]


def test_a_1gib_log_is_capped_with_a_note_and_the_worker_stays_small(night: dict[str, Any]) -> None:
    db, run_dir = night["db"], night["run_dir"]
    flood = next(r for r in db.jobs(run_dir.name) if r.step == "test-flood")
    assert (flood.status, flood.attempt) == ("passed", 1), flood.message
    log = run_dir / "logs" / T / "test-flood" / "log.txt"
    size = log.stat().st_size
    assert size <= 64 * MiB + 8192, f"the stored log is {size} bytes"
    with log.open("rb") as f:
        head = f.read(64 * 1024)
        f.seek(-4096, 2)
        tail = f.read()
    tail, ended = _ended(tail)
    assert b"first-line-of-the-flood\n" in head and tail.endswith(b"last-line-of-the-flood\n")
    assert ended.startswith(b"--- exit status 0 after ")
    notes = [line for line in _lines_with(log, b"bytes of output dropped here")]
    assert len(notes) == 1 and b"[farm] log_limit" in notes[0], notes
    assert night["restarts"] == {}, "a worker died on the way"
    assert night["hwm_kib"] < 300 * 1024, f"the worker peaked at {night['hwm_kib']} KiB"
