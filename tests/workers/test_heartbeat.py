"""A running job's heartbeats (workers.base.Heartbeat), with a real gearmand, MinIO and test
worker: the ledger's answer to a signed beat is how the job learns it was cancelled, so while
the ledger answers, no beat asks S3 anything; only a beat left unanswered (the collector away)
looks for the nightly's signed marker in S3 instead. The collector is the test's own Gearman
worker of `collect` (tests.workers.test_admission), to answer beats as the test says."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gearfarm.config import Config
from gearfarm.formats.job import JobId, Source, make_payload, sign
from gearfarm.formats.lease import Lease, open_lease
from gearfarm.formats.marker import Marker, sealed
from gearfarm.formats.result import open_record, unpack_file
from gearfarm.formats.seal import keyring
from gearfarm.gearman import Job
from gearfarm.hosts.connection import gearman_client
from gearfarm.run import snapshot
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore
from gearfarm.workers import base
from gearfarm.workers import test as test_worker
from gearfarm.workers.collector import is_lease
from tests.farmkit import descendants, wait_for
from tests.workers.test_admission import REV, TARGET, Collector, farm, stored  # noqa: F401 - farm: the fixture

# A heartbeat every 0.2 s here (5 s in a farm), a signed beat every second of them.
BEAT = 0.2


class Ledger(Collector):
    """Claims granted; each signed beat (a lease's beat > 0) kept and answered by ``on_beat``."""

    def __init__(self, cfg: Config, work: Path, on_beat: Callable[[Lease], bytes]) -> None:
        super().__init__(cfg, work, cfg.host_signer())
        self.on_beat = on_beat
        self.beats: list[Lease] = []

    def handle(self, job: Job) -> bytes:
        if is_lease(job.data):
            lease, _ = open_lease(job.data, self.lookup)
            if not lease.beat:
                return b"granted "
            self.beats.append(lease)
            return self.on_beat(lease)
        return super().handle(job)


def test_a_running_job_learns_its_cancel_from_the_ledgers_answer_and_asks_s3_only_when_unanswered(
        farm: tuple[Config, Path], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811 - the fixture
    cfg, tmp_path = farm
    monkeypatch.setattr(base, "HEARTBEAT_SECONDS", BEAT)
    looks: list[str] = []  # the S3 requests of cancel looks: LISTs under cancels/
    listing = ArtifactStore.list

    def counted(self: ArtifactStore, prefix: str):  # noqa: ANN202 - ArtifactStore.list's own
        if prefix.startswith("cancels/"):
            looks.append(prefix)
        return listing(self, prefix)

    monkeypatch.setattr(ArtifactStore, "list", counted)
    store = ArtifactStore(cfg.s3)
    cat_sha, art = stored(cfg, tmp_path)
    nightly = cfg.nightly_signer()
    answers: dict[str, Callable[[Lease], bytes]] = {}
    ledger = Ledger(cfg, tmp_path / "state" / "work", lambda lease: answers[lease.job_id.split(":")[0]](lease))
    ledger.thread.start()
    stop = threading.Event()
    slot = threading.Thread(target=base.serve, args=(cfg, [("test", f"test:{TARGET}", test_worker.handle)], stop),
                            daemon=True)
    slot.start()
    client = gearman_client(cfg)
    lookup = keyring([cfg.host_signer().public_text])
    try:
        def run(run_id: str) -> tuple[str, float, int]:
            """The job's record status, its seconds and the signed beats it sent."""
            jid = JobId(run_id, TARGET, "test-slow")
            p = make_payload(jid, source=Source("heartbeat", REV, "5" * 64, cat_sha), deadline=time.time() + 600,
                             artifact=art)
            t0, before = time.monotonic(), len(ledger.beats)
            done = client.submit(f"test:{TARGET}", sign(p, nightly), unique=p.unique, timeout=60)
            seconds = time.monotonic() - t0
            assert done == f"{jid} cancelled".encode(), done
            # The record goes from the spool after the job's answer (the slot's outbox).
            wait_for("the job's record", lambda: any(str(jid).encode() in r for r in ledger.records), 10)
            rec, _ = open_record(next(r for r in ledger.records if str(jid).encode() in r), lookup)
            return rec.status, seconds, len(ledger.beats) - before

        # The ledger answers: granted for three signed beats, then cancelled. Not one look in S3.
        answers["told"] = lambda lease: b"granted " if lease.beat < 6 else b"cancelled it was cancelled"
        status, seconds, beats = run("told")
        assert status == "cancelled" and seconds < 10, (status, seconds)  # its 30 s command stopped
        assert beats >= 3 and looks == [], (beats, looks)

        # The ledger does not answer (each signed beat waits beyond a heartbeat): the nightly's
        # signed marker in S3 stops the job, and a marker it did not sign would not have.
        store.put_bytes(keys.cancel("untold", TARGET, "test-slow"),
                        sealed(cfg.host_signer(), Marker("cancel", "untold", TARGET, "test-slow", "intruder", 1.0)))
        marked = threading.Timer(3.0, lambda: store.put_bytes(
            keys.cancel("untold"), sealed(nightly, Marker("cancel", "untold", who="carol", at=1.0))))
        marked.start()

        def silent(lease: Lease) -> bytes:
            time.sleep(3 * BEAT)
            return b"granted "

        answers["untold"] = silent
        status, seconds, _ = run("untold")
        assert status == "cancelled" and 3 < seconds < 12, (status, seconds)
        assert looks and set(looks) == {keys.cancels("untold")}, looks
    finally:
        stop.set()
        ledger.stop.set()
        client.close()
        slot.join(30)
        ledger.worker.wake()
        ledger.thread.join(10)


# A suite that ignores SIGTERM everywhere, with a child in a session of its own, and would run
# for a year: the kind a catalog's huge timeout lets hold a slot (issue #76, case 3). SLEEPER is
# in the command lines of all four of its processes, which the test finds below its own pid.
SLEEPER = "31536017"
HANGING = f"""schema = 2

[build]
argv = ["true"]
outputs = ["gfe"]
timeout = 60

[suites.hang]
argv = ["sh", "-c", "trap '' TERM INT HUP; setsid sh -c \\"trap '' TERM; sleep {SLEEPER}\\" & sleep {SLEEPER} & \
echo started; while :; do sleep 1; done", "{SLEEPER}"]
format = "tap"
timeout = 31536000

[targets.linux-x86_64]
tools = ["sh"]
suites = ["hang"]
"""


def _hanging() -> list[int]:
    """The pids of the hanging suite's own processes (two shells, two sleeps; not the sandbox's)
    that this test's slot started."""
    return [pid for pid, argv in descendants([os.getpid()]).items()
            if argv and argv[0] in ("sh", "sleep") and SLEEPER in " ".join(argv)]


def test_a_job_is_stopped_at_its_runs_deadline_and_when_its_beat_is_refused(
        farm: tuple[Config, Path], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811 - the fixture
    """At its run's deadline a job's whole tree is killed (a suite trapping SIGTERM included) and
    recorded `timed_out`, the project's, with its log; a job whose beat the ledger refuses (its
    run closed) is stopped at once and dropped with no record. Before #76 both ran on: only a
    `cancelled` answer stopped a job, and nothing at all stopped it at its deadline."""
    cfg, tmp_path = farm
    monkeypatch.setattr(base, "HEARTBEAT_SECONDS", BEAT)
    _, art = stored(cfg, tmp_path)
    cat_sha, _ = snapshot.publish_catalog(ArtifactStore(cfg.s3), HANGING)
    nightly = cfg.nightly_signer()
    answers: dict[str, Callable[[Lease], bytes]] = {}
    ledger = Ledger(cfg, tmp_path / "state" / "work", lambda lease: answers[lease.job_id.split(":")[0]](lease))
    ledger.thread.start()
    stop = threading.Event()
    slot = threading.Thread(target=base.serve, args=(cfg, [("test", f"test:{TARGET}", test_worker.handle)], stop),
                            daemon=True)
    slot.start()
    client = gearman_client(cfg)
    lookup = keyring([cfg.host_signer().public_text])
    results: dict[str, bytes] = {}
    try:
        def submit(run_id: str, deadline: float) -> tuple[JobId, threading.Thread]:
            jid = JobId(run_id, TARGET, "test-hang")
            p = make_payload(jid, source=Source("heartbeat", REV, "5" * 64, cat_sha), deadline=deadline, artifact=art)
            t = threading.Thread(target=lambda: results.__setitem__(run_id, client.submit(
                f"test:{TARGET}", sign(p, nightly), unique=p.unique, timeout=120)), daemon=True)
            t.start()
            return jid, t

        # The deadline: 20 s from now (the suite starts well before it on a loaded machine), the
        # ledger granting every beat.
        answers["late"] = lambda lease: b"granted "
        deadline = time.time() + 20
        jid, waiting = submit("late", deadline)
        wait_for("the hanging suite's four processes", lambda: len(_hanging()) == 4, 20)
        gone = wait_for("the suite's processes gone", lambda: not _hanging() and time.time(), 60)
        assert gone - deadline < 10, f"the suite outlived its run's deadline by {gone - deadline:.1f}s"
        waiting.join(30)
        assert results["late"] == f"{jid} timed_out".encode(), results
        wait_for("the job's record", lambda: any(str(jid).encode() in r for r in ledger.records), 10)
        rec, _ = open_record(next(r for r in ledger.records if str(jid).encode() in r), lookup)
        assert rec.status == "timed_out" and "run's deadline" in rec.message, (rec.status, rec.message)
        log = unpack_file(rec.files["log.txt"]).decode()
        assert "started" in log and "killed at its run's deadline" in log, log

        # The ledger refuses the job's third signed beat (its run was reported and closed): the
        # job's tree goes at once, and the job is dropped, with no record.
        answers["closed"] = lambda lease: b"granted " if lease.beat < 6 else b"refused run closed was reported"
        jid, waiting = submit("closed", time.time() + 600)
        wait_for("the hanging suite's four processes", lambda: len(_hanging()) == 4, 20)
        wait_for("the suite's processes gone after a refused beat", lambda: not _hanging(), 20)
        waiting.join(30)
        assert results["closed"].startswith(b"dropped: no longer this worker's to run (refused"), results
        time.sleep(1.0)
        assert not any(str(jid).encode() in r for r in ledger.records)
    finally:
        stop.set()
        ledger.stop.set()
        client.close()
        slot.join(30)
        ledger.worker.wake()
        ledger.thread.join(10)
