"""Run a local gearmand job server for the embedded farm and the tests.

``Gearmand`` owns one gearmand process: it picks a free loopback port, keeps the log,
pid file and (optional) persistent sqlite queue inside ``state_dir``, and can stop,
kill -9 and restart the server on the *same* port so that clients and workers can
demonstrate reconnecting.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType

from gearfarm.gearman import admin
from gearfarm.gearman.errors import GearmanError
from gearfarm.hosts import process
from gearfarm.hosts.net import free_port, wait_port

_FALLBACK_BINARY = "/usr/sbin/gearmand"
_PORT_TAKEN = "port taken by another process"


class GearmandError(RuntimeError):
    """gearmand is missing or failed to start."""


def find_gearmand() -> str:
    """Path of the gearmand binary (Debian puts it in /usr/sbin, often not on PATH)."""
    found = shutil.which("gearmand")
    if found:
        return found
    if os.access(_FALLBACK_BINARY, os.X_OK):
        return _FALLBACK_BINARY
    raise GearmandError(
        "gearmand not found on PATH or at /usr/sbin/gearmand; install it with "
        "'apt-get install gearman-job-server'"
    )


class Gearmand:
    """A gearmand child process.  Use as a context manager or call start()/stop()."""

    def __init__(
        self,
        state_dir: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        queue_db: Path | None = None,
        job_retries: int | None = None,
        start_timeout: float = 15.0,
        extra_args: list[str] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.host = host
        self.port = port
        self.queue_db = Path(queue_db) if queue_db is not None else None
        self.job_retries = job_retries
        self.start_timeout = start_timeout
        self.extra_args = list(extra_args or [])
        self.log_file = self.state_dir / "gearmand.log"
        self.stderr_file = self.state_dir / "gearmand.stderr"
        self.pid_file = self.state_dir / "gearmand.pid"
        self._proc: subprocess.Popen[bytes] | None = None
        # A port we picked ourselves may be stolen between free_port() and bind();
        # a port the caller asked for (or a restart) must be kept.
        self._port_is_ours = port is None

    def __repr__(self) -> str:
        return f"<Gearmand {self.host}:{self.port} pid={self.pid}>"

    @property
    def address(self) -> tuple[str, int]:
        if self.port is None:
            raise GearmandError("gearmand has no port yet; call start() first")
        return (self.host, self.port)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> Gearmand:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _command(self, binary: str, port: int) -> list[str]:
        cmd = [
            binary,
            "-L",
            self.host,
            "-p",
            str(port),
            "--log-file",
            str(self.log_file),
            "--pid-file",
            str(self.pid_file),
            "--verbose",
            "WARNING",
        ]
        if self.queue_db is not None:
            # Every background job is written to sqlite on submit, so the queue
            # survives kill -9 (measured on 1.1.20).
            cmd += ["-q", "libsqlite3", f"--libsqlite3-db={self.queue_db}"]
        if self.job_retries is not None:
            cmd += ["--job-retries", str(self.job_retries)]
        return cmd + self.extra_args

    def log_tail(self, lines: int = 30) -> str:
        """Last lines of gearmand's log and stderr, for error messages."""
        parts = []
        for path in (self.log_file, self.stderr_file):
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            if text:
                parts.append(f"--- {path} ---\n" + "\n".join(text))
        return "\n".join(parts) or "(no gearmand output)"

    def start(self) -> Gearmand:
        """Start gearmand and wait until it answers on its port."""
        if self.running:
            return self
        binary = find_gearmand()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.queue_db is not None:
            self.queue_db.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.start_timeout
        failures: list[str] = []
        while True:
            if self.port is None or (self._port_is_ours and failures):
                self.port = free_port(self.host)
            outcome = self._try_start(binary, self.port, deadline)
            if outcome == "ok":
                # From now on the port is part of the address clients know: restarts
                # must come back on it.
                self._port_is_ours = False
                return self
            failures.append(f"port {self.port}: {outcome}")
            # Only a lost bind race on a port we picked is worth another try; an exit
            # (bad option, unusable queue db) or a timeout would just repeat.
            retry = outcome == _PORT_TAKEN and self._port_is_ours and len(failures) < 5
            if not retry or time.monotonic() >= deadline:
                raise GearmandError(
                    f"gearmand failed to start on {self.host}: {'; '.join(failures[-3:])}\n"
                    f"command: {' '.join(self._command(binary, self.port))}\n{self.log_tail()}"
                )

    def _try_start(self, binary: str, port: int, deadline: float) -> str:
        """One launch attempt: "ok", _PORT_TAKEN, or a description of the failure."""
        # Own session (process.spawn): a Ctrl-C on the test run must not hit gearmand first,
        # and stop() decides how it dies.
        self._proc = proc = process.spawn(self._command(binary, port), self.stderr_file)
        outcome = f"did not answer within {self.start_timeout}s"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                outcome = f"exited with code {proc.returncode}"
                break
            if not wait_port(self.host, port, timeout=0.2):
                continue
            # Something listens -- make sure it is *our* process.  On a bind conflict
            # gearmand 1.1.20 does not exit, it keeps retrying (measured), so another
            # process answering here means we lost the race for a port we picked.
            try:
                pid: int | None = admin.getpid(self.host, port, timeout=1.0)
            except (GearmanError, OSError):
                pid = None
            if pid == proc.pid:
                return "ok"
            if self._port_is_ours:
                outcome = _PORT_TAKEN
                break
            time.sleep(0.1)  # fixed port still held by someone (an old instance?): wait
        process.kill_group(proc.pid)
        proc.wait()
        self._proc = None
        return outcome

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout`` seconds."""
        proc, self._proc = self._proc, None
        if proc is not None:
            process.stop(proc, timeout)

    def kill9(self) -> None:
        """Crash the server (SIGKILL) -- for testing persistence and reconnects."""
        proc, self._proc = self._proc, None
        if proc is not None:
            process.kill_group(proc.pid)
            proc.wait()

    def restart(self) -> Gearmand:
        """Stop and start again on the same port (the queue survives if persistent)."""
        self.stop()
        return self.start()
