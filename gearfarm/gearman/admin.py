"""Gearman administrative (text) protocol: ``status``, ``workers``, ``version``, ``maxqueue``.

gearmand speaks a line protocol on the same port as the binary one (it looks at the
first byte).  Each helper opens a short-lived connection, because admin queries are
rare and a fresh socket can never be confused by leftovers of an earlier query; a Session
keeps one for a worker slot's frequent ``status`` (a reply holding more than the one answer
asked for closes it, so leftovers cannot answer a later query).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Container
from dataclasses import dataclass, field

from .errors import ProtocolError, ServerError, ServerUnavailable
from .protocol import format_address

# A reply bigger than this is not something gearmand would send for our commands.
_MAX_REPLY = 64 * 1024 * 1024


@dataclass(frozen=True)
class FunctionStatus:
    """One line of ``status``: jobs queued (including running), running, capable workers."""

    queued: int
    running: int
    workers: int


@dataclass(frozen=True)
class WorkerInfo:
    """One line of ``workers``: ``fd ip client_id : function ...`` (client_id ``-`` if unset)."""

    fd: int
    ip: str
    client_id: str
    functions: list[str] = field(default_factory=list)


def _connect(host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float,
             server_hostname: str | None = None) -> socket.socket:
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise ServerUnavailable([(format_address(host, port), exc)]) from exc
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
    except OSError as exc:
        sock.close()
        raise ServerUnavailable([(format_address(host, port), exc)]) from exc
    return sock


def _send(sock: socket.socket, address: str, command: str) -> None:
    try:
        sock.sendall(command.encode("ascii") + b"\n")
    except OSError as exc:
        raise ServerUnavailable([(address, exc)]) from exc


def _exchange(sock: socket.socket, address: str, command: str, *, multiline: bool, timeout: float) -> list[str]:
    """Send one admin command on ``sock``; return the reply lines (without the final ``.``)."""
    _send(sock, address, command)
    return _reply(sock, address, command, multiline=multiline, timeout=timeout)


def _reply(sock: socket.socket, address: str, command: str, *, multiline: bool, timeout: float) -> list[str]:
    """Read the reply to ``command``, sent on ``sock`` already."""
    deadline = time.monotonic() + timeout
    try:
        buf = b""
        while True:
            lines = buf.split(b"\n")
            complete = [line.rstrip(b"\r").decode("utf-8", "replace") for line in lines[:-1]]
            if complete and complete[0].startswith("ERR "):
                _, _, rest = complete[0].partition(" ")
                code, _, text = rest.partition(" ")
                raise ServerError(address, code, text.replace("+", " "))
            if multiline and "." in complete:
                if len(lines) - 1 > complete.index(".") + 1 or lines[-1]:
                    raise ProtocolError(f"gearmand admin {address}: more than one reply to {command!r}")
                return complete[: complete.index(".")]
            if not multiline and complete:
                if len(complete) > 1 or lines[-1]:
                    raise ProtocolError(f"gearmand admin {address}: more than one reply to {command!r}")
                return complete[:1]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"gearmand admin {address}: no complete reply to {command!r} within {timeout}s"
                )
            sock.settimeout(remaining)
            chunk = sock.recv(65536)
            if not chunk:
                raise ProtocolError(
                    f"gearmand admin {address} closed the connection mid-reply to {command!r}"
                )
            buf += chunk
            if len(buf) > _MAX_REPLY:
                raise ProtocolError(f"gearmand admin {address}: reply to {command!r} too large")
    except OSError as exc:
        if isinstance(exc, TimeoutError):
            raise
        raise ServerUnavailable([(address, exc)]) from exc


def _command(
    host: str,
    port: int,
    command: str,
    *,
    multiline: bool,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
) -> list[str]:
    """One admin command on a connection of its own."""
    sock = _connect(host, port, ssl_context, timeout)
    try:
        return _exchange(sock, format_address(host, port), command, multiline=multiline, timeout=timeout)
    finally:
        sock.close()


class Session:
    """One admin connection kept open for many ``status`` queries: a worker slot that asks
    before every job (gearfarm.run.priority.Preference) would otherwise pay a connection, and
    behind TLS a handshake, each time. ``ask`` sends the query and ``waiting`` reads its answer,
    so a slot can ask when a job starts and read the answer, long since arrived, when it ends:
    no round trip between two jobs. Any failure closes it; the next query reconnects."""

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None, timeout: float = 5.0,
                 server_hostname: str | None = None) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.ssl_context, self.server_hostname = ssl_context, server_hostname
        self._sock: socket.socket | None = None
        self._asked = False  # a ``status`` sent whose answer is unread

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    @property
    def connected(self) -> bool:
        """A connection is open (it may have been closed by the server since)."""
        return self._sock is not None

    @property
    def asked(self) -> bool:
        """A ``status`` is out whose answer ``waiting`` has not read yet."""
        return self._asked

    def ask(self) -> None:
        """Send ``status`` now, its answer read by the next ``waiting`` (a second ask before
        then sends nothing: one answer is outstanding at most)."""
        if self._asked:
            return
        try:
            _send(self._open(), self.address, "status")
            self._asked = True
        except BaseException:
            self.close()
            raise

    def _open(self) -> socket.socket:
        if self._sock is None:
            self._sock = _connect(self.host, self.port, self.ssl_context, self.timeout, self.server_hostname)
        return self._sock

    def waiting(self, functions: Container[str]) -> dict[str, int]:
        """Jobs queued and not running, of each of ``functions`` gearmand knows: the answer to
        the last ``ask``, or to one sent now. Only their lines are parsed: a slot asks before
        every job, and the farm's other functions are hundreds of lines."""
        got = {}
        for line in self._answer():
            name = line.partition("\t")[0]
            if name in functions:
                st = _parse_status(self.address, [line])[name]
                got[name] = max(0, st.queued - st.running)
        return got

    def status(self) -> dict[str, FunctionStatus]:
        """Every function's counters (as ``status``), on this session's connection."""
        lines = self._answer()
        try:
            return _parse_status(self.address, lines)
        except BaseException:
            self.close()
            raise

    def _answer(self) -> list[str]:
        """The lines answering the last ``ask``, or one sent now."""
        self.ask()
        try:
            self._asked = False
            return _reply(self._open(), self.address, "status", multiline=True, timeout=self.timeout)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._asked = False
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def status(
    host: str, port: int, ssl_context: ssl.SSLContext | None = None, timeout: float = 5.0
) -> dict[str, FunctionStatus]:
    """Per-function queue counters from the ``status`` command."""
    lines = _command(host, port, "status", multiline=True, ssl_context=ssl_context, timeout=timeout)
    return _parse_status(format_address(host, port), lines)


def _parse_status(address: str, lines: list[str]) -> dict[str, FunctionStatus]:
    result: dict[str, FunctionStatus] = {}
    for line in lines:
        parts = line.split("\t")
        if len(parts) != 4:
            raise ProtocolError(f"gearmand admin {address}: unexpected status line {line!r}")
        try:
            result[parts[0]] = FunctionStatus(int(parts[1]), int(parts[2]), int(parts[3]))
        except ValueError:
            raise ProtocolError(f"gearmand admin {address}: unexpected status line {line!r}") from None
    return result


def workers(
    host: str, port: int, ssl_context: ssl.SSLContext | None = None, timeout: float = 5.0
) -> list[WorkerInfo]:
    """Connected clients/workers from the ``workers`` command.

    gearmand lists every connection, including plain clients (and this admin
    connection itself) with no functions, so filter on ``functions`` if needed.
    """
    result: list[WorkerInfo] = []
    address = format_address(host, port)
    for line in _command(host, port, "workers", multiline=True, ssl_context=ssl_context, timeout=timeout):
        # Split on " :" rather than ":" -- IPv6 addresses contain colons.
        head, sep, tail = line.partition(" :")
        parts = head.split(None, 2)
        if not sep or len(parts) < 2:
            raise ProtocolError(f"gearmand admin {address}: unexpected workers line {line!r}")
        try:
            fd = int(parts[0])
        except ValueError:
            raise ProtocolError(f"gearmand admin {address}: unexpected workers line {line!r}") from None
        client_id = parts[2] if len(parts) > 2 else "-"
        result.append(WorkerInfo(fd=fd, ip=parts[1], client_id=client_id, functions=tail.split()))
    return result


def version(host: str, port: int, ssl_context: ssl.SSLContext | None = None, timeout: float = 5.0) -> str:
    """Server version string, e.g. ``1.1.20+ds``."""
    (line,) = _command(host, port, "version", multiline=False, ssl_context=ssl_context, timeout=timeout)
    if not line.startswith("OK "):
        raise ProtocolError(f"gearmand admin {format_address(host, port)}: unexpected version reply {line!r}")
    return line[3:].strip()


def getpid(host: str, port: int, ssl_context: ssl.SSLContext | None = None, timeout: float = 5.0) -> int:
    """Process id of the server (used to check that *our* gearmand owns a port)."""
    (line,) = _command(host, port, "getpid", multiline=False, ssl_context=ssl_context, timeout=timeout)
    try:
        return int(line.removeprefix("OK").strip())
    except ValueError:
        raise ProtocolError(
            f"gearmand admin {format_address(host, port)}: unexpected getpid reply {line!r}"
        ) from None


def maxqueue(host: str, port: int, function: str, size: int | None = None,
             ssl_context: ssl.SSLContext | None = None, timeout: float = 5.0) -> None:
    """Set the queue limit of ``function`` (gearmand's ``maxqueue``: submissions past it are
    refused with QUEUE_ERROR); None lifts it (gearmand's default, 0: no limit). gearmand applies it
    only to a function it knows, and answers OK either way."""
    if not function or any(c.isspace() for c in function):
        raise ValueError(f"not a function name gearmand's text protocol can carry: {function!r}")
    command = f"maxqueue {function}" + ("" if size is None else f" {int(size)}")
    (line,) = _command(host, port, command, multiline=False, ssl_context=ssl_context, timeout=timeout)
    if line.strip() != "OK":
        raise ProtocolError(f"gearmand admin {format_address(host, port)}: unexpected maxqueue reply {line!r}")
