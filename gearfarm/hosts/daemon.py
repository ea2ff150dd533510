"""The life cycle that the farm's local daemons (gearmand, stunnel, MinIO) share, in one place.

``Daemon`` picks a free loopback port (or keeps the one it was given), starts the process in its
own session with its output in a log file, waits until it answers, starts it again on another
port when the one it picked was lost to another process between probing and binding, and stops
it: SIGTERM, then SIGKILL after a grace period. It is a context manager.

A subclass says what is particular to its daemon: ``command()`` (its argv on a port),
``ready()`` (whether it answers, and is the process we started), ``lost_race()`` (which failed
attempt was a lost port race, worth another port, rather than a fault a retry would only
repeat), and, where it needs them, ``prepare()``, ``environment()`` and ``start_error()``.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from gearfarm.hosts import process
from gearfarm.hosts.net import free_port


class PortTaken(Exception):
    """Raised by ``ready()``: another process answers on the daemon's port."""


@dataclass(frozen=True)
class Failure:
    """One launch attempt that did not end with the daemon ready."""

    port: int
    why: str
    exited: bool = False  # the daemon exited by itself
    taken: bool = False  # ready() saw another process answer on the port

    def __str__(self) -> str:
        return f"port {self.port}: {self.why}"


class Daemon:
    """One local daemon process. Use as a context manager or call start()/stop()."""

    name: ClassVar[str] = "daemon"  # how messages call it
    error: ClassVar[type[Exception]] = RuntimeError
    attempts: ClassVar[int] = 5  # launches at most, counting the retries after lost races
    awaited: ClassVar[str] = "answer"  # a timeout reads "did not <awaited> within Ns"
    poll_interval: ClassVar[float] = 0.05
    stop_grace: ClassVar[float] = 10.0
    # A failed attempt's process is stopped with this grace: see Gearmand for one that ignores SIGTERM.
    abandon_grace: ClassVar[float] = 10.0

    def __init__(self, state_dir: Path, log_path: Path, host: str = "127.0.0.1", port: int | None = None,
                 start_timeout: float = 15.0) -> None:
        self.state_dir = Path(state_dir)
        self.log_path = Path(log_path)
        self.host = host
        self.port = port
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        # A port we picked ourselves may be stolen between free_port() and the daemon's bind; a
        # port the caller asked for must be kept, and so must ours once clients know it.
        self._port_is_ours = port is None

    # -- what a subclass provides ------------------------------------------------------

    def prepare(self) -> None:
        """Checks and set-up before the first launch (find the binary, check its files); raises
        ``error`` naming what is missing and how to get it."""

    def command(self, port: int) -> list[str]:
        """The argv that starts the daemon on ``port``."""
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        """The daemon's environment; None inherits ours."""
        return None

    def ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        """Whether ``proc`` answers on ``port``; raise PortTaken if another process does."""
        raise NotImplementedError

    def lost_race(self, failure: Failure) -> bool:
        """Whether ``failure``, on a port we picked, was a lost port race: then another port is tried."""
        raise NotImplementedError

    def pick_port(self) -> int:
        return free_port(self.host)

    def log_tail(self) -> str:
        return process.log_tail(self.log_path)

    def start_error(self, failures: list[Failure]) -> str:
        """The message of the error start() raises after ``failures``."""
        return (f"{self.name} failed to start on {self.host}: {'; '.join(map(str, failures))}\n"
                f"log {self.log_path}:\n{self.log_tail()}")

    # -- the life cycle ----------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.host}:{self.port} pid={self.pid}>"

    @property
    def address(self) -> tuple[str, int]:
        if self.port is None:
            raise self.error(f"{self.name} has no port yet; call start() first")
        return (self.host, self.port)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Self:
        """Start the daemon and wait until it answers; raises ``error`` if it cannot."""
        if self.running:
            return self
        self.prepare()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        failures: list[Failure] = []
        while True:
            if self._port_is_ours or self.port is None:
                self.port = self.pick_port()
            failure = self._attempt(self.port)
            if failure is None:
                self._port_is_ours = False  # clients know the port now: restarts come back on it
                return self
            failures.append(failure)
            if not (self._port_is_ours and self.lost_race(failure) and len(failures) < self.attempts):
                raise self.error(self.start_error(failures))

    def _attempt(self, port: int) -> Failure | None:
        """One launch on ``port``: None once ready, else what went wrong (the process is gone then)."""
        # Own session (process.spawn): a Ctrl-C on the terminal must not reach the daemon first,
        # and stop() decides how it dies.
        self.proc = proc = process.spawn(self.command(port), self.log_path, env=self.environment())
        try:
            failure = self._wait_ready(proc, port)
        except BaseException:
            self.stop(self.abandon_grace)  # ready() found a fault it names, or we were interrupted
            raise
        if failure is not None:
            self.stop(self.abandon_grace)
        return failure

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int) -> Failure | None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return Failure(port, f"exited with code {proc.returncode}", exited=True)
            try:
                if self.ready(proc, port):
                    return None
            except PortTaken:
                if self._port_is_ours:
                    return Failure(port, "port taken by another process", taken=True)
                # A port the caller chose is waited for: its holder may be an old instance on its way out.
            time.sleep(self.poll_interval)
        return Failure(port, f"did not {self.awaited} within {self.start_timeout}s")

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout`` seconds (default stop_grace)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            process.stop(proc, self.stop_grace if timeout is None else timeout)

    def restart(self) -> Self:
        """Stop and start again on the same port."""
        self.stop()
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
