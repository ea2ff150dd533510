"""Synchronous Gearman client: submit background/foreground jobs, query job status.

Thread model: a ``Client`` may be shared by many threads.  Each thread gets its own
connection per server (thread-local), so a thread blocked on a long foreground job never
stalls another thread's submissions and replies can never be handed to the wrong
caller.  Failover: servers are tried in the configured order; a connection that turns
out dead (server restarted) is reopened once before moving on, which is what makes the
client survive a gearmand restart without any help from the caller.
"""

from __future__ import annotations

import itertools
import logging
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import TypeVar

from .errors import GearmanError, JobFailed, JobLost, ProtocolError, ServerError, ServerUnavailable, StatusUnknown
from .protocol import (
    MAX_FUNCTION_SIZE,
    MAX_UNIQUE_SIZE,
    SPIN,
    Command,
    Connection,
    Packet,
    check_name,
    encode,
    format_address,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_BG_COMMANDS = {
    "normal": Command.SUBMIT_JOB_BG,
    "high": Command.SUBMIT_JOB_HIGH_BG,
    "low": Command.SUBMIT_JOB_LOW_BG,
}
_FG_COMMANDS = {
    "normal": Command.SUBMIT_JOB,
    "high": Command.SUBMIT_JOB_HIGH,
    "low": Command.SUBMIT_JOB_LOW,
}

# Pipelined submissions are sent in chunks so neither side's socket buffers can fill
# up while the other is still writing (a classic pipelining deadlock).
_PIPELINE_CHUNK = 256


def _chunks(jobs: Iterable[BackgroundJob]) -> Iterator[list[BackgroundJob]]:
    """``jobs`` in chunks of 1, 2, 4, ... up to _PIPELINE_CHUNK, taken from ``jobs`` as each
    is sent. gearmand hands out none of a pipelined chunk's jobs before it has queued the
    whole chunk, and with its persistent queue each job queued is a committed sqlite write
    (an fsync): a target's 49 suites sent as one chunk held the first of them 50-100 ms, while
    idle workers waited (docs/speed.md). Doubling, the n-th job waits for about n commits
    and a handful of round trips, and the caller's next jobs are made (signed) meanwhile."""
    it = iter(jobs)
    size = 1
    while chunk := list(itertools.islice(it, size)):
        yield chunk
        size = min(2 * size, _PIPELINE_CHUNK)

# Errors that mean "this connection is unusable", as opposed to an answer from the server.
_CONNECTION_ERRORS = (OSError, ProtocolError)


@dataclass(frozen=True)
class JobStatus:
    """Reply to GET_STATUS.  ``known`` is False once the job finished (or never existed)."""

    handle: str
    known: bool
    running: bool
    numerator: int
    denominator: int


@dataclass(frozen=True)
class BackgroundJob:
    """One entry for :meth:`Client.submit_background_many`."""

    function: str
    data: bytes
    unique: str


def _int(raw: bytes) -> int:
    try:
        return int(raw.rstrip(b"\0") or b"0")
    except ValueError:
        return 0


def _raise_error_packet(conn: Connection, packet: Packet) -> None:
    raise ServerError(conn.address, packet.text(0), packet.text(1))


class Client:
    """Gearman client.  Use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        servers: Sequence[tuple[str, int]],
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 5.0,
        io_timeout: float = 30.0,
        server_hostname: str | None = None,
    ) -> None:
        if not servers:
            raise ValueError("Client needs at least one (host, port) server")
        self.servers = [(str(h), int(p)) for h, p in servers]
        self._ssl_context = ssl_context
        self._server_hostname = server_hostname
        self._connect_timeout = connect_timeout
        self._io_timeout = io_timeout
        self._local = threading.local()
        # Weak: a finished thread's thread-local connections are garbage collected
        # (closing their sockets) instead of piling up until close().
        self._all: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    # -- connection management -------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection opened by any thread.  The client is unusable after."""
        with self._lock:
            self._closed = True
            conns, self._all = list(self._all), weakref.WeakSet()
        for conn in conns:
            conn.close()

    def _conns(self) -> dict[int, Connection]:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        return conns

    def _connection(self, index: int) -> Connection:
        if self._closed:
            raise GearmanError("client is closed")
        conns = self._conns()
        conn = conns.get(index)
        if conn is not None and conn.connected:
            return conn
        host, port = self.servers[index]
        conn = Connection(
            host,
            port,
            ssl_context=self._ssl_context,
            server_hostname=self._server_hostname,
            connect_timeout=self._connect_timeout,
            io_timeout=self._io_timeout,
        )
        conn.connect()
        try:
            # Ask gearmand to forward WORK_EXCEPTION payloads (otherwise they arrive as a
            # bare WORK_FAIL and the worker's error text is lost).
            reply = conn.request(Command.OPTION_REQ, "exceptions")
            if reply.command is Command.ERROR:
                log.debug("gearmand %s refused option 'exceptions': %s", conn.address, reply.args)
        except BaseException:
            conn.close()
            raise
        conns[index] = conn
        with self._lock:
            if self._closed:  # close() ran while we were connecting
                conn.close()
                raise GearmanError("client is closed")
            self._all.add(conn)
        return conn

    def _drop(self, index: int) -> None:
        conn = self._conns().pop(index, None)
        if conn is not None:
            conn.close()

    def _with_failover(self, operation: Callable[[Connection], T]) -> T:
        """Run ``operation`` on the first server that works.

        A cached connection may be stale (the server restarted since it was opened: the
        first send "succeeds" into a dead socket and the reply read hits EOF), so every
        server gets one retry on a fresh connection before we move on to the next one.
        """
        attempts: list[tuple[str, BaseException | str]] = []
        for index, (host, port) in enumerate(self.servers):
            address = format_address(host, port)
            for _retry in range(2):
                try:
                    conn = self._connection(index)
                except OSError as exc:
                    attempts.append((address, exc))
                    break  # cannot even connect: next server
                try:
                    return operation(conn)
                except _CONNECTION_ERRORS as exc:
                    log.debug("gearmand %s: connection unusable (%s), reconnecting", address, exc)
                    self._drop(index)
                    attempts.append((address, exc))
        raise ServerUnavailable(attempts)

    # -- public API ------------------------------------------------------------------

    def submit_background(self, function: str, data: bytes, unique: str, priority: str = "normal") -> str:
        """Queue a background job and return its job handle.

        ``unique`` is mandatory: gearmand coalesces jobs with the same unique id while
        one is queued, which makes our retry-after-reconnect safe, and (measured on
        1.1.20) background jobs with an empty unique id overwrite each other in the
        libsqlite3 persistent queue.
        """
        command = _command(_BG_COMMANDS, priority)
        packet = _submit_packet(command, function, data, unique)

        def operation(conn: Connection) -> str:
            conn.send_raw(packet)
            return self._await_created(conn)

        return self._with_failover(operation)

    def submit_background_many(self, jobs: Iterable[BackgroundJob], priority: str = "normal") -> list[str]:
        """Queue many background jobs, pipelined; return their handles in input order.

        Much faster than one-by-one submission (no round trip per job).  The jobs go in
        chunks of 1, 2, 4, ... 256 (``_chunks``), each taken from ``jobs`` when it is
        sent: the first are handed out while the rest are still made and sent.  If a
        server dies mid-batch the whole remaining chunk is resubmitted elsewhere; unique
        ids make the already-queued ones coalesce instead of duplicating.

        If the server answers a submission with an ERROR packet (e.g. ``QUEUE_ERROR``
        when a ``maxqueue`` limit is reached) this raises :class:`ServerError` at once,
        naming the server, the error and the submission (``index``), without trying
        another server: the server is up and said no.  The jobs before the failing one
        stay queued (their handles are in the exception's ``submitted``).  The rest of
        its chunk was already sent and may or may not have been queued, since their
        replies are discarded with the connection; later chunks are not sent (nor taken
        from ``jobs``).  Resubmitting the whole batch is safe: the unique ids coalesce.
        A job the protocol cannot carry (a function name or unique id it refuses, data
        that is not bytes) raises ValueError or TypeError when its chunk is made, the
        chunks before it queued.
        """
        total = f" of {len(jobs)}" if isinstance(jobs, Sized) else ""
        batch: list[BackgroundJob] = []
        command = _command(_BG_COMMANDS, priority)
        handles: list[str] = []
        for part in _chunks(jobs):
            start = len(batch)
            batch.extend(part)
            chunk = [_submit_packet(command, j.function, j.data, j.unique) for j in part]

            def operation(conn: Connection, chunk: list[bytes] = chunk, start: int = start) -> list[str]:
                conn.send_raw(b"".join(chunk))
                # gearmand answers requests on one connection in order, so the n-th
                # JOB_CREATED (or ERROR) belongs to the n-th submission.
                created: list[str] = []
                for offset in range(len(chunk)):
                    reply = self._await(conn, Command.JOB_CREATED, raise_error=False)
                    if reply.command is Command.ERROR:
                        # The replies to the rest of the chunk are still in flight; left
                        # unread they would answer this thread's next requests.
                        self._drop_connection(conn)
                        index = start + offset
                        job = batch[index]
                        raise ServerError(
                            conn.address,
                            reply.text(0),
                            reply.text(1),
                            request=f"answering submission {index + 1}{total} in the batch: "
                            f"function {job.function!r}, unique {job.unique!r}",
                            index=index,
                            submitted=handles + created,
                        )
                    created.append(reply.text(0))
                return created

            handles.extend(self._with_failover(operation))
        return handles

    def submit(
        self,
        function: str,
        data: bytes,
        unique: str,
        timeout: float | None = None,
        priority: str = "normal",
        on_status: Callable[[int, int], None] | None = None,
        on_data: Callable[[bytes], None] | None = None,
    ) -> bytes:
        """Run a foreground job and return its WORK_COMPLETE data.

        Raises ``JobFailed`` on WORK_FAIL/WORK_EXCEPTION, ``TimeoutError`` if no result
        arrives within ``timeout`` seconds (the job keeps running on the farm; a late
        result is discarded), ``JobLost`` if the server connection dies after the job
        was accepted, ``ServerError`` at once if the server answers with an ERROR
        packet, whether it refuses the submission (e.g. ``QUEUE_ERROR``, not retried on
        another server) or while the result is awaited.  WORK_STATUS / WORK_DATA go to
        the optional callbacks.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        command = _command(_FG_COMMANDS, priority)
        packet = _submit_packet(command, function, data, unique)

        def operation(conn: Connection) -> tuple[Connection, str]:
            conn.send_raw(packet)
            # Only the io timeout applies until the server accepted the job: a slow
            # JOB_CREATED means a sick server, which failover should handle.
            return conn, self._await_created(conn)

        conn, handle = self._with_failover(operation)
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"job {handle} ({function}, unique {unique!r}) not done within {timeout}s")
            try:
                # A short job's result comes within microseconds of its JOB_CREATED.
                reply = conn.recv(remaining, spin=SPIN)
            except TimeoutError:
                continue  # the loop raises the descriptive TimeoutError
            except (OSError, ProtocolError) as exc:
                self._drop_connection(conn)
                raise JobLost(f"lost gearmand {conn.address} while waiting for job {handle}: {exc}") from exc
            if reply.command is Command.ERROR:
                # Its first argument is an error code, not a handle, so the handle check
                # below would skip it and leave us waiting.  gearmand 1.1.20 only sends
                # ERROR in answer to a request on this connection, so something else was
                # sent on it: we cannot tell what is still in flight, hence the drop.
                self._drop_connection(conn)
                raise ServerError(
                    conn.address,
                    reply.text(0),
                    reply.text(1),
                    request=f"while waiting for job {handle} ({function}, unique {unique!r})",
                )
            if reply.text(0) != handle:
                # Late result of an earlier job on this connection that timed out.
                continue
            if reply.command is Command.WORK_COMPLETE:
                return reply.arg(1)
            if reply.command is Command.WORK_FAIL:
                raise JobFailed(handle)
            if reply.command is Command.WORK_EXCEPTION:
                raise JobFailed(handle, reply.arg(1))
            if reply.command is Command.WORK_STATUS and on_status is not None:
                on_status(_int(reply.arg(1)), _int(reply.arg(2)))
            elif reply.command is Command.WORK_DATA and on_data is not None:
                on_data(reply.arg(1))
            # WORK_WARNING and anything else for this handle: informational, ignored.

    def get_status(self, handle: str) -> JobStatus:
        """Ask the servers (in order) about ``handle``; the first that knows it answers.

        Handles do not say which server issued them, so "unknown" (``known=False``) is
        only returned when every server answered and none knows the job.  If some say
        "unknown" and others cannot be reached, the job may be on an unreachable one:
        that raises :class:`StatusUnknown` naming them ("cannot tell now"), and
        ``ServerUnavailable`` if no server answered at all.
        """
        return self._status(Command.GET_STATUS, Command.STATUS_RES, handle)

    def get_status_unique(self, unique: str) -> JobStatus:
        """Status of the job with this unique id (GET_STATUS_UNIQ), from any server.

        The farm knows every job's unique id but not the handles of jobs that workers
        submitted, so this is how it watches a job's heartbeat (WORK_STATUS numerator).
        ``handle`` in the answer is the unique id.  Unreachable servers are handled as
        in :meth:`get_status` (``StatusUnknown`` / ``ServerUnavailable``).
        """
        return self._status(Command.GET_STATUS_UNIQ, Command.STATUS_RES_UNIQ, unique)

    def _status(self, command: Command, expect: Command, key: str) -> JobStatus:
        unanswered: list[tuple[str, BaseException | str]] = []
        answered: list[str] = []
        for index, (host, port) in enumerate(self.servers):
            address = format_address(host, port)
            failures: list[tuple[str, BaseException | str]] = []
            reply: Packet | None = None
            # Same retry rule as _with_failover: a stale connection gets one fresh try.
            for _retry in range(2):
                try:
                    conn = self._connection(index)
                except _CONNECTION_ERRORS as exc:
                    failures.append((address, exc))
                    break  # cannot even connect: do not wait for a second refusal
                try:
                    reply = self._rpc(conn, command, key, expect=expect)
                    break
                except _CONNECTION_ERRORS as exc:
                    self._drop(index)
                    failures.append((address, exc))
            if reply is None:
                unanswered.extend(failures)
                continue
            answered.append(address)
            status = JobStatus(
                handle=reply.text(0),
                known=reply.arg(1) == b"1",
                running=reply.arg(2) == b"1",
                numerator=_int(reply.arg(3)),
                denominator=_int(reply.arg(4)),
            )
            if status.known:
                return status
        if not answered:
            raise ServerUnavailable(unanswered)
        if unanswered:
            # The job may be on a server we could not ask: "unknown" would make callers
            # resubmit (or give up on) a job that is alive.
            raise StatusUnknown(key, unanswered, answered)
        return JobStatus(key, False, False, 0, 0)

    def echo(self, data: bytes = b"ping") -> bytes:
        """Round-trip ``data`` through the first reachable server (a liveness check)."""

        def operation(conn: Connection) -> bytes:
            return self._rpc(conn, Command.ECHO_REQ, data, expect=Command.ECHO_RES).arg(0)

        return self._with_failover(operation)

    # -- helpers ---------------------------------------------------------------------

    def _drop_connection(self, conn: Connection) -> None:
        conns = self._conns()
        for index, cached in list(conns.items()):
            if cached is conn:
                del conns[index]
        conn.close()

    def _rpc(self, conn: Connection, command: Command, *args: bytes | str, expect: Command) -> Packet:
        conn.send(command, *args)
        return self._await(conn, expect)

    def _await(self, conn: Connection, expect: Command, raise_error: bool = True) -> Packet:
        """Read until the reply ``expect`` arrives, skipping stray job updates.

        An ERROR packet raises ``ServerError``, or is returned if ``raise_error`` is
        False (for callers that must add context or clean up first).
        """
        io_deadline = time.monotonic() + self._io_timeout
        timeout = self._io_timeout  # the whole of it at first: recv() then reads without a poll
        while True:
            reply = conn.recv(timeout, spin=SPIN)
            timeout = max(0.0, io_deadline - time.monotonic())
            if reply.command is expect:
                return reply
            if reply.command is Command.ERROR:
                if not raise_error:
                    return reply
                _raise_error_packet(conn, reply)
            # WORK_* for an earlier, timed-out foreground job on this connection: skip.

    def _await_created(self, conn: Connection) -> str:
        return self._await(conn, Command.JOB_CREATED).text(0)


def _command(table: dict[str, Command], priority: str) -> Command:
    try:
        return table[priority]
    except KeyError:
        raise ValueError(f"priority must be one of {sorted(table)}, not {priority!r}") from None


def _submit_packet(command: Command, function: str, data: bytes, unique: str) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"job data must be bytes, not {type(data).__name__}")
    fn = check_name("function", function, MAX_FUNCTION_SIZE)
    uq = check_name("unique id", unique, MAX_UNIQUE_SIZE)
    return encode(command, fn, uq, bytes(data))
