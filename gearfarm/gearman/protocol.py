"""Gearman binary protocol: packet encoding/decoding and a buffered socket connection.

Wire format (http://gearman.org/protocol/): a 12-byte header -- 4-byte magic
(``\\0REQ`` towards the server, ``\\0RES`` from it), a big-endian command code and a
big-endian payload size -- followed by the payload, whose arguments are separated by
NUL bytes.  Only the *last* argument may contain NULs (it carries opaque job data),
so decoding must know how many arguments each command has; that is what
``ARG_COUNTS`` is for.
"""

from __future__ import annotations

import enum
import os
import select
import socket
import ssl
import struct
import threading
import time

from .errors import ConnectionClosed, ProtocolError

REQ = b"\0REQ"
RES = b"\0RES"
HEADER = struct.Struct(">4sII")
HEADER_SIZE = HEADER.size

# gearmand itself refuses payloads far below this; the cap only stops a garbage header
# from making us try to buffer gigabytes.
MAX_PAYLOAD = 256 * 1024 * 1024

# gearmand limits (libgearman/constants.h): unique ids are at most 64 bytes, function
# names at most 512.  Checking here gives a clear ValueError instead of a server ERROR.
MAX_UNIQUE_SIZE = 64
MAX_FUNCTION_SIZE = 512


class Command(enum.IntEnum):
    """Binary packet types, numbered as in the protocol specification."""

    CAN_DO = 1
    CANT_DO = 2
    RESET_ABILITIES = 3
    PRE_SLEEP = 4
    NOOP = 6
    SUBMIT_JOB = 7
    JOB_CREATED = 8
    GRAB_JOB = 9
    NO_JOB = 10
    JOB_ASSIGN = 11
    WORK_STATUS = 12
    WORK_COMPLETE = 13
    WORK_FAIL = 14
    GET_STATUS = 15
    ECHO_REQ = 16
    ECHO_RES = 17
    SUBMIT_JOB_BG = 18
    ERROR = 19
    STATUS_RES = 20
    SUBMIT_JOB_HIGH = 21
    SET_CLIENT_ID = 22
    CAN_DO_TIMEOUT = 23
    ALL_YOURS = 24
    WORK_EXCEPTION = 25
    OPTION_REQ = 26
    OPTION_RES = 27
    WORK_DATA = 28
    WORK_WARNING = 29
    GRAB_JOB_UNIQ = 30
    JOB_ASSIGN_UNIQ = 31
    SUBMIT_JOB_HIGH_BG = 32
    SUBMIT_JOB_LOW = 33
    SUBMIT_JOB_LOW_BG = 34
    SUBMIT_JOB_SCHED = 35
    SUBMIT_JOB_EPOCH = 36
    SUBMIT_REDUCE_JOB = 37
    SUBMIT_REDUCE_JOB_BG = 38
    GRAB_JOB_ALL = 39
    JOB_ASSIGN_ALL = 40
    GET_STATUS_UNIQ = 41
    STATUS_RES_UNIQ = 42


# Number of NUL-separated arguments per command.  The last argument takes the rest of
# the payload verbatim, so binary job data containing NULs survives.
ARG_COUNTS: dict[Command, int] = {
    Command.CAN_DO: 1,
    Command.CANT_DO: 1,
    Command.RESET_ABILITIES: 0,
    Command.PRE_SLEEP: 0,
    Command.NOOP: 0,
    Command.SUBMIT_JOB: 3,
    Command.JOB_CREATED: 1,
    Command.GRAB_JOB: 0,
    Command.NO_JOB: 0,
    Command.JOB_ASSIGN: 3,
    Command.WORK_STATUS: 3,
    Command.WORK_COMPLETE: 2,
    Command.WORK_FAIL: 1,
    Command.GET_STATUS: 1,
    Command.ECHO_REQ: 1,
    Command.ECHO_RES: 1,
    Command.SUBMIT_JOB_BG: 3,
    Command.ERROR: 2,
    Command.STATUS_RES: 5,
    Command.SUBMIT_JOB_HIGH: 3,
    Command.SET_CLIENT_ID: 1,
    Command.CAN_DO_TIMEOUT: 2,
    Command.ALL_YOURS: 0,
    Command.WORK_EXCEPTION: 2,
    Command.OPTION_REQ: 1,
    Command.OPTION_RES: 1,
    Command.WORK_DATA: 2,
    Command.WORK_WARNING: 2,
    Command.GRAB_JOB_UNIQ: 0,
    Command.JOB_ASSIGN_UNIQ: 4,
    Command.SUBMIT_JOB_HIGH_BG: 3,
    Command.SUBMIT_JOB_LOW: 3,
    Command.SUBMIT_JOB_LOW_BG: 3,
    Command.SUBMIT_JOB_SCHED: 8,
    Command.SUBMIT_JOB_EPOCH: 4,
    Command.SUBMIT_REDUCE_JOB: 4,
    Command.SUBMIT_REDUCE_JOB_BG: 4,
    Command.GRAB_JOB_ALL: 0,
    Command.JOB_ASSIGN_ALL: 5,
    Command.GET_STATUS_UNIQ: 1,
    Command.STATUS_RES_UNIQ: 6,
}

Arg = bytes | str | int


# Command by wire code: a dict lookup, not ``Command(code)`` (an enum call is several times
# slower, and every packet of every job goes through here).
_BY_CODE: dict[int, Command] = {c.value: c for c in Command}
_ARGS_BY_CODE: dict[int, int] = {c.value: n for c, n in ARG_COUNTS.items()}


class Packet:
    """One decoded packet.  ``args`` are raw bytes; the last one may contain NULs.

    A plain class with slots rather than a frozen dataclass: its construction is on the path of
    every job (a frozen dataclass sets each field through ``object.__setattr__``).
    """

    __slots__ = ("magic", "command", "args")

    def __init__(self, magic: bytes, command: Command, args: tuple[bytes, ...]) -> None:
        self.magic = magic
        self.command = command
        self.args = args

    def __repr__(self) -> str:
        return f"Packet({self.magic!r}, {self.command.name}, {self.args!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Packet):
            return NotImplemented
        return (self.magic, self.command, self.args) == (other.magic, other.command, other.args)

    __hash__ = None  # type: ignore[assignment]

    def arg(self, index: int) -> bytes:
        """Argument ``index``, or ``b""`` when the peer sent fewer arguments."""
        return self.args[index] if index < len(self.args) else b""

    def text(self, index: int) -> str:
        """Argument ``index`` as text with trailing NULs removed.

        gearmand 1.1.20 sends some handles (WORK_FAIL) with a trailing NUL byte, so
        every textual field (handles, function names) goes through here before it is
        compared with anything.
        """
        return self.arg(index).rstrip(b"\0").decode("utf-8", "replace")


def _to_bytes(value: Arg) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int):
        return str(value).encode("ascii")
    raise TypeError(f"cannot encode {type(value).__name__} as a Gearman argument")


def encode(command: Command | int, *args: Arg, magic: bytes = REQ) -> bytes:
    """Encode one packet.  All arguments but the last must be NUL-free."""
    raw = [a if type(a) is bytes else _to_bytes(a) for a in args]
    for position in range(len(raw) - 1):
        if b"\0" in raw[position]:
            raise ValueError(f"argument {position} of {Command(command).name} contains a NUL byte")
    payload = b"\0".join(raw)
    return HEADER.pack(magic, int(command), len(payload)) + payload


def decode_header(header: bytes | bytearray) -> tuple[bytes, Command, int]:
    """Validate the 12-byte header at the start of ``header`` and return (magic, command,
    payload size)."""
    magic, code, size = HEADER.unpack_from(header)
    if magic != RES and magic != REQ:
        raise ProtocolError(f"bad magic {magic!r} (not a Gearman binary packet)")
    command = _BY_CODE.get(code)
    if command is None:
        raise ProtocolError(f"unknown Gearman command code {code}")
    if size > MAX_PAYLOAD:
        raise ProtocolError(f"payload size {size} of {command.name} exceeds {MAX_PAYLOAD}")
    return magic, command, size


def decode_payload(magic: bytes, command: Command, payload: bytes) -> Packet:
    """Split a payload into the argument count the command is specified to have."""
    count = _ARGS_BY_CODE[command]
    if count == 0:
        # Be lenient: a stray payload on NOOP/NO_JOB carries no meaning, keep it visible.
        args: tuple[bytes, ...] = (payload,) if payload else ()
    elif count == 1:
        args = (payload,)
    else:
        args = tuple(payload.split(b"\0", count - 1))
    return Packet(magic, command, args)


def decode(data: bytes) -> tuple[Packet, int]:
    """Decode one complete packet from the start of ``data``; return it and its length.

    Raises ``ProtocolError`` on garbage and ``ValueError`` if ``data`` is incomplete.
    """
    if len(data) < HEADER_SIZE:
        raise ValueError("incomplete header")
    magic, command, size = decode_header(bytes(data[:HEADER_SIZE]))
    end = HEADER_SIZE + size
    if len(data) < end:
        raise ValueError("incomplete payload")
    return decode_payload(magic, command, bytes(data[HEADER_SIZE:end])), end


def check_name(kind: str, value: str, limit: int) -> bytes:
    """Encode a function name / unique id, rejecting what gearmand would reject."""
    raw = value.encode("utf-8")
    if not raw:
        raise ValueError(f"{kind} must not be empty")
    if b"\0" in raw:
        raise ValueError(f"{kind} must not contain NUL bytes: {value!r}")
    if len(raw) > limit:
        raise ValueError(f"{kind} is {len(raw)} bytes, gearmand allows at most {limit}: {value!r}")
    return raw


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# How long a reader keeps reading without sleeping when it expects an answer within microseconds
# (gearmand's to a grab or a submission, a short job's result). A thread that sleeps in the kernel
# and is woken by the packet pays a wake-up, and on a VM that is expensive: measured on these 2-core
# VMs, one foreground echo job took 340 µs at p50 with blocking reads against 183 µs reading
# without sleeping (libgearman's own client: 234 µs). Bounded, so a long wait costs at most this
# much CPU before it sleeps, and each empty read yields the core (gearmand, or the peer the answer
# depends on, may be waiting for it: without the yield, client and worker spinning together on two
# cores came out at 1.5× libgearman's p50).
SPIN = 0.0002


class Connection:
    """One TCP (optionally TLS) connection to a job server.

    ``send`` is thread-safe (a heartbeat thread may send WORK_STATUS while the owner
    thread sends WORK_COMPLETE); ``recv`` must only be called by one thread at a time.
    Waiting is done with ``poll`` rather than socket timeouts so that a short receive
    timeout never shortens a concurrent ``sendall`` and leaves half a packet on the wire.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        connect_timeout: float = 5.0,
        io_timeout: float = 30.0,
    ) -> None:
        self.host = host
        self.port = port
        self.address = format_address(host, port)
        self._ssl_context = ssl_context
        self._server_hostname = server_hostname or host
        self._connect_timeout = connect_timeout
        self._io_timeout = io_timeout
        self._sock: socket.socket | None = None
        # Plain TCP with kernel send/receive timeouts (connect()): recv may block on the socket.
        self._blocking = False
        self._poller: select.poll | None = None
        self._buf = bytearray()
        self._send_lock = threading.Lock()

    def __repr__(self) -> str:
        state = "open" if self._sock is not None else "closed"
        return f"<Connection {self.address} {state}>"

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> Connection:
        """Open the socket (no-op if already open).  Raises ``OSError`` on failure."""
        if self._sock is not None:
            return self
        sock = socket.create_connection((self.host, self.port), timeout=self._connect_timeout)
        try:
            # Without TCP_NODELAY, Nagle + delayed ACK adds ~40 ms to every small
            # request/response exchange -- the reason the 'gear' package does 43 ms/job.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Keepalive lets an idle worker notice a server host that vanished silently.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if self._ssl_context is not None:
                sock = self._ssl_context.wrap_socket(sock, server_hostname=self._server_hostname)
                # The socket timeout only bounds sendall and the completion of a partially
                # received TLS record; waiting for data is done with poll in recv().
                sock.settimeout(self._io_timeout)
            else:
                # Plain TCP: a blocking socket whose kernel send timeout bounds sendall. A
                # Python socket timeout would poll() before every send and recv (CPython does),
                # doubling the system calls on the path of every job (measured: worker CPU per
                # job 195 µs against libgearman's 60).
                # The kernel's receive timeout likewise bounds a blocking recv: a reader that waits
                # up to the io timeout anyway reads at once instead of polling first (recv()).
                sock.settimeout(None)
                secs = int(self._io_timeout)
                usecs = int((self._io_timeout - secs) * 1e6)
                limit = struct.pack("ll", secs, usecs)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
                self._blocking = True
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        # One poll object per socket, registered once: recv() polls before every read.
        self._poller = select.poll()
        self._poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        self._buf.clear()
        return self

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._poller = None
        self._blocking = False
        self._buf.clear()
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def fileno(self) -> int:
        if self._sock is None:
            raise ConnectionClosed(f"connection to {self.address} is closed")
        return self._sock.fileno()

    def send_raw(self, data: bytes) -> None:
        """Send pre-encoded packets atomically with respect to other senders."""
        with self._send_lock:
            sock = self._sock
            if sock is None:
                raise ConnectionClosed(f"connection to {self.address} is closed")
            try:
                sock.sendall(data)
            except BaseException:
                # A partial write leaves the stream unparseable: the connection is dead.
                self.close()
                raise

    def send(self, command: Command | int, *args: Arg) -> None:
        self.send_raw(encode(command, *args))

    def has_buffered(self) -> bool:
        """True if a recv() could make progress without waiting on the socket."""
        if self._buf:
            return True
        return isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0

    def _complete_packet(self) -> Packet | None:
        buf = self._buf
        have = len(buf)
        if have < HEADER_SIZE:
            if have >= 4 and buf[:4] not in (REQ, RES):
                # Fail fast on garbage (e.g. a text "ERR ..." line) instead of waiting for
                # 12 bytes that may never come.
                raise ProtocolError(f"garbage from {self.address}: {bytes(buf[:32])!r}")
            return None
        magic, command, size = decode_header(buf)
        end = HEADER_SIZE + size
        if have < end:
            return None
        packet = decode_payload(magic, command, bytes(buf[HEADER_SIZE:end]))
        if have == end:
            buf.clear()
        else:
            del buf[:end]
        return packet

    def _poll_socket(self, timeout: float | None) -> bool:
        # poll, not select: select breaks on fd numbers >= 1024 in busy processes.
        poller = self._poller
        if poller is None:
            raise ConnectionClosed(f"connection to {self.address} is closed")
        ms = None if timeout is None else max(0, int(timeout * 1000))
        return bool(poller.poll(ms))

    def recv(self, timeout: float | None = None, spin: float = 0.0) -> Packet:
        """Return the next packet, reading as many times as needed (short reads are fine).

        Raises ``TimeoutError`` if no complete packet arrives within ``timeout`` seconds
        (already received bytes stay buffered for the next call), ``ConnectionClosed``
        on EOF and ``ProtocolError`` on garbage (the connection is closed then, since
        the stream cannot be resynchronised).

        ``spin``: seconds to keep reading without sleeping before the wait (plain TCP only), for
        an answer expected within microseconds (see SPIN).
        """
        deadline: float | None = None
        while True:
            try:
                packet = self._complete_packet()
            except ProtocolError:
                self.close()
                raise
            if packet is not None:
                return packet
            sock = self._sock
            if sock is None:
                raise ConnectionClosed(f"connection to {self.address} is closed")
            if timeout is None:
                remaining = None
            elif deadline is None:  # the first wait: all of it
                deadline = time.monotonic() + timeout
                remaining = timeout
            else:
                remaining = max(0.0, deadline - time.monotonic())
            chunk = self._spin_read(sock, spin) if spin and self._blocking else None
            spin = 0.0
            if chunk is not None:
                pass  # read while spinning
            elif self._blocking and (remaining is None or remaining >= self._io_timeout):
                # Waiting at least the io timeout: one blocking read, bounded by the kernel's
                # receive timeout (an expiry is EAGAIN), instead of a poll and then a read on the
                # path of every job.
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    if remaining is None:
                        continue
                    raise TimeoutError(f"no reply from gearmand {self.address} within {timeout:.1f}s") from None
                except OSError:
                    self.close()
                    raise
            else:
                if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                    # A zero remaining time still polls once, so recv(0) means "whatever is
                    # already readable" rather than "fail immediately".
                    if not self._poll_socket(remaining):
                        raise TimeoutError(f"no reply from gearmand {self.address} within {timeout:.1f}s")
                try:
                    chunk = sock.recv(65536)
                except ssl.SSLWantReadError:
                    continue
                except OSError:
                    self.close()
                    raise
            if not chunk:
                self.close()
                raise ConnectionClosed(f"gearmand {self.address} closed the connection")
            self._buf += chunk

    def _spin_read(self, sock: socket.socket, spin: float) -> bytes | None:
        """Read without sleeping for up to ``spin`` seconds; None if nothing came."""
        end = time.perf_counter() + spin
        while True:
            try:
                return sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() >= end:
                    return None
                os.sched_yield()
            except OSError:
                self.close()
                raise

    def request(self, command: Command | int, *args: Arg, timeout: float | None = None) -> Packet:
        """Send one packet and return the next packet received (simple RPC helper)."""
        self.send(command, *args)
        return self.recv(timeout=self._io_timeout if timeout is None else timeout)
