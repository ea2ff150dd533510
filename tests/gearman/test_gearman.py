"""Tests of gearfarm.gearman (client, worker, admin, protocol) and gearfarm.hosts.gearmand.

Everything except the pure protocol tests runs against a real gearmand on a free
loopback port (fixture ``gearmand`` in conftest.py), and the interoperability tests
talk to libgearman through the ``gearman`` CLI from gearman-tools.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from gearfarm.gearman import (
    BackgroundJob,
    Client,
    Command,
    Connection,
    GearmanError,
    Job,
    JobFailed,
    ProtocolError,
    ServerError,
    ServerUnavailable,
    Worker,
    admin,
)
from gearfarm.gearman import worker as worker_module
from gearfarm.gearman.client import _PIPELINE_CHUNK
from gearfarm.gearman.errors import StatusUnknown
from gearfarm.gearman.protocol import REQ, RES, decode, encode, format_address
from gearfarm.hosts import gearmand as gearmand_module
from gearfarm.hosts.gearmand import Gearmand, GearmandError
from gearfarm.hosts.net import free_port

FAST = {"poll_interval": 0.1, "max_backoff": 0.3}


@contextmanager
def running(worker: Worker) -> Iterator[threading.Thread]:
    """Run ``worker.work`` in a thread for the duration of the block."""
    stop = threading.Event()
    thread = threading.Thread(target=worker.work, args=(stop,), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(5)
        assert not thread.is_alive(), "worker loop did not stop within 5 s"


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def cap_queue(server: Gearmand, function: str, limit: int) -> None:
    """Cap ``function``'s queue with the admin command ``maxqueue``.

    Past the cap gearmand 1.1.20 answers a submission with ERROR ``QUEUE_ERROR`` /
    ``Job queue is full`` (measured).  The cap only applies to a function gearmand
    already knows (``maxqueue`` on an unknown one says OK and does nothing), so a job
    is queued first; it counts towards the cap.
    """
    with Client([server.address]) as client:
        client.submit_background(function, b"", f"{function}-seed")
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(f"maxqueue {function} {limit}\n".encode())
        assert sock.makefile("rb").readline().strip() == b"OK"


@contextmanager
def fake_server(serve: Callable[[socket.socket], None]) -> Iterator[tuple[int, list[int]]]:
    """A TCP server calling ``serve(conn)`` per connection; yields (port, [accept count])."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    accepted = [0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted[0] += 1
            with conn:
                try:
                    serve(conn)
                except OSError:
                    pass

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield port, accepted
    finally:
        stop.set()
        thread.join(5)
        listener.close()


# -- protocol ----------------------------------------------------------------------------


def test_encode_decode_keeps_nul_bytes_in_last_argument() -> None:
    raw = encode(Command.SUBMIT_JOB_BG, "build", "nightly-1", b"\0bin\0ary\0")
    assert raw[:4] == REQ and int.from_bytes(raw[4:8], "big") == 18
    assert int.from_bytes(raw[8:12], "big") == len(raw) - 12
    packet, used = decode(raw + b"trailing")
    assert used == len(raw)
    assert packet.command is Command.SUBMIT_JOB_BG
    assert packet.args == (b"build", b"nightly-1", b"\0bin\0ary\0")
    with pytest.raises(ValueError):
        encode(Command.SUBMIT_JOB, "bad\0name", "u", b"")
    with pytest.raises(ProtocolError):
        decode(b"HTTP/1.1 200 OK\r\n\r\n")
    with pytest.raises(ProtocolError):
        decode(RES + (999).to_bytes(4, "big") + (0).to_bytes(4, "big"))


def test_connection_reassembles_short_reads_and_rejects_garbage() -> None:
    packets = encode(Command.JOB_CREATED, "H:x:1", magic=RES) + encode(
        Command.WORK_COMPLETE, "H:x:1", b"res\0ult", magic=RES
    )

    def dribble(conn: socket.socket) -> None:
        for i in range(len(packets)):  # one byte per segment
            conn.sendall(packets[i : i + 1])
            time.sleep(0.001)
        conn.recv(1)  # keep open until the client closes

    with fake_server(dribble) as (port, _):
        conn = Connection("127.0.0.1", port).connect()
        assert conn.recv(5).args == (b"H:x:1",)
        assert conn.recv(5).args == (b"H:x:1", b"res\0ult")
        with pytest.raises(TimeoutError):
            conn.recv(0.05)
        conn.close()

    def garbage(conn: socket.socket) -> None:
        conn.sendall(b"ERR nonsense\r\n")
        conn.recv(1)

    with fake_server(garbage) as (port, _):
        conn = Connection("127.0.0.1", port).connect()
        with pytest.raises(ProtocolError):
            conn.recv(5)
        assert not conn.connected


def test_connection_waits_at_most_its_io_timeout_and_spins_for_quick_answers() -> None:
    # A wait as long as the io timeout reads without a poll first (the kernel's receive timeout
    # bounds it); a silent server must still give TimeoutError, with the half packet kept.
    half = encode(Command.JOB_CREATED, "H:x:2", magic=RES)
    released = threading.Event()

    def slow(conn: socket.socket) -> None:
        conn.sendall(half[:5])
        released.wait(5)
        conn.sendall(half[5:])
        conn.recv(1)

    with fake_server(slow) as (port, _):
        conn = Connection("127.0.0.1", port, io_timeout=0.3).connect()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            conn.recv(0.3)
        assert 0.25 <= time.monotonic() - t0 < 2
        with pytest.raises(TimeoutError):
            conn.recv(0.3, spin=0.01)
        released.set()
        # The answer arrives while the reader spins or waits: the first 5 bytes were kept.
        assert conn.recv(5, spin=0.05).args == (b"H:x:2",)
        assert conn.connected
        conn.close()


def test_an_error_before_the_grab_answer_costs_the_worker_nothing() -> None:
    # gearmand answers a bad earlier request (a CAN_DO, a PRE_SLEEP) with ERROR; read inside a
    # grab, it is logged and the grab's own answer is still read: the job runs, and the worker
    # does not send a second grab for the one answer (each extra grab leaves an answer unread).
    got: list[bytes] = []
    grabs_before_result: list[int] = []

    def server(conn: socket.socket) -> None:
        buf = b""
        while b"\0REQ\0\0\0\x1e" not in buf:  # GRAB_JOB_UNIQ
            buf += conn.recv(4096)
        conn.sendall(encode(Command.ERROR, "ERR_BAD", "earlier request", magic=RES))
        time.sleep(0.05)  # the worker has read the ERROR before the answer comes
        conn.sendall(encode(Command.JOB_ASSIGN_UNIQ, "H:x:7", "f", "u-7", b"payload", magic=RES))
        seen = b""
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return
            seen += chunk
            if b"\0REQ\0\0\0\x0d" in seen and not got:  # WORK_COMPLETE
                got.append(seen)
                grabs_before_result.append(seen.split(b"\0REQ\0\0\0\x0d")[0].count(b"\0REQ\0\0\0\x1e"))
                conn.sendall(encode(Command.NO_JOB, magic=RES))

    with fake_server(server) as (port, _):
        worker = Worker([("127.0.0.1", port)], "after-error", **FAST)
        worker.register("f", lambda job: job.data.upper())
        with running(worker):
            wait_for(lambda: bool(got), 5, "the job's WORK_COMPLETE")
    assert b"H:x:7\0PAYLOAD" in got[0]
    assert grabs_before_result == [0]


def test_connection_speaks_tls(tmp_path: Path) -> None:
    # Debian's gearmand accepts --ssl but is built without TLS (it reads the
    # ClientHello as bad magic), so the TLS path is checked against a Python server.
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI missing")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)

    def echo_over_tls(raw: socket.socket) -> None:
        with server_ctx.wrap_socket(raw, server_side=True) as tls:
            header = tls.recv(12)
            payload = tls.recv(int.from_bytes(header[8:12], "big")) if header[8:12] != bytes(4) else b""
            tls.sendall(encode(Command.ECHO_RES, payload, magic=RES))
            tls.recv(1)

    client_ctx = ssl.create_default_context(cafile=str(cert))
    with fake_server(echo_over_tls) as (port, _):
        conn = Connection("127.0.0.1", port, ssl_context=client_ctx).connect()
        try:
            reply = conn.request(Command.ECHO_REQ, b"secret", timeout=5)
        finally:
            conn.close()
    assert reply.command is Command.ECHO_RES and reply.args == (b"secret",)


def test_connection_sets_tcp_nodelay(gearmand: Gearmand) -> None:
    conn = Connection(*gearmand.address).connect()
    try:
        sock = socket.socket(fileno=socket.dup(conn.fileno()))
        with sock:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        conn.close()


# -- client / worker round trips -------------------------------------------------------


def test_background_job_roundtrip(gearmand: Gearmand) -> None:
    seen: list[tuple[str, str, str, bytes]] = []

    def handler(job: Job) -> bytes:
        seen.append((job.handle, job.function, job.unique, job.data))
        return b"done"

    with Client([gearmand.address]) as client:
        handle = client.submit_background("compile", b"\0payload\xff", "nightly-42")
        assert handle.startswith("H:")
        assert admin.status(*gearmand.address)["compile"].queued == 1
        with Worker([gearmand.address], "bg-worker", **FAST) as worker:
            worker.register("compile", handler)
            assert worker.work_one(5) is True
            assert worker.work_one(0.3) is False
        assert seen == [(handle, "compile", "nightly-42", b"\0payload\xff")]
        wait_for(lambda: admin.status(*gearmand.address)["compile"].queued == 0, 5, "queue to drain")
        assert client.get_status(handle).known is False


def test_foreground_submit_returns_result_and_forwards_status(gearmand: Gearmand) -> None:
    finished: list[Job] = []

    def handler(job: Job) -> bytes:
        # A heartbeat thread sending WORK_STATUS while the handler runs.
        beat = threading.Thread(target=lambda: [job.status(i, 3) for i in range(1, 4)])
        beat.start()
        beat.join()
        finished.append(job)
        return job.data[::-1]

    statuses: list[tuple[int, int]] = []
    worker = Worker([gearmand.address], "fg-worker", **FAST)
    worker.register("reverse", handler)
    with Client([gearmand.address]) as client, running(worker):
        result = client.submit(
            "reverse", b"gearfarm", "fg-1", timeout=10, on_status=lambda n, d: statuses.append((n, d))
        )
    assert result == b"mrafraeg"
    assert statuses == [(1, 3), (2, 3), (3, 3)]
    assert finished[0].status(3, 3) is False, "status after completion must be a no-op"


def test_work_fail_and_exception_raise_job_failed(gearmand: Gearmand) -> None:
    def handler(job: Job) -> bytes:
        raise RuntimeError("compiler exploded")

    worker = Worker([gearmand.address], "failing", **FAST)
    worker.register("explode", handler)
    with Client([gearmand.address]) as client:
        with running(worker), pytest.raises(JobFailed) as info:
            client.submit("explode", b"x", "fail-1", timeout=10)
        assert info.value.handle.startswith("H:") and "\0" not in info.value.handle

        # WORK_EXCEPTION from a raw worker connection carries its text to the client.
        raw = Connection(*gearmand.address).connect()
        raw.send(Command.CAN_DO, "raw-exc")
        result: list[BaseException] = []
        thread = threading.Thread(target=lambda: _capture(result, client.submit, "raw-exc", b"", "exc-1", 10))
        thread.start()
        wait_for(
            lambda: admin.status(*gearmand.address).get("raw-exc", admin.FunctionStatus(0, 0, 0)).queued == 1
        )
        assign = raw.request(Command.GRAB_JOB_UNIQ)
        assert assign.command is Command.JOB_ASSIGN_UNIQ
        raw.send(Command.WORK_EXCEPTION, assign.args[0], b"Traceback: boom")
        thread.join(10)
        raw.close()
    assert isinstance(result[0], JobFailed) and result[0].exception == b"Traceback: boom"


def _capture(out: list[BaseException], fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # the test inspects whatever was raised
        out.append(exc)


def test_foreground_timeout_and_argument_validation(gearmand: Gearmand) -> None:
    with Client([gearmand.address]) as client:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            client.submit("nobody-serves-this", b"", "t-1", timeout=0.3)
        assert time.monotonic() - started < 3
        with pytest.raises(ValueError):
            client.submit_background("f", b"", "")
        with pytest.raises(ValueError):
            client.submit_background("f", b"", "u" * 65)
        with pytest.raises(ValueError):
            client.submit_background("f", b"", "u", priority="urgent")
        assert client.echo(b"still fine") == b"still fine"


def test_sleeping_worker_is_woken_by_noop(gearmand: Gearmand) -> None:
    # poll_interval far above the asserted latency: only PRE_SLEEP/NOOP can wake it.
    with (
        Worker([gearmand.address], "sleeper", poll_interval=3.0) as worker,
        Client([gearmand.address]) as client,
    ):
        worker.register("wake", lambda job: b"")
        timer = threading.Timer(0.3, client.submit_background, args=("wake", b"", "wake-1"))
        timer.start()
        started = time.monotonic()
        assert worker.work_one(3.0) is True
        elapsed = time.monotonic() - started
        timer.join()
    assert elapsed < 1.0, f"worker needed {elapsed:.2f}s to notice a job (NOOP wake-up broken?)"


def test_an_idle_worker_does_its_chores_between_jobs_never_right_after_one(gearmand: Gearmand) -> None:
    """``idle`` runs when the worker found no job twice in a row, not when the grab after a job
    finds none (the next job may be a moment away: chores then would delay it), and a job that
    comes while it is idle is still taken."""
    calls: list[tuple[float, int]] = []
    done: list[float] = []
    worker = Worker([gearmand.address], "chores", poll_interval=0.2, max_backoff=0.3)
    worker.idle = lambda: calls.append((time.monotonic(), len(done)))
    worker.register("job", lambda job: done.append(time.monotonic()) or b"")
    with Client([gearmand.address]) as client, running(worker):
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.02)
        assert calls and calls[0][1] == 0  # idle from the start
        client.submit("job", b"", "chores-1", timeout=10)
        deadline = time.monotonic() + 5
        while not [c for c in calls if c[1] == 1] and time.monotonic() < deadline:
            time.sleep(0.02)
    after = [t for t, n in calls if n == 1]
    assert after, "no chores after the job"
    assert after[0] - done[0] >= 0.15  # a poll_interval after it, not at once


def test_late_result_of_timed_out_job_is_not_returned_to_next_submit(gearmand: Gearmand) -> None:
    def handler(job: Job) -> bytes:
        if job.function == "slow":
            time.sleep(0.4)
        return job.function.encode()

    worker = Worker([gearmand.address], "late", **FAST)
    worker.register("slow", handler)
    worker.register("fast", handler)
    with Client([gearmand.address]) as client, running(worker):
        with pytest.raises(TimeoutError):
            client.submit("slow", b"", "late-slow", timeout=0.1)
        # Same thread, same connection: the slow job's WORK_COMPLETE arrives first.
        assert client.submit("fast", b"", "late-fast", timeout=10) == b"fast"


def test_same_unique_while_queued_is_one_job(gearmand: Gearmand) -> None:
    with Client([gearmand.address]) as client:
        first = client.submit_background("dedup", b"a", "same-unique")
        second = client.submit_background("dedup", b"b", "same-unique")
        other = client.submit_background("dedup", b"c", "other-unique")
    assert first == second and other != first
    assert admin.status(*gearmand.address)["dedup"].queued == 2
    runs: list[tuple[str, bytes]] = []
    with Worker([gearmand.address], "dedup", **FAST) as worker:
        worker.register("dedup", lambda job: runs.append((job.unique, job.data)) or b"")
        while worker.work_one(0.5):
            pass
    assert sorted(runs) == [("other-unique", b"c"), ("same-unique", b"a")]


def test_priorities_are_honoured(gearmand: Gearmand) -> None:
    with Client([gearmand.address]) as client:
        client.submit_background("prio", b"low", "p-low", priority="low")
        client.submit_background("prio", b"normal", "p-normal")
        client.submit_background("prio", b"high", "p-high", priority="high")
    order: list[bytes] = []
    with Worker([gearmand.address], "prio", **FAST) as worker:
        worker.register("prio", lambda job: order.append(job.data) or b"")
        while worker.work_one(0.5):
            pass
    assert order == [b"high", b"normal", b"low"]


def test_worker_serves_several_servers_and_skips_dead_ones(gearmand: Gearmand, tmp_path: Path) -> None:
    second = Gearmand(tmp_path / "second")
    second.start()
    try:
        dead = ("127.0.0.1", free_port())
        for server, unique in ((gearmand, "on-first"), (second, "on-second")):
            with Client([server.address]) as client:
                client.submit_background("multi", b"", unique)
        seen: list[str] = []
        with Worker([dead, gearmand.address, second.address], "multi", **FAST) as worker:
            worker.register("multi", lambda job: seen.append(job.unique) or b"")
            assert worker.work_one(5) and worker.work_one(5)
            assert sorted(seen) == ["on-first", "on-second"]
            ids = {
                addr: [w.client_id for w in admin.workers(*addr)]
                for addr in (gearmand.address, second.address)
            }
        assert all("multi" in listed for listed in ids.values()), ids
    finally:
        second.stop()


# -- admin -----------------------------------------------------------------------------


def test_admin_status_workers_version(gearmand: Gearmand) -> None:
    host, port = gearmand.address
    assert admin.version(host, port).startswith("1.")
    worker = Worker([gearmand.address], "admin-probe", **FAST)
    worker.register("fn-a", lambda job: b"")
    worker.register("fn-b", lambda job: b"")
    with Client([gearmand.address]) as client:
        client.submit_background("fn-c", b"", "queued-only")
        with running(worker):
            # Listed with both functions: gearmand lists the connection as soon as it names
            # itself, before its second CAN_DO has arrived (seen under load).
            wait_for(
                lambda: any(w.client_id == "admin-probe" and len(w.functions) == 2
                            for w in admin.workers(host, port)),
                5,
                "worker listed",
            )
            listed = [w for w in admin.workers(host, port) if w.client_id == "admin-probe"]
            status = admin.status(host, port)
    assert len(listed) == 1
    assert sorted(listed[0].functions) == ["fn-a", "fn-b"]
    assert listed[0].ip == "127.0.0.1" and listed[0].fd > 0
    assert status["fn-a"] == admin.FunctionStatus(queued=0, running=0, workers=1)
    assert status["fn-c"] == admin.FunctionStatus(queued=1, running=0, workers=0)


def test_admin_error_names_the_address() -> None:
    port = free_port()
    with pytest.raises(ServerUnavailable, match=f"127.0.0.1:{port}"):
        admin.status("127.0.0.1", port)


# -- failures, restarts, failover ------------------------------------------------------


def test_client_reports_every_address_when_no_server_answers() -> None:
    ports = [free_port(), free_port()]
    with Client([("127.0.0.1", p) for p in ports], connect_timeout=1) as client:
        with pytest.raises(ServerUnavailable) as info:
            client.submit_background("f", b"", "u")
    for port in ports:
        assert f"127.0.0.1:{port}" in str(info.value)


def test_client_fails_over_to_next_server(gearmand: Gearmand) -> None:
    dead = ("127.0.0.1", free_port())
    with Client([dead, gearmand.address], connect_timeout=1) as client:
        assert client.echo(b"x") == b"x"
        client.submit_background("failover", b"", "fo-1")
    assert admin.status(*gearmand.address)["failover"].queued == 1


def test_client_reconnects_after_server_restart(gearmand: Gearmand) -> None:
    with Client([gearmand.address]) as client:
        client.submit_background("restart", b"", "before")
        address = gearmand.address
        gearmand.restart()
        assert gearmand.address == address
        client.submit_background("restart", b"", "after-restart")
        gearmand.kill9()
        gearmand.start()
        assert client.echo(b"after kill -9") == b"after kill -9"
        client.submit_background("restart", b"", "after-kill")
    # Builtin queue: only jobs submitted after the last crash are left.
    assert admin.status(*gearmand.address)["restart"].queued == 1


def test_worker_reconnects_and_persistent_queue_survives_kill9(tmp_path: Path) -> None:
    """Also in WAL mode, which the farm puts gearmand's queue in (a background job's write held
    gearmand's one thread three times as long in the default journal): what was submitted
    before a kill -9 is in the log, and gearmand replays it."""
    queue = tmp_path / "persist" / "queue.db"
    server = Gearmand(tmp_path / "persist", queue_db=queue)
    server.start()
    try:
        with contextlib.closing(sqlite3.connect(queue)) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        gate = threading.Event()
        blocked = threading.Event()
        done: list[str] = []

        def handler(job: Job) -> bytes:
            if job.unique == "job-0" and not gate.is_set():
                blocked.set()  # job-0 is running when the server dies
                gate.wait(10)
            done.append(job.unique)
            return b"ok"

        worker = Worker([server.address], "survivor", **FAST)
        worker.register("persist", handler)
        with Client([server.address]) as client, running(worker):
            client.submit_background("persist", b"0", "job-0")
            assert blocked.wait(5)
            for i in range(1, 6):
                client.submit_background("persist", str(i).encode(), f"job-{i}")
            assert admin.status(*server.address)["persist"] == admin.FunctionStatus(6, 1, 1)

            server.kill9()
            server.start()  # same port, same sqlite queue
            assert admin.status(*server.address)["persist"].queued == 6, "queue lost across kill -9"
            gate.set()

            expected = {f"job-{i}" for i in range(6)}
            wait_for(lambda: expected <= set(done), 10, "replayed jobs to run")
            wait_for(lambda: admin.status(*server.address)["persist"].queued == 0, 5, "queue to drain")
            listed = [w for w in admin.workers(*server.address) if w.client_id == "survivor"]
            assert listed and listed[0].functions == ["persist"], "worker did not re-register"
            # The client that saw the crash keeps working too.
            client.submit_background("persist", b"6", "job-6")
            wait_for(lambda: "job-6" in done, 5, "post-restart job")
    finally:
        server.stop()


def test_worker_survives_garbage_from_server() -> None:
    def garbage(conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(b"\0RES\0\0\x03\xe7\0\0\0\0 nonsense")  # unknown command 999

    with fake_server(garbage) as (port, accepted):
        worker = Worker([("127.0.0.1", port)], "robust", **FAST)
        worker.register("f", lambda job: b"")
        with running(worker) as thread:
            wait_for(lambda: accepted[0] >= 3, 5, "worker to reconnect repeatedly")
            assert thread.is_alive()


# -- gearmand management ---------------------------------------------------------------


def test_gearmand_missing_binary_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gearmand_module.shutil, "which", lambda name: None)
    monkeypatch.setattr(gearmand_module, "_FALLBACK_BINARY", str(tmp_path / "no-such-gearmand"))
    with pytest.raises(GearmandError, match="apt-get install gearman-job-server"):
        Gearmand(tmp_path).start()


def test_gearmand_start_failure_shows_log_tail(tmp_path: Path) -> None:
    server = Gearmand(tmp_path, extra_args=["--no-such-option"], start_timeout=5)
    started = time.monotonic()
    with pytest.raises(GearmandError, match="no-such-option"):
        server.start()
    assert time.monotonic() - started < 3, "an exiting gearmand must fail fast, not retry"
    assert not server.running


def test_gearmand_retries_lost_bind_race_and_stops(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    squatter = socket.create_server(("127.0.0.1", 0))
    taken = squatter.getsockname()[1]
    ports = iter([taken, free_port()])
    monkeypatch.setattr(gearmand_module, "free_port", lambda host: next(ports))
    server = Gearmand(tmp_path / "race")
    try:
        server.start()
        assert server.port != taken
        assert admin.getpid(*server.address) == server.pid
        pid = server.pid
        assert pid is not None
    finally:
        server.stop()
        squatter.close()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_gearmand_fixed_port_taken_is_an_error(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        port = squatter.getsockname()[1]
        with pytest.raises(GearmandError, match=f"port {port}"):
            Gearmand(tmp_path, port=port, start_timeout=1).start()


# -- interoperability with libgearman (gearman CLI) ------------------------------------

gearman_cli = shutil.which("gearman")
needs_cli = pytest.mark.skipif(
    gearman_cli is None, reason="gearman CLI missing (apt-get install gearman-tools)"
)


@needs_cli
def test_our_worker_serves_libgearman_client(gearmand: Gearmand) -> None:
    host, port = gearmand.address
    seen: list[bytes] = []
    worker = Worker([gearmand.address], "interop-worker", **FAST)
    worker.register("upper", lambda job: seen.append(job.data) or job.data.upper())
    base = [str(gearman_cli), "-h", host, "-p", str(port), "-f", "upper"]
    with running(worker):
        fg = subprocess.run([*base, "hello farm"], capture_output=True, timeout=15, stdin=subprocess.DEVNULL)
        bg = subprocess.run(
            [*base, "-b", "background"], capture_output=True, timeout=15, stdin=subprocess.DEVNULL
        )
        wait_for(lambda: b"background" in seen, 5, "background job from CLI")
    assert fg.returncode == 0, fg.stderr
    assert fg.stdout == b"HELLO FARM"
    assert bg.returncode == 0, bg.stderr


@needs_cli
def test_libgearman_worker_serves_our_client(gearmand: Gearmand) -> None:
    host, port = gearmand.address
    cli = subprocess.Popen(
        [
            str(gearman_cli),
            "-w",
            "-h",
            host,
            "-p",
            str(port),
            "-f",
            "shout",
            "-c",
            "2",
            "--",
            "tr",
            "a-z",
            "A-Z",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        with Client([gearmand.address]) as client:
            assert (
                client.submit("shout", b"from gearfarm\0binary", "cli-fg", timeout=15)
                == b"FROM GEARFARM\0BINARY"
            )
            client.submit_background("shout", b"bg", "cli-bg")
        assert cli.wait(15) == 0, "gearman -w -c 2 did not finish both jobs"
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.communicate()
    assert admin.status(host, port)["shout"].queued == 0


# -- volume ----------------------------------------------------------------------------


def test_many_jobs_from_concurrent_threads_match_results(gearmand: Gearmand) -> None:
    threads_n, per_thread = 4, 500
    workers = []
    for i in range(4):
        worker = Worker([gearmand.address], f"bulk-{i}", **FAST)
        worker.register("tag", lambda job: b"R:" + job.unique.encode() + b":" + job.data)
        workers.append(worker)
    mismatches: list[str] = []
    errors: list[BaseException] = []

    with Client([gearmand.address]) as client:  # one client shared by all threads

        def submit_many(t: int) -> None:
            try:
                for n in range(per_thread):
                    unique, data = f"t{t}-{n}", f"payload-{t}-{n}".encode()
                    got = client.submit("tag", data, unique, timeout=10)
                    if got != b"R:" + unique.encode() + b":" + data:
                        mismatches.append(f"{unique}: {got!r}")
            except BaseException as exc:  # reported below
                errors.append(exc)

        with running(workers[0]), running(workers[1]), running(workers[2]), running(workers[3]):
            submitters = [threading.Thread(target=submit_many, args=(t,)) for t in range(threads_n)]
            for thread in submitters:
                thread.start()
            for thread in submitters:
                thread.join(30)
    assert not errors, errors[:3]
    assert not mismatches, mismatches[:5]


def test_pipelined_background_submission(gearmand: Gearmand) -> None:
    count = 2000
    done: set[str] = set()
    lock = threading.Lock()

    def handler(job: Job) -> bytes:
        assert job.data == job.unique.encode()
        with lock:
            done.add(job.unique)
        return b""

    jobs = [BackgroundJob("pipe", f"bg-{n}".encode(), f"bg-{n}") for n in range(count)]
    with Client([gearmand.address]) as client:
        handles = client.submit_background_many(jobs)
    assert len(handles) == count and len(set(handles)) == count
    worker_a = Worker([gearmand.address], "pipe-a", **FAST)
    worker_b = Worker([gearmand.address], "pipe-b", **FAST)
    for worker in (worker_a, worker_b):
        worker.register("pipe", handler)
    with running(worker_a), running(worker_b):
        wait_for(lambda: len(done) == count, 20, "all pipelined jobs to run")
    assert done == {j.unique for j in jobs}


def test_a_pipelined_batch_hands_out_its_first_job_while_the_rest_are_still_made(tmp_path: Path) -> None:
    """A nightly releases a target's suites as one batch while the lab's slots wait. gearmand
    hands out none of a pipelined chunk's jobs before it has queued the whole chunk, with its
    persistent queue a committed write each, so the first suite waited until the last was
    signed, sent and committed (50-100 ms for 49, docs/speed.md). The batch goes in growing
    chunks, each taken from the caller's iterable as it is sent: a sleeping worker runs the
    first job before the second is even made, and every job of the batch runs once."""
    first = threading.Event()
    ran: list[str] = []
    first_out_before_second_made: list[bool] = []

    def handler(job: Job) -> bytes:
        ran.append(job.unique)
        first.set()
        return b""

    def jobs() -> Iterator[BackgroundJob]:
        for n in range(49):
            if n == 1:
                first_out_before_second_made.append(first.wait(10))
            yield BackgroundJob("release", b"", f"suite-{n}")

    with Gearmand(tmp_path / "gm", queue_db=tmp_path / "gm" / "queue.db") as server:
        worker = Worker([server.address], "slot", poll_interval=2.0)  # a NOOP wakes it, not its poll
        worker.register("release", handler)
        with running(worker), Client([server.address]) as client:
            wait_for(lambda: admin.status(*server.address).get("release", None) is not None, 10, "the worker")
            handles = client.submit_background_many(jobs())
            wait_for(lambda: len(ran) == 49, 20, "every job of the batch to run")
    assert first_out_before_second_made == [True], "the first job waited for the rest of its batch"
    assert len(set(handles)) == 49 and sorted(ran) == sorted(f"suite-{n}" for n in range(49))


# -- ERROR packets and partial outages ---------------------------------------------------


def test_pipelined_submit_error_raises_at_once_and_drops_connection(
    gearmand: Gearmand, second_gearmand: Gearmand
) -> None:
    cap_queue(gearmand, "capped", 2)  # the seed plus one more
    head = [
        BackgroundJob("capped", b"", "b-0"),
        BackgroundJob("capped", b"", "b-1"),  # refused: queue full
        BackgroundJob("free", b"", "b-2"),
        BackgroundJob("capped", b"", "b-3"),
    ]
    later = [BackgroundJob("free", b"", f"later-{n}") for n in range(_PIPELINE_CHUNK)]
    address = format_address(*gearmand.address)
    with (
        Client([gearmand.address, second_gearmand.address], io_timeout=10) as client,
        Client([gearmand.address]) as fresh,
    ):
        started = time.monotonic()
        with pytest.raises(ServerError) as info:
            client.submit_background_many(head + later)
        assert time.monotonic() - started < 3, "the ERROR must end the batch at once"
        error = info.value
        assert (error.address, error.code, error.text, error.index) == (address, "QUEUE_ERROR", "Job queue is full", 1)
        message = str(error)
        for part in (address, "QUEUE_ERROR", "Job queue is full", "submission 2 of 260", "'b-1'"):
            assert part in message, message

        # The job before the failing one stays queued, under the handle reported.
        assert len(error.submitted) == 1 and fresh.get_status(error.submitted[0]).known
        assert fresh.get_status_unique("b-0").known and not fresh.get_status_unique("b-1").known
        # Not retried on the other server, and the next chunk was never sent.
        assert admin.status(*second_gearmand.address) == {}
        assert not any(fresh.get_status_unique(job.unique).known for job in later[_PIPELINE_CHUNK - len(head) :])

        # Same thread, same client: the replies still in flight for the rest of the
        # chunk (b-2, b-3, ...) must not be taken as the answers to the next requests.
        assert client.submit_background("free", b"", "after") == fresh.submit_background("free", b"", "after")
        assert client.echo(b"in sync") == b"in sync"


def test_foreground_submit_refused_with_error_raises_at_once(gearmand: Gearmand, second_gearmand: Gearmand) -> None:
    """A foreground submission answered by ERROR raises ServerError, not retried elsewhere.

    gearmand 1.1.20 sends ERROR only in answer to a request on the same connection
    (every call of _server_error_packet in libgearman-server/server.cc), never on its
    own to a client that waits for a result, so here the ERROR answers the SUBMIT_JOB
    itself.  timeout=None: a client that missed the ERROR, or failed over to the other
    server (no worker there), would wait forever; the thread shows that.
    """
    cap_queue(gearmand, "capped", 1)
    outcome: list[BaseException] = []
    with Client([gearmand.address, second_gearmand.address]) as client:
        thread = threading.Thread(
            target=_capture, args=(outcome, client.submit, "capped", b"", "fg-refused", None), daemon=True
        )
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "submit() still waiting after gearmand refused the job"
    assert len(outcome) == 1 and isinstance(outcome[0], ServerError), outcome
    assert (outcome[0].code, outcome[0].text) == ("QUEUE_ERROR", "Job queue is full")
    assert outcome[0].address == format_address(*gearmand.address)
    assert admin.status(*second_gearmand.address) == {}


def test_error_while_waiting_for_foreground_result_raises_at_once(gearmand: Gearmand) -> None:
    """An ERROR arriving while submit() waits for the result raises ServerError at once.

    gearmand sends ERROR only in answer to a request on the same connection, so the
    on_status callback (which runs in the waiting thread) sends a submission that the
    full queue refuses on the waiting thread's own connection, as a re-entrant caller
    would.  Reaching that connection needs the private _conns().
    """
    cap_queue(gearmand, "capped", 1)
    release = threading.Event()

    def handler(job: Job) -> bytes:
        job.status(1, 2)
        release.wait(10)
        return b"late"

    def overflow(numerator: int, denominator: int) -> None:
        client._conns()[0].send(Command.SUBMIT_JOB_BG, "capped", "overflow", b"")

    worker = Worker([gearmand.address], "waiting", **FAST)
    worker.register("hold", handler)
    with Client([gearmand.address]) as client, running(worker):
        started = time.monotonic()
        try:
            with pytest.raises(ServerError) as info:
                client.submit("hold", b"", "fg-waiting", timeout=5, on_status=overflow)
        finally:
            release.set()
        assert time.monotonic() - started < 3, "ServerError must not wait for the timeout"
        assert (info.value.code, info.value.text) == ("QUEUE_ERROR", "Job queue is full")
        assert "while waiting for job H:" in str(info.value)
        # The connection with unknown replies in flight was dropped; a new one works.
        assert client.echo(b"fresh") == b"fresh"


def test_status_with_a_server_down_is_not_reported_unknown(gearmand: Gearmand, second_gearmand: Gearmand) -> None:
    live, dead = gearmand.address, second_gearmand.address
    with Client([live, dead]) as client:
        # Both up and neither holds the job: that, and only that, is "unknown".
        assert client.get_status_unique("on-neither").known is False
        assert client.get_status("H:nowhere:1").known is False
        handle = client.submit_background("no-worker", b"", "held")
    second_gearmand.stop()

    for order in ([live, dead], [dead, live]):
        with Client(order, connect_timeout=1) as client:
            with pytest.raises(StatusUnknown) as info:
                client.get_status_unique("on-neither")
            assert isinstance(info.value, GearmanError)  # what nightly.Watchdog catches
            assert info.value.addresses == [format_address(*dead)]
            assert info.value.answered == [format_address(*live)]
            assert format_address(*dead) in str(info.value)
            with pytest.raises(StatusUnknown):
                client.get_status("H:nowhere:1")

            # A job the live server holds is still reported, whatever the order.
            held = client.get_status_unique("held")
            assert (held.known, held.running) == (True, False)
            assert client.get_status(handle).known is True

    gearmand.stop()
    with Client([live, dead], connect_timeout=1) as client, pytest.raises(ServerUnavailable):
        client.get_status_unique("held")


def test_sigterm_ends_an_idle_worker_at_once_whichever_thread_gets_it(gearmand: Gearmand) -> None:
    """A farm stop must not wait out the worker's poll: with a 30 s poll, SIGTERM still ends
    work() at once, also when the kernel hands the signal to another thread (the heartbeat's,
    the spool flusher's), which does not interrupt the main thread's poll()."""
    import signal

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    old_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(old_fd)
    worker = Worker([gearmand.address], "stop-probe", poll_interval=30.0)
    worker.register("never-submitted", lambda job: b"")
    stop = threading.Event()
    try:
        worker.stop_on_signals(stop)

        def send() -> None:
            time.sleep(0.5)  # the worker is asleep in its poll by now
            # Delivered to this thread, not the main one: the case that hid behind the poll.
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        sender = threading.Thread(target=send)
        sender.start()
        started = time.monotonic()
        worker.work(stop)
        took = time.monotonic() - started
        sender.join()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(old_fd)
    assert stop.is_set()
    assert took < 5, f"worker took {took:.1f}s to notice SIGTERM (its poll is 30 s)"


def test_worker_prefers_the_functions_it_registered_first(gearmand: Gearmand) -> None:
    """The farm's critical-path order: with jobs of several functions queued, a worker gets
    them in the order its functions were registered (gearmand itself prefers the last CAN_DO)."""
    with Client([gearmand.address]) as client:
        for fn in ("quick", "slow", "middle"):
            for i in range(2):
                client.submit_background(fn, b"x", unique=f"{fn}-{i}")
    got = _six_jobs(Worker([gearmand.address], "order-probe", **FAST), ("slow", "middle", "quick"))
    assert got == ["slow", "slow", "middle", "middle", "quick", "quick"]


def _six_jobs(worker: Worker, functions: tuple[str, ...]) -> list[str]:
    """The functions of the first six jobs ``worker`` runs, registered for ``functions``."""
    got: list[str] = []
    for fn in functions:
        worker.register(fn, lambda job: got.append(job.function) or b"")
    stop = threading.Event()
    t = threading.Thread(target=worker.work, args=(stop,))
    t.start()
    try:
        wait_for(lambda: len(got) == 6, what="six jobs")
    finally:
        stop.set()
        t.join()
    return got


def test_a_worker_takes_from_the_function_its_preference_names_before_each_job(gearmand: Gearmand) -> None:
    """With ``prefer``, the worker asks gearmand's status before each grab and moves the named
    function to the front of its abilities (CANT_DO + CAN_DO): the jobs come in the order the
    preference says as the queues change, not in the order the functions were registered."""
    with Client([gearmand.address]) as client:
        for fn, n in (("quick", 1), ("slow", 3), ("middle", 2)):
            for i in range(n):
                client.submit_background(fn, b"x", unique=f"{fn}-{i}")
    seen: list[dict[str, int]] = []

    def most_waiting(waiting: Mapping[str, int]) -> str | None:
        seen.append(dict(waiting))
        return max((n, fn) for fn, n in waiting.items())[1] if any(waiting.values()) else None

    got = _six_jobs(Worker([gearmand.address], "prefer-probe", prefer=most_waiting, **FAST),
                    ("quick", "slow", "middle"))
    # Registered order alone would give quick, slow, slow, slow, middle, middle.
    assert got == ["slow", "slow", "middle", "slow", "quick", "middle"], got
    assert seen[0] == {"quick": 1, "slow": 3, "middle": 2}
    assert seen[1] == {"quick": 1, "slow": 2, "middle": 2}


@contextmanager
def _tap(server: tuple[str, int]) -> Iterator[tuple[tuple[str, int], list[list[Command]], list[bytes]]]:
    """A relay in front of ``server`` that records what its clients send: for each read from a
    binary connection, the commands it held (one read is one write of the sender's here: small
    writes on loopback, each answered before the next), and every admin (text) line."""
    reads: list[list[Command]] = []
    lines: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    socks = [listener]

    def pump(src: socket.socket, dst: socket.socket, record: bool) -> None:
        text: bool | None = None
        try:
            while chunk := src.recv(65536):
                if record:
                    text = chunk[0] != 0 if text is None else text
                    if text:
                        lines.extend(chunk.splitlines())
                    else:
                        got, at = [], 0
                        while at + 12 <= len(chunk):
                            got.append(Command(int.from_bytes(chunk[at + 4:at + 8], "big")))
                            at += 12 + int.from_bytes(chunk[at + 8:at + 12], "big")
                        reads.append(got)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def accept() -> None:
        try:
            while True:
                conn, _ = listener.accept()
                up = socket.create_connection(server)
                socks.extend((conn, up))
                threading.Thread(target=pump, args=(conn, up, True), daemon=True).start()
                threading.Thread(target=pump, args=(up, conn, False), daemon=True).start()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[:2], reads, lines
    finally:
        for s in socks:
            s.close()


def test_a_choosing_worker_sends_its_result_its_next_choice_and_its_grab_in_one_write(gearmand: Gearmand) -> None:
    """The status that orders the next job is asked when a job starts and read when it ends, so
    the result, the CANT_DO + CAN_DO of the next choice and the next grab go to gearmand in one
    write: no round trip between two jobs more than a worker without a preference makes. One
    status query a job (and one for the first grab)."""
    with Client([gearmand.address]) as client:
        for fn, n in (("quick", 1), ("slow", 3), ("middle", 2)):
            for i in range(n):
                client.submit_background(fn, b"x", unique=f"{fn}-{i}")

    def most_waiting(waiting: Mapping[str, int]) -> str | None:
        return max((n, fn) for fn, n in waiting.items())[1] if any(waiting.values()) else None

    with _tap(gearmand.address) as (address, reads, lines):
        got = _six_jobs(Worker([address], "prefer-tap", prefer=most_waiting, **FAST), ("quick", "slow", "middle"))
    assert got == ["slow", "slow", "middle", "slow", "quick", "middle"], got
    results = [r for r in reads if Command.WORK_COMPLETE in r]
    assert len(results) == 6, reads
    # The sixth result may go out alone: the worker stops once six jobs ran.
    for r in results[:5]:
        assert r[-1] is Command.GRAB_JOB_UNIQ, (r, reads)
    # The choice changes after the second, third, fourth and fifth job (slow → middle → slow →
    # quick → middle), each a CANT_DO + CAN_DO in that write.
    assert [r.count(Command.CAN_DO) for r in results[:5]] == [0, 1, 1, 1, 1], reads
    assert lines.count(b"status") == 7, lines


def test_a_failing_preference_holds_back_no_result(gearmand: Gearmand) -> None:
    """The choice of the next job is made when a job ends, before its result goes out: a
    preference that raises leaves the registered order and every result delivered once."""
    with Client([gearmand.address]) as client:
        for fn in ("first", "second", "first"):
            client.submit_background(fn, b"x", unique=f"{fn}-{time.monotonic_ns()}")

    def broken(waiting: Mapping[str, int]) -> str | None:
        raise RuntimeError("the host's durations are unreadable")

    worker = Worker([gearmand.address], "prefer-broken", prefer=broken, **FAST)
    ran: list[str] = []
    for fn in ("first", "second"):
        worker.register(fn, lambda job: ran.append(job.function) or b"")
    with running(worker):
        wait_for(lambda: len(ran) >= 3, what="three jobs")
        wait_for(lambda: all(st.queued == 0 for fn, st in admin.status(*gearmand.address).items()
                             if fn in ("first", "second")), what="the queues empty")
    assert sorted(ran) == ["first", "first", "second"], ran


def test_a_worker_stopped_during_a_job_leaves_the_next_one_queued(tmp_path: Path) -> None:
    """The next grab rides with a job's result, but not once the worker is stopping: a job
    gearmand hands to a worker that then leaves counts as a death against --job-retries (here 1:
    it would be dropped), so the next job must stay queued for the next worker, or be run."""
    with Gearmand(tmp_path / "gm", job_retries=1) as server, Client([server.address]) as client:
        for i in range(2):
            client.submit_background("stop-probe", b"%d" % i, unique=f"stop-probe-{i}")
        ran: list[bytes] = []
        stop = threading.Event()
        worker = Worker([server.address], "stopping", **FAST)

        def handler(job: Job) -> bytes:
            ran.append(job.data)
            stop.set()  # SIGTERM arrives while the job runs
            return b"ok"

        worker.register("stop-probe", handler)
        worker.work(stop)
        # gearmand notices the closed connection a moment later.
        wait_for(lambda: admin.status(*server.address)["stop-probe"].workers == 0, what="the worker gone")
        st = admin.status(*server.address)["stop-probe"]
        assert len(ran) + st.queued == 2, (ran, st)
        assert st.running == 0


def test_a_queue_that_is_not_a_database_is_named_with_the_fix(tmp_path: Path) -> None:
    """gearmand's queue is put in WAL mode before gearmand starts: a file there that sqlite
    cannot open is an error naming it and what to do, not a traceback."""
    queue = tmp_path / "gm" / "queue.db"
    queue.parent.mkdir()
    queue.write_bytes(b"not a database, " * 100)
    with pytest.raises(GearmandError, match=r"cannot open gearmand's queue .*queue\.db.*move the file away"):
        Gearmand(tmp_path / "gm", queue_db=queue).start()


# -- several servers -------------------------------------------------------------------


def _serve(worker: Worker, function: str, seconds: float = 0.0) -> list[tuple[str, float]]:
    """Register ``function`` on ``worker``: each job is the (unique, monotonic start) it adds to
    the list returned, and takes ``seconds``."""
    ran: list[tuple[str, float]] = []

    def handle(job: Job) -> bytes:
        ran.append((job.unique, time.monotonic()))
        time.sleep(seconds)
        return b""

    worker.register(function, handle)
    return ran


def test_a_worker_of_two_servers_does_not_ask_the_empty_one_before_every_job(
    gearmand: Gearmand, second_gearmand: Gearmand
) -> None:
    """In a lab the client submits to the first server that answers; the second is a standby
    with nothing queued. A worker asks the server its last job came from first (its grab goes
    with the result) and the standby first about once every LOOK_AROUND seconds: it asked the
    standby before each of 60 jobs (a round trip each), with the first server's grab in a
    write of its own."""
    with Client([gearmand.address]) as client:
        client.submit_background_many([BackgroundJob("stand", b"", f"s-{i}") for i in range(60)])
    with _tap(gearmand.address) as (first, first_reads, _), _tap(second_gearmand.address) as (second, reads, _):
        worker = Worker([first, second], "standby", **FAST)
        ran = _serve(worker, "stand")
        began = time.monotonic()
        with running(worker):
            wait_for(lambda: len(ran) == 60, what="60 jobs")
            took = time.monotonic() - began
        worker.close()
    grabs = sum(r.count(Command.GRAB_JOB_UNIQ) for r in reads)
    assert grabs <= 2 + took / worker_module.LOOK_AROUND, (grabs, took, reads)
    results = [r for r in first_reads if Command.WORK_COMPLETE in r]
    assert len(results) == 60
    with_grab = sum(r[-1] is Command.GRAB_JOB_UNIQ for r in results)
    assert with_grab >= 60 - 2 - took / worker_module.LOOK_AROUND, first_reads


def test_a_job_on_the_other_server_waits_no_longer_than_look_around(
    gearmand: Gearmand, second_gearmand: Gearmand
) -> None:
    """Jobs on both servers (a client that failed over for a while): the worker, busy with the
    first server's queue, still asks the second within LOOK_AROUND, not once the first is empty."""
    with Client([gearmand.address]) as client:
        client.submit_background_many([BackgroundJob("both", b"", f"a-{i}") for i in range(400)])
    with Worker([gearmand.address, second_gearmand.address], "both", **FAST) as worker:
        ran = _serve(worker, "both", 0.01)
        with running(worker):
            wait_for(lambda: len(ran) >= 5, what="the first server's jobs to start")
            with Client([second_gearmand.address]) as client:
                client.submit_background("both", b"", "on-second")
            queued = time.monotonic()
            wait_for(lambda: "on-second" in dict(ran), what="the second server's job")
        started = dict(ran)["on-second"]
    assert started - queued < worker_module.LOOK_AROUND + 0.5, started - queued
    assert len(ran) < 400, "the second server's job waited for the first server's queue to empty"



def test_admin_maxqueue_without_a_size_lifts_a_cap_any_peer_set(gearmand: Gearmand) -> None:
    """What the nightly does when it meets a cap (gearfarm.run.queuelimit): a plain socket capped
    the function; admin.maxqueue with no size lifts it, and the refused submission goes through."""
    cap_queue(gearmand, "lifted", 1)
    with Client([gearmand.address]) as client:
        with pytest.raises(ServerError) as info:
            client.submit_background("lifted", b"", "lifted-1")
        assert info.value.code == "QUEUE_ERROR"
        admin.maxqueue(*gearmand.address, "lifted")
        client.submit_background("lifted", b"", "lifted-1")
    assert admin.status(*gearmand.address)["lifted"].queued == 2
    with pytest.raises(ValueError):
        admin.maxqueue(*gearmand.address, "two words")
