"""The worker runtime: a record goes to the collector, and to S3 as well only when the collector
does not answer; a record that cannot be reported (job server down) waits in the local spool,
sealed, and is delivered when the server is back, also by a restarted worker; a spool file
that cannot be read is set aside and never blocks the others."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gearfarm.config import Config, FarmConfig, GearmanConfig
from gearfarm.formats.result import ResultRecord, open_record
from gearfarm.formats.seal import keyring
from gearfarm.gearman import admin
from gearfarm.hosts.gearmand import Gearmand
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.s3 import keys
from gearfarm.workers import base
from gearfarm.workers.base import Context
from tests.farmkit import keyed, wait_for
from tests.workers.test_admission import Collector


def rec(step: str) -> ResultRecord:
    return ResultRecord(job_id=f"r1:linux-x86_64:{step}", run_id="r1", target="linux-x86_64", kind="test",
                        step=step, name=step[5:], rev="a" * 40, status="passed")


@contextlib.contextmanager
def collector(cfg: Config) -> Iterator[Collector]:
    """`collect` answered as the collector answers a record ("applied"); what it got is kept."""
    c = Collector(cfg, Path("/nonexistent"), cfg.host_signer())
    c.thread.start()
    try:
        registered(cfg)
        yield c
    finally:
        c.stop.set()
        c.worker.wake()
        c.thread.join(10)


def registered(cfg: Config) -> None:
    """Wait until a worker of `collect` is registered with gearmand (again, after a restart)."""
    host, port = cfg.gearman.addresses()[0]
    wait_for("a worker of collect", lambda: getattr(admin.status(host, port).get("collect"), "workers", 0) > 0)


def copies(ctx: Context) -> int:
    """The records' copies in S3."""
    return len([k for k in ctx.store.list("runs/r1/") if "/results/" in k])


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Config, Gearmand, MinioServer]]:
    farm = keyed(tmp_path / "state", f"sqlite:///{tmp_path / 'r.db'}")
    with Gearmand(tmp_path / "gm") as gm, MinioServer(tmp_path / "minio") as minio:
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]), s3=minio.s3_config(),
                     farm=FarmConfig(repo=str(tmp_path), state_dir=str(tmp_path / "state"), **farm))  # type: ignore[arg-type]
        yield cfg, gm, minio


def test_undeliverable_results_are_spooled_and_delivered_later(lab: tuple[Config, Gearmand, MinioServer]) -> None:
    cfg, gm, _ = lab
    record = rec("test-unit")
    ctx = Context(cfg, "test")
    host = keyring([ctx.signer.public_text])
    gm.stop()
    ctx.deliver(record)  # gearmand is down: must not raise, must not lose it
    spooled = list(ctx.spool.glob("*.json"))
    assert len(spooled) == 1 and open_record(spooled[0].read_bytes(), host) == (record, ctx.signer.kid)
    assert list(ctx.spool.glob(".tmp-*")) == []  # written atomically: no temp file left
    # No collector answered: S3 got the durable, sealed copy the nightly reconciles from.
    stored = [k for k in ctx.store.list("runs/r1/") if k.endswith(".json")]
    assert stored == [keys.result("r1", "linux-x86_64", "test-unit", 1, record.digest)]
    # A torn or foreign file in the spool must not jam it.
    (ctx.spool / "0-torn.json").write_bytes(b'{"purpose": "result", "bo')
    (ctx.spool / "1-foreign.json").write_bytes(b'{"purpose": "result", "body": {"status": "bogus"}}')

    gm.start()  # same port
    with collector(cfg) as got:
        later = Context(cfg, "test")  # a restarted worker of the same host and role
        assert later.spool == ctx.spool
        later.flush_spool()
        assert list(ctx.spool.glob("*.json")) == []
        assert sorted(p.name for p in (ctx.spool / "unreadable").iterdir()) == ["0-torn.json", "1-foreign.json"]
        assert [open_record(r, host)[0] for r in got.records] == [record]
    ctx.client.close()
    later.client.close()


def test_a_posted_record_is_spooled_at_once_and_published_from_there(
        lab: tuple[Config, Gearmand, MinioServer], tmp_path: Path) -> None:
    """A slot does not wait for its record to reach the collector: the record is in the spool
    (durable) when post returns, the outbox publishes it and empties the spool, writing no S3
    copy once the collector answered; one it could not publish (the collector's gearmand away)
    has its copy in S3 and stays in the spool for the flush loop."""
    cfg, gm, _ = lab
    ctx = Context(cfg, "test")
    with collector(cfg) as got:
        ctx.post(rec("test-unit"))
        assert ctx.drain(30) and list(ctx.spool.glob("*.json")) == []
        assert len(got.records) == 1 and copies(ctx) == 0
        gm.stop()
        ctx.post(rec("test-model"))
        spooled = list(ctx.spool.glob("*.json"))
        assert len(spooled) == 1, "in the spool when post returned"
        assert ctx.drain(60)
        assert list(ctx.spool.glob("*.json")) == spooled, "not published: it waits in the spool"
        assert copies(ctx) == 1, "without the collector's answer, its copy is in S3"
        gm.start()  # same port, an empty queue
        registered(cfg)
        ctx.flush_spool()
        assert list(ctx.spool.glob("*.json")) == [] and len(got.records) == 2
        # A spool that cannot be written (a full disk, say): the record is delivered at once.
        (tmp_path / "a-file").write_text("")
        ctx.spool = tmp_path / "a-file" / "spool"
        ctx.post(rec("test-recovery"))
        assert len(got.records) == 3 and copies(ctx) == 1
    ctx.client.close()


def test_a_records_publish_does_not_wait_for_its_spool_write(
        lab: tuple[Config, Gearmand, MinioServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """A record goes to the collector while its spool file is written, not after: the write (a
    new file's fsync) was a quarter of a record's way to the ledger. Here the disk is slow: the
    spool's write waits up to 10 s for the collector to have the record, which it has only if
    the publish did not wait for the write; post still returns only once the record is in the
    spool, and the file written after the publish goes."""
    cfg, _, _ = lab
    ctx = Context(cfg, "test")
    write = ctx._spool_write
    arrived: list[bool] = []
    with collector(cfg) as got:
        def slow_disk(r: ResultRecord, body: bytes, path: Path | None = None) -> Path:
            arrived.append(wait_for_quietly(lambda: len(got.records) == 1, 10.0))
            return write(r, body, path)

        monkeypatch.setattr(ctx, "_spool_write", slow_disk)
        t0 = time.monotonic()
        ctx.post(rec("test-unit"))
        assert arrived == [True], "the collector had not the record while its spool file was written"
        assert time.monotonic() - t0 < 10.0
        assert ctx.drain(30) and list(ctx.spool.glob("*.json")) == [], "the file written after the publish stays"
        assert len(got.records) == 1 and copies(ctx) == 0
    ctx.close()


def wait_for_quietly(cond: Callable[[], bool], timeout: float) -> bool:
    """Whether ``cond`` held within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_with_the_collector_answering_an_s3_outage_holds_no_record_back(
        lab: tuple[Config, Gearmand, MinioServer]) -> None:
    """A record the collector answered needs no S3 copy: with S3 away the result reaches the
    ledger at once and leaves the spool."""
    cfg, _, minio = lab
    ctx = Context(cfg, "test")
    with collector(cfg) as got:
        minio.stop()
        ctx.post(rec("test-unit"))
        assert ctx.drain(30) and list(ctx.spool.glob("*.json")) == [] and len(got.records) == 1
        minio.start()
        assert copies(ctx) == 0
    ctx.client.close()


def test_a_sibling_worker_leaves_a_live_workers_spooled_record_to_it_and_delivers_a_dead_ones(
        lab: tuple[Config, Gearmand, MinioServer]) -> None:
    """The two slots of a host share its spool. A record one of them posted is its own outbox's
    while it lives (the other delivering it too sent every record twice when the outboxes ran
    behind); once it is gone, the other delivers it."""
    cfg, gm, _ = lab
    one, two = Context(cfg, "test"), Context(cfg, "test")
    gm.stop()
    one.post(rec("test-unit"))
    assert one.drain(30) and len(list(one.spool.glob("*.json"))) == 1, "its outbox could not send it"
    gm.start()
    with collector(cfg) as got:
        two.flush_spool()
        assert len(list(one.spool.glob("*.json"))) == 1 and got.records == [], "the sibling sent a live worker's record"
        one.close()
        two.flush_spool()
        assert list(one.spool.glob("*.json")) == [] and len(got.records) == 1
        assert list(one.spool.glob("owners/*")) == [], "the gone worker's lock file is left"
    two.close()


def test_a_flush_of_an_empty_spool_asks_no_sibling_s_lock_after_the_first(
        lab: tuple[Config, Gearmand, MinioServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every slot flushes its host's spool every 5 s. It asked every sibling's owner lock each
    time, which on a state directory shared by many slots (a big host, or bench/scale.py's lab
    of 128) was slots x slots lock checks every 5 s. Now a dead sibling's lock file goes at the
    first flush of each process, or when a record it left is found: later flushes of an empty
    spool ask none, and nothing a dead sibling left is lost."""
    cfg, gm, _ = lab
    ctx = Context(cfg, "test")
    owners = ctx.spool / "owners"
    owners.mkdir(parents=True, exist_ok=True)
    held = []
    for n in range(40):  # live siblings: their lock files held as their processes hold them
        fd = os.open(owners / f"live-{n}", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)
    (owners / "dead-0").touch()  # a sibling gone without its lock file
    asked: list[str] = []
    alive = ctx._alive
    monkeypatch.setattr(ctx, "_alive", lambda owner: asked.append(owner) or alive(owner))
    try:
        ctx.flush_spool()
        assert len(asked) == 41 and not (owners / "dead-0").exists(), "the first flush sweeps every lock"
        asked.clear()
        for _ in range(5):
            ctx.flush_spool()
        assert asked == [], f"later flushes of an empty spool asked {len(asked)} locks"
        # A record a sibling left when it died is still delivered by the next flush, and its lock goes.
        gone = Context(cfg, "test")
        gm.stop()
        gone.post(rec("test-unit"))
        assert gone.drain(30) and len(list(ctx.spool.glob("*.json"))) == 1, "its outbox could not send it"
        gm.start()
        gone.close()
        with collector(cfg) as got:
            ctx.flush_spool()
            assert list(ctx.spool.glob("*.json")) == [] and len(got.records) == 1
            assert asked == [gone.owner] and not (owners / gone.owner).exists()
    finally:
        for fd in held:
            os.close(fd)
        ctx.close()


def test_a_slot_takes_no_job_while_its_outbox_is_more_than_a_record_behind(
        lab: tuple[Config, Gearmand, MinioServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """The outbox publishes while the slot runs its next job, but it does not fall further
    behind: posting waits while an earlier record is still being published (a host short of CPU
    once left records minutes in its outbox, and the nightly took their jobs for lost). Here no
    collector answers: each record waits PUBLISH_WAIT for it, then has its S3 copy written and
    stays spooled, until one answers."""
    cfg, _, _ = lab
    monkeypatch.setattr(base, "PUBLISH_WAIT", 2.0)
    ctx = Context(cfg, "test")
    took = []
    for step in ("test-unit", "test-model", "test-recovery"):
        t0 = time.monotonic()
        ctx.post(rec(step))
        took.append(time.monotonic() - t0)
    assert took[0] < 1.0 and min(took[1:]) >= 1.0, f"posts took {took}: the outbox ran more than one behind"
    assert ctx.drain(60)
    assert len(list(ctx.spool.glob("*.json"))) == 3 and copies(ctx) == 3
    with collector(cfg) as got:
        ctx.flush_spool()
        assert list(ctx.spool.glob("*.json")) == [] and len(got.records) >= 3
    ctx.close()


def test_the_heartbeats_look_for_a_cancel_does_not_wait_out_an_s3_outage(tmp_path: Path) -> None:
    """The heartbeat is the job's lease (WORK_STATUS every 5 s, lease_timeout 60 s): its look
    for a cancel marker must give up at once when S3 is away, while the job's own S3 calls
    (the normal store) keep waiting the outage out."""
    from gearfarm.config import S3Config
    from gearfarm.formats.job import Payload
    from gearfarm.hosts.net import free_port
    from gearfarm.s3.store import StoreError

    dead = S3Config(endpoint=f"http://127.0.0.1:{free_port()}", secret_key="x")  # nothing listens
    farm = keyed(tmp_path / "state", f"sqlite:///{tmp_path / 'r.db'}")
    cfg = Config(gearman=GearmanConfig(servers=["127.0.0.1:1"]), s3=dead,
                 farm=FarmConfig(repo=str(tmp_path), state_dir=str(tmp_path / "state"), **farm))  # type: ignore[arg-type]
    ctx = Context(cfg, "test")
    p = Payload.model_construct(run_id="r1", target="linux-x86_64", kind="test", name="unit")
    t0 = time.monotonic()
    try:
        ctx.cancelled(p)
    except StoreError as e:
        assert "127.0.0.1" in str(e)
    else:
        raise AssertionError("a dead S3 answered")
    assert time.monotonic() - t0 < 10
    assert ctx.store.retry_for >= 60 and ctx.quick_store.retry_for == 0


def test_a_heartbeats_look_for_a_cancel_is_one_request_and_finds_the_jobs_or_the_runs_marker(tmp_path: Path) -> None:
    """Every running job looks for a cancel at every beat, so the look is one S3 request (a LIST
    of the run's markers), not a GET of each of two keys that nearly always answer 404. It still
    obeys the nightly's marker at the job's key or the run's, and no other job's."""
    from gearfarm.formats.job import Payload
    from gearfarm.formats.marker import Marker, sealed

    farm = keyed(tmp_path / "state", f"sqlite:///{tmp_path / 'r.db'}")
    with MinioServer(tmp_path / "minio") as minio:
        cfg = Config(gearman=GearmanConfig(servers=["127.0.0.1:1"]), s3=minio.s3_config(),
                     farm=FarmConfig(repo=str(tmp_path), state_dir=str(tmp_path / "state"), **farm))  # type: ignore[arg-type]
        ctx = Context(cfg, "test")
        requests: list[str] = []
        ctx.quick_store.s3.meta.events.register("before-send.s3", lambda request, **_: requests.append(request.method))
        p = Payload.model_construct(run_id="r1", target="linux-x86_64", kind="test", name="unit", job_id="j")

        def look() -> tuple[bool, int]:
            requests.clear()
            return ctx.cancelled(p), len(requests)

        def mark(m: Marker) -> None:
            ctx.store.put_bytes(m.key, sealed(cfg.nightly_signer(), m), "application/json")

        assert look() == (False, 1)  # a night nobody cancels: one request a beat
        mark(Marker("cancel", "r1", "linux-x86_64", "test-other", "carol", 1.0))  # another job of the run
        mark(Marker("cancel", "r0"))  # another run
        assert look() == (False, 1)
        mark(Marker("cancel", "r1", "linux-x86_64", "test-unit", "carol", 1.0))
        assert look() == (True, 2)  # listed, then read and its seal checked
        ctx.store.delete([keys.cancel("r1", "linux-x86_64", "test-unit")])
        mark(Marker("cancel", "r1", who="carol", at=1.0))
        assert look() == (True, 2)
        ctx.close()


def test_a_worker_without_the_keys_it_needs_refuses_to_start_saying_how_to_get_them(tmp_path: Path) -> None:
    """A worker verifies payloads with the nightly's public key and signs with its own: without
    either it would run nothing or deliver nothing the ledger accepts, so it does not start. A
    config still holding the shared HMAC keys of old is refused, naming what replaced them."""
    from gearfarm.formats.seal import Signer
    from tests.farmkit import gearfarm

    nightly = Signer.generate().public_text
    cases = {
        "[farm] nightly_keys is empty": "",
        "[farm] host_key is not set": f'nightly_keys = ["{nightly}"]\n',
        "the farm's shared HMAC keys are gone": 'secrets = ["' + "k" * 40 + '"]\n',
        "host_key: cannot read the signing key": f'nightly_keys = ["{nightly}"]\nhost_key = "missing.key"\n',
    }
    for said, farm in cases.items():
        config = tmp_path / "farm.toml"
        config.write_text(f'[farm]\nstate_dir = "state"\n{farm}')
        p = gearfarm("worker", "--role", "test", "--targets", "linux-x86_64", "--config", str(config), timeout=120)
        assert p.returncode == 2 and said in p.stderr, (said, p.stderr[-2000:])
