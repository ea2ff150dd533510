"""Synchronous Gearman worker: grab jobs from one or more servers and run handlers.

Loop per iteration: GRAB_JOB_UNIQ on each live server (the last job's server first, the
others first every LOOK_AROUND seconds); if every server says NO_JOB, send PRE_SLEEP
everywhere and poll all sockets for a NOOP, waking at least every ``poll_interval`` seconds
to re-grab (which also covers a NOOP lost across a reconnect); ``wake()`` (e.g. from a
SIGTERM handler) ends that sleep at once, so a stopping worker exits in milliseconds instead
of at its next poll.  Dead servers are reconnected with
exponential backoff and get SET_CLIENT_ID + CAN_DO again, because gearmand forgets a
worker's abilities with its connection.  With ``prefer``, the worker asks each server's
``status`` when a job starts, reads the answer when it ends and moves the function ``prefer``
names to the front of its abilities (gearmand hands out the first function's jobs first), in
the same write as the job's result and the next grab.  No CAN_DO_TIMEOUT: gearmand 1.1.20 silently
requeues timed-out jobs, which hides hung workers instead of failing the job.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from . import admin
from .errors import ProtocolError, ServerError
from .protocol import MAX_FUNCTION_SIZE, SPIN, Command, Connection, check_name, encode, format_address

log = logging.getLogger(__name__)

# How long an idle worker that has just finished a job looks for the next one without sleeping
# (bench/farm_speed.py, dispatch: with it, one-by-one jobs through gearfarm's client and worker
# came out at 0.99-1.05× libgearman's p50, without it at 1.14-1.31×). At most this much CPU per
# job; a worker idle for longer sleeps in poll() as before.
IDLE_SPIN = 0.0005
# With several servers, a worker asks the one its last job came from first (its grab goes out
# with that job's result), and the others first once this many seconds passed since it last
# did. Asking them all in turn after every job cost a round trip per job to a server with
# nothing queued: in a lab the client submits to the first server that answers, so the others
# are standbys, empty unless it failed over to them. A job queued on one of them then waits at
# most this long or the job running, where it waited for the job running; an idle worker, asleep
# on every server, is woken at once as before.
LOOK_AROUND = 1.0

# Anything that means "this connection is broken, reconnect".
_CONNECTION_ERRORS = (OSError, ProtocolError)
_GRAB = encode(Command.GRAB_JOB_UNIQ)


class Job:
    """A job assigned to this worker, passed to the handler.

    ``status`` / ``send_data`` may be called from another thread (e.g. a heartbeat)
    while the handler runs; after the job finished they do nothing and return False,
    so a late heartbeat cannot send WORK_STATUS for a handle gearmand already retired.
    """

    def __init__(self, connection: Connection, handle: str, function: str, unique: str, data: bytes) -> None:
        self.handle = handle
        self.function = function
        self.unique = unique
        self.data = data
        self._connection = connection
        self._lock = threading.Lock()
        self._finished = False

    def __repr__(self) -> str:
        return f"<Job {self.handle} {self.function} unique={self.unique!r} {len(self.data)} bytes>"

    @property
    def server(self) -> str:
        """Address of the server that assigned the job."""
        return self._connection.address

    def _send_update(self, command: Command, *args: bytes | str | int) -> bool:
        with self._lock:
            if self._finished:
                return False
            try:
                self._connection.send(command, self.handle, *args)
            except OSError as exc:
                log.warning("job %s: cannot send %s to %s: %s", self.handle, command.name, self.server, exc)
                return False
            return True

    def status(self, numerator: int, denominator: int) -> bool:
        """Send WORK_STATUS (progress / heartbeat).  Thread-safe; False if not sent."""
        return self._send_update(Command.WORK_STATUS, int(numerator), int(denominator))

    def send_data(self, data: bytes) -> bool:
        """Send WORK_DATA (partial output to a foreground client).  Thread-safe."""
        return self._send_update(Command.WORK_DATA, bytes(data))

    def _finish(self, command: Command, *args: bytes, then: bytes = b"") -> bool:
        """Send the final packet exactly once; later status() calls become no-ops. ``then``:
        packets to send in the same write (the worker's next GRAB_JOB_UNIQ)."""
        with self._lock:
            if self._finished:
                return False
            self._finished = True
            try:
                self._connection.send_raw(encode(command, self.handle, *args) + then)
            except OSError as exc:
                # gearmand requeues the job when our connection drops (subject to
                # --job-retries), so the result is not lost silently -- but say so.
                log.warning(
                    "job %s: result not delivered to %s (%s); server will requeue it",
                    self.handle,
                    self.server,
                    exc,
                )
                return False
            return True


Handler = Callable[[Job], bytes]


@dataclass
class _Server:
    host: str
    port: int
    connection: Connection
    next_attempt: float = 0.0
    backoff: float = 0.0
    sleeping: bool = False
    # A GRAB_JOB_UNIQ went out with the last job's result; its answer is still to be read.
    grab_sent: bool = False
    registered: set[str] = field(default_factory=set)
    # The worker's handler version this connection has sent CAN_DO for (-1: none yet).
    version: int = -1
    # The function gearmand offers this connection first (its last CAN_DO).
    front: str | None = None
    # For ``prefer``: the server's status, asked on a connection kept open.
    session: admin.Session | None = None

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)


class Worker:
    """Gearman worker serving registered functions from one or more servers."""

    def __init__(
        self,
        servers: Sequence[tuple[str, int]],
        client_id: str,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 5.0,
        io_timeout: float = 30.0,
        poll_interval: float = 1.0,
        max_backoff: float = 5.0,
        server_hostname: str | None = None,
        prefer: Callable[[Mapping[str, int]], str | None] | None = None,
    ) -> None:
        """``prefer``: given the jobs waiting (queued, not running) per registered function on
        a server, the function to take from first there, or None for the registered order."""
        if not servers:
            raise ValueError("Worker needs at least one (host, port) server")
        if not client_id or any(c.isspace() for c in client_id) or "\0" in client_id:
            # gearmand prints client ids space-separated in 'workers'; keep them parseable.
            raise ValueError(f"client_id must be non-empty without whitespace: {client_id!r}")
        self.client_id = client_id
        self.poll_interval = poll_interval
        # Called when the worker found no job twice in a row (it slept a poll_interval, or was
        # woken for a job another worker took), before it sleeps again: chores that wait for
        # time nobody's job needs.
        self.idle: Callable[[], None] | None = None
        # Asked, while no server is connected, with the seconds since one last was: True ends
        # ``work`` (the caller's rule for when its servers are gone for good); None: never.
        self.give_up: Callable[[float], bool] | None = None
        self._down_since: float | None = None  # time.monotonic() since no server is connected
        self.max_backoff = max_backoff
        self._io_timeout = io_timeout
        self._prefer = prefer
        self._handlers: dict[str, Handler] = {}
        self._version = 0  # bumped by register(): connections compare theirs to send CAN_DO
        self._lock = threading.Lock()
        self._servers = [
            _Server(
                h,
                int(p),
                Connection(
                    h,
                    int(p),
                    ssl_context=ssl_context,
                    server_hostname=server_hostname,
                    connect_timeout=connect_timeout,
                    io_timeout=io_timeout,
                ),
                session=admin.Session(h, int(p), ssl_context, min(io_timeout, 5.0), server_hostname)
                if prefer is not None else None,
            )
            for h, p in servers
        ]
        self._next = 0  # round-robin start index
        # The server the last job came from, and when the others were last asked first.
        self._last: _Server | None = None
        self._looked = 0.0
        # Self-pipe: wake() may run in a signal handler, where only a non-blocking write is safe.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        # The idle wait's poll object, kept while the set of sockets it watches is the same.
        self._poll_fds: tuple[int, ...] = ()
        self._poller: select.poll | None = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, function: str, handler: Handler) -> None:
        """Serve ``function`` with ``handler``; may be called while ``work`` runs. When jobs of
        several functions wait, the worker gets one of the function registered first (among
        those registered before it connected)."""
        check_name("function", function, MAX_FUNCTION_SIZE)
        with self._lock:
            self._handlers[function] = handler
            self._version += 1
        # Live connections learn the new ability on the worker thread's next
        # iteration (see _register); sending from here would race with its reads.

    def wake(self) -> None:
        """End the current idle wait now (call after setting the stop event ``work`` watches)."""
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a full pipe already wakes the loop; a closed one means the worker is gone

    def stop_on_signals(self, stop: threading.Event, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """Make ``signals`` set ``stop`` and wake the loop (only from the main thread, where
        Python runs signal handlers; elsewhere the caller sets ``stop`` itself)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(*_: object) -> None:
            stop.set()
            self.wake()

        for sig in signals:
            signal.signal(sig, handler)
        # The kernel may deliver the signal to any thread (a heartbeat, a spool flusher), and then
        # the main thread's poll() is not interrupted: Python would run the handler only after the
        # poll's timeout. With the wake-up fd, the C-level handler writes to our self-pipe at once.
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)

    def close(self) -> None:
        """Disconnect from every server (gearmand requeues any job we were running)."""
        for server in self._servers:
            server.connection.close()
            self._forget(server)
            if server.session is not None:
                server.session.close()

    # -- connection handling ---------------------------------------------------------

    @staticmethod
    def _forget(server: _Server) -> None:
        """A closed connection: gearmand forgot its abilities, sleep and pending grab."""
        server.registered.clear()
        server.front = None
        server.version = -1
        server.sleeping = False
        server.grab_sent = False

    def _drop(self, server: _Server, reason: BaseException | str) -> None:
        if server.connection.connected or server.registered:
            log.warning(
                "worker %s: lost gearmand %s (%s); reconnecting", self.client_id, server.address, reason
            )
        server.connection.close()
        self._forget(server)
        server.backoff = min(self.max_backoff, max(0.1, server.backoff * 2))
        server.next_attempt = time.monotonic() + server.backoff

    def _register(self, server: _Server) -> None:
        """Send SET_CLIENT_ID (once per connection) and CAN_DO for new functions."""
        with self._lock:
            wanted = list(self._handlers)
            version = self._version
        missing = [f for f in wanted if f not in server.registered]
        if missing:
            # gearmand offers a worker the queued job of the function it registered *last* first
            # (it prepends each CAN_DO to the connection's list; measured with gearmand 1.1.20),
            # and priorities only order jobs within one function. Sent in reverse, the function
            # registered first is the one preferred: the caller's order is the preference.
            packets = [(Command.CAN_DO, f) for f in reversed(missing)]
            if not server.registered:
                packets.insert(0, (Command.SET_CLIENT_ID, self.client_id))
            for command, arg in packets:
                server.connection.send(command, arg)
            server.registered.update(missing)
            server.front = missing[0]
        server.version = version

    def _live(self) -> list[_Server]:
        """Connect servers whose backoff expired; return the connected ones. Runs before every
        grab, so the common case (all connected, nothing new registered) does no more than look."""
        now = None
        live = []
        for server in self._servers:
            conn = server.connection
            if not conn.connected:
                # The connection may have been closed underneath us (a failed send or
                # EOF inside Connection): a new one starts with no abilities.
                self._forget(server)
                now = time.monotonic() if now is None else now
                if now < server.next_attempt:
                    continue
                try:
                    conn.connect()
                    log.info("worker %s: connected to gearmand %s", self.client_id, server.address)
                except OSError as exc:
                    self._drop(server, exc)
                    continue
            if server.version != self._version:
                try:
                    self._register(server)
                except _CONNECTION_ERRORS as exc:
                    self._drop(server, exc)
                    continue
            live.append(server)
        if live:
            self._down_since = None
        elif self._down_since is None:
            self._down_since = time.monotonic()
        return live

    def _gone(self) -> bool:
        """Whether the caller's ``give_up`` says the servers are gone for good."""
        if self.give_up is None or self._down_since is None:
            return False
        silent = time.monotonic() - self._down_since
        if not self.give_up(silent):
            return False
        log.error("worker %s: no gearmand has answered for %.0fs (%s); stopping", self.client_id, silent,
                  ", ".join(s.address for s in self._servers))
        return True

    # -- grabbing and running --------------------------------------------------------

    def _choosing(self, server: _Server) -> bool:
        return self._prefer is not None and server.session is not None and len(server.registered) > 1

    def _ask(self, server: _Server) -> None:
        """A job has started: ask for the status now, its answer read when the job ends. Counts
        a job old choose as well as fresh ones (bench/schedule.py: 1.035 of the bound either way
        at 128 slots), and a fresh ask would put a round trip between the result and the grab."""
        if server.session is None or not self._choosing(server):
            return
        try:
            server.session.ask()
        except (OSError, ProtocolError, ServerError) as exc:
            log.warning("worker %s: cannot ask gearmand %s for its status (%s)", self.client_id, server.address, exc)

    def _reorder(self, server: _Server) -> bytes:
        """CANT_DO + CAN_DO of the function ``prefer`` names, when it is not in front already:
        gearmand puts a function's new CAN_DO first. Without an answer from ``status`` the
        order stays as it is (the grab still goes out)."""
        if server.session is None or not self._choosing(server):
            return b""
        # Still marked sleeping with no answer on its way: the idle wait timed out without a
        # NOOP, so nothing was queued since its last NO_JOB, and a status would say what it did.
        if server.sleeping and not server.session.asked:
            return b""
        try:
            waiting = server.session.waiting(server.registered)
        except (OSError, ProtocolError, ServerError) as exc:
            log.warning("worker %s: no status from gearmand %s (%s); jobs taken in the registered order",
                        self.client_id, server.address, exc)
            return b""
        try:
            fn = self._prefer(waiting) if self._prefer is not None else None
        except Exception:
            # The choice goes out with a job's result: it must never hold the result back.
            log.exception("worker %s: the preference failed; jobs taken in the registered order", self.client_id)
            return b""
        if fn is None or fn == server.front or fn not in server.registered:
            return b""
        server.front = fn
        return encode(Command.CANT_DO, fn) + encode(Command.CAN_DO, fn)

    def _grab(self, server: _Server) -> Job | None:
        conn = server.connection
        if not server.grab_sent:
            conn.send_raw(self._reorder(server) + _GRAB)
        server.grab_sent = False
        server.sleeping = False
        while True:
            packet = conn.recv(self._io_timeout, spin=SPIN)
            if packet.command in (Command.JOB_ASSIGN_UNIQ, Command.JOB_ASSIGN, Command.NO_JOB):
                # Reset the backoff only once the server really answered: a server that
                # accepts and then drops us keeps backing off instead of spinning.
                server.backoff = 0.0
            if packet.command is Command.JOB_ASSIGN_UNIQ:
                self._ask(server)
                return Job(conn, packet.text(0), packet.text(1), packet.text(2), packet.arg(3))
            if packet.command is Command.JOB_ASSIGN:
                self._ask(server)
                return Job(conn, packet.text(0), packet.text(1), "", packet.arg(2))
            if packet.command is Command.NO_JOB:
                return None
            if packet.command is Command.ERROR:
                # An answer to an earlier request (CAN_DO, PRE_SLEEP): the grab's own answer is
                # still to come, and left unread it would answer the next grab.
                log.error(
                    "worker %s: gearmand %s error: %s %s",
                    self.client_id,
                    server.address,
                    packet.text(0),
                    packet.text(1),
                )
                continue
            # NOOP from an earlier PRE_SLEEP, or anything unexpected: skip it.
            if packet.command is not Command.NOOP:
                log.debug(
                    "worker %s: ignoring %s from %s", self.client_id, packet.command.name, server.address
                )

    def _run(self, job: Job, server: _Server | None = None, stop: threading.Event | None = None) -> None:
        with self._lock:
            handler = self._handlers.get(job.function)
        if handler is None:
            log.error("worker %s: no handler for %s (job %s)", self.client_id, job.function, job.handle)
            job._finish(Command.WORK_FAIL)
            return
        try:
            result = handler(job)
            payload = _as_bytes(result)
        except Exception:
            log.exception(
                "worker %s: handler for %s failed on job %s (unique %r)",
                self.client_id,
                job.function,
                job.handle,
                job.unique,
            )
            job._finish(Command.WORK_FAIL)
            return
        # Not once stopping (the handler may have run into a SIGTERM): a job gearmand hands to a
        # worker that then leaves counts as a worker death against --job-retries.
        if server is None or (stop is not None and stop.is_set()):
            job._finish(Command.WORK_COMPLETE, payload)
            return
        # The result, the next job's order (``prefer``) and the next grab in one write: one
        # system call and one wake-up of gearmand fewer per job, on the path every job's
        # latency takes.
        sent = job._finish(Command.WORK_COMPLETE, payload, then=self._reorder(server) + _GRAB)
        server.grab_sent = sent and server.connection.connected

    def _grab_and_run(self, stop: threading.Event | None = None) -> bool:
        """Try every live server once (in ``_order``); run at most one job. With ``stop`` (the
        work loop's), the next grab may go out with the job's result while stop is not set."""
        live = self._live()
        if not live:
            return False
        for server in self._order(live):
            job = self._try_grab(server)
            if job is not None:
                self._last = server
                # The next grab goes out with the result when that server is to be asked first
                # next time round (_stays), as a grab whose answer is pending is read first.
                self._run(job, server if stop is not None and self._stays(server) else None, stop)
                return True
        return False

    def _order(self, live: list[_Server]) -> list[_Server]:
        """The servers to ask for a job, in turn: one whose grab went out already first (its
        answer must be read before another job is taken); else the last job's server first,
        unless LOOK_AROUND passed since the others were asked first, when they come first, in
        turn from the one after it."""
        pending = [s for s in live if s.grab_sent]
        if pending:
            return pending + [s for s in live if not s.grab_sent]
        last = self._last if self._last in live else None
        if last is None:
            start = self._next % len(live)
            self._next += 1
            self._looked = time.monotonic()
            return live[start:] + live[:start]
        at = live.index(last)
        others = live[at + 1:] + live[:at]
        if others and not self._stays(last):
            self._looked = time.monotonic()
            return others + [last]
        return [last, *others]

    def _stays(self, server: _Server) -> bool:
        """Whether ``server``, which gave the last job, is to be asked first next time: it is the
        only one connected, or the others were asked first within LOOK_AROUND seconds."""
        alone = all(s is server or not s.connection.connected for s in self._servers)
        return alone or time.monotonic() - self._looked < LOOK_AROUND

    def _sleep(self, timeout: float, stop: threading.Event | None = None, eager: bool = False) -> None:
        """PRE_SLEEP on every live server and wait for a NOOP (or timeout / reconnect). ``eager``:
        a job just ran, so spin a moment before sleeping (IDLE_SPIN)."""
        live = []
        for server in self._servers:
            if not server.connection.connected:
                continue
            try:
                if not server.sleeping:
                    server.connection.send(Command.PRE_SLEEP)
                    server.sleeping = True
                live.append(server)
            except _CONNECTION_ERRORS as exc:
                self._drop(server, exc)
        # Wake up no later than the next scheduled reconnect attempt.
        pending = [s.next_attempt for s in self._servers if not s.connection.connected]
        if pending:
            timeout = max(0.0, min(timeout, min(pending) - time.monotonic()))
        if not live and stop is not None:
            stop.wait(timeout)
            return
        # Any packet (a NOOP, an ERROR, or EOF) ends the sleep of its server, and the grab that
        # follows reads it: like libgearman, the GRAB goes out as soon as the socket is readable,
        # without a read of the NOOP first (one system call and one Python turn fewer per job).
        ready = [s for s in live if s.connection.has_buffered()]
        if not ready:
            fds = tuple(s.connection.fileno() for s in live)
            poller = self._poller
            if fds != self._poll_fds or poller is None:
                poller = select.poll()
                for fd in fds:
                    poller.register(fd, select.POLLIN | select.POLLPRI)
                poller.register(self._wake_r.fileno(), select.POLLIN)
                self._poll_fds, self._poller = fds, poller
            events: dict[int, int] = {}
            if eager:
                # Right after a job, the next one often comes within a few hundred µs (a client
                # submitting one by one): look without sleeping for a moment first (SPIN, for why).
                end = time.perf_counter() + IDLE_SPIN
                while not events and time.perf_counter() < end:
                    os.sched_yield()
                    events = dict(poller.poll(0))
            if not events:
                events = dict(poller.poll(max(0, int(timeout * 1000))))
            if self._wake_r.fileno() in events:
                try:
                    while self._wake_r.recv(64):
                        pass
                except (BlockingIOError, OSError):
                    pass
            ready = [s for s in live if s.connection.fileno() in events]
        for server in ready:
            server.sleeping = False

    # -- public loops ----------------------------------------------------------------

    def work_one(self, timeout: float) -> bool:
        """Process at most one job, waiting up to ``timeout`` s.  True if one ran."""
        deadline = time.monotonic() + timeout
        while True:
            if self._grab_and_run():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._sleep(min(remaining, self.poll_interval))

    def work(self, stop: threading.Event) -> None:
        """Serve jobs until ``stop`` is set; never raises for server/protocol trouble."""
        try:
            ran = False
            while not stop.is_set() and not self._gone():
                try:
                    if self._grab_and_run(stop):
                        ran = True
                        continue
                    if not ran and self.idle is not None:
                        self.idle()
                    self._sleep(self.poll_interval, stop, eager=ran)
                    ran = False
                except Exception:
                    # A bug-shaped surprise (not a connection error, those are handled
                    # inside): log it, reset connections and keep serving.
                    log.exception("worker %s: unexpected error in work loop; reconnecting", self.client_id)
                    for server in self._servers:
                        self._drop(server, "unexpected error")
                    stop.wait(min(self.poll_interval, 1.0))
            self._settle()
        finally:
            self.close()

    def _settle(self) -> None:
        """Stopping with a grab still out (stop came between a job's result and the next loop):
        read its answer, and run a job it brings rather than leave with it."""
        for server in self._servers:
            if server.grab_sent and server.connection.connected:
                job = self._try_grab(server)
                if job is not None:
                    self._run(job)

    def _try_grab(self, server: _Server) -> Job | None:
        """_grab, with a broken connection dropped (to be reconnected) instead of raised."""
        try:
            return self._grab(server)
        except _CONNECTION_ERRORS as exc:
            self._drop(server, exc)
            return None


def _as_bytes(result: object) -> bytes:
    if result is None:
        return b""
    if isinstance(result, (bytes, bytearray, memoryview)):
        return bytes(result)
    if isinstance(result, str):
        return result.encode("utf-8")
    raise TypeError(f"handler must return bytes, got {type(result).__name__}")


__all__ = ["Handler", "Job", "Worker"]
