"""Run a local gearmand job server for the embedded farm and the tests.

``Gearmand`` owns one gearmand process: it picks a free loopback port, keeps the log,
pid file and (optional) persistent sqlite queue inside ``state_dir``, and can stop,
kill -9 and restart the server on the *same* port so that clients and workers can
demonstrate reconnecting.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

from gearfarm.gearman import admin
from gearfarm.gearman.errors import GearmanError
from gearfarm.hosts import process
from gearfarm.hosts.daemon import Daemon, Failure, PortTaken
from gearfarm.hosts.net import free_port, wait_port

_FALLBACK_BINARY = "/usr/sbin/gearmand"
# Free bytes beside a failed persistent queue before heal() restarts gearmand on it.
QUEUE_ROOM = 4 * 1024 * 1024


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


def write_ahead(queue_db: Path) -> None:
    """Put gearmand's sqlite queue in write-ahead-log mode (made if absent; kept in the file,
    so gearmand's own connection finds it), before gearmand opens it. gearmand writes each
    background job to its queue on submit and deletes it on completion, in its one thread
    that serves everyone: in sqlite's default rollback journal each of those transactions
    held every client and worker for ~0.8 ms (1,300 background submits a second, one by one;
    3,600-4,000 in WAL, bench/gearman_throughput.py --persistent). As durable: a committed
    job is in the log, which gearmand's connection syncs on every commit as it synced the
    journal (sqlite's default synchronous=FULL), and a kill -9 or a power cut keeps it."""
    try:
        with contextlib.closing(sqlite3.connect(queue_db)) as db:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    except sqlite3.Error as e:  # locked by a gearmand still running on it, unreadable, not a database
        raise GearmandError(f"cannot open gearmand's queue {queue_db} to put it in WAL mode ({e}): stop any "
                            "gearmand using it, or move the file away if it is not a gearmand queue") from None
    if mode != "wal":
        raise GearmandError(f"cannot put gearmand's queue {queue_db} in WAL mode (sqlite says {mode!r}): is it "
                            "on a file system without shared memory (a network mount)? Give it a local path")


class Gearmand(Daemon):
    """A gearmand child process.  Use as a context manager or call start()/stop(); restart()
    comes back on the same port, with the queue if it is persistent (``queue_db``)."""

    name = "gearmand"
    error = GearmandError
    stop_grace = 5.0
    # SIGKILL at once: a gearmand that lost its port keeps retrying the bind and ignores SIGTERM
    # meanwhile (measured on 1.1.20), so a grace period would only add to every lost race.
    abandon_grace = 0.0

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
        state_dir = Path(state_dir)
        # gearmand writes its own log (--log-file); the process's stdout and stderr go to a second file.
        super().__init__(state_dir, state_dir / "gearmand.stderr", host, port, start_timeout)
        self.queue_db = Path(queue_db) if queue_db is not None else None
        self.job_retries = job_retries
        self.extra_args = list(extra_args or [])
        self.log_file = self.state_dir / "gearmand.log"
        self.stderr_file = self.log_path
        self.pid_file = self.state_dir / "gearmand.pid"
        self._binary = ""
        self._log_seen = 0  # how far heal() has read gearmand's log
        self._queue_broken = False

    def prepare(self) -> None:
        self._binary = find_gearmand()
        if self.queue_db is not None:
            self.queue_db.parent.mkdir(parents=True, exist_ok=True)
            write_ahead(self.queue_db)

    def heal(self) -> bool:
        """Restart gearmand (same port, its persistent queue kept) if its sqlite queue failed
        and there is room again; True if it did. gearmand 1.1.20's sqlite queue does not come
        back by itself after a write failed (a full disk): it loses track of its transaction,
        and every background submission after, with the space back, fails with QUEUE_ERROR
        ("COMMIT called on FLUSH error: cannot commit - no transaction is active") until it is
        restarted (measured: a queue on a 16 MiB tmpfs, filled, then freed). The jobs it had
        committed are in the queue file, and a restart has them again."""
        try:
            with self.log_file.open("rb") as f:
                f.seek(self._log_seen)
                new = f.read(4 * 1024 * 1024)
                self._log_seen = f.tell()
        except OSError:
            new = b""
        if b"plugins/queue/sqlite" in new and b"QUEUE_ERROR" in new:
            self._queue_broken = True
        if not self._queue_broken or self.queue_db is None or shutil.disk_usage(self.queue_db.parent).free < QUEUE_ROOM:
            return False
        self.restart()
        self._queue_broken = False
        with contextlib.suppress(OSError):
            self._log_seen = self.log_file.stat().st_size
        return True

    def pick_port(self) -> int:
        # This module's free_port, looked up at call time: tests replace it to stage a lost race.
        return free_port(self.host)

    def command(self, port: int) -> list[str]:
        cmd = [
            self._binary,
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
            # One idle worker woken (NOOP) per job, the next in turn, not all of the function's:
            # the rest asked for it in vain (a GRAB and NO_JOB each), a herd that grew with the
            # slots (docs/speed.md). A worker that finds its woken job taken sleeps again, and
            # every worker asks again at least every poll_interval.
            "--worker-wakeup",
            "1",
        ]
        if self.queue_db is not None:
            # Every background job is written to sqlite on submit, so the queue
            # survives kill -9 (measured on 1.1.20).
            cmd += ["-q", "libsqlite3", f"--libsqlite3-db={self.queue_db}"]
        if self.job_retries is not None:
            cmd += ["--job-retries", str(self.job_retries)]
        return cmd + self.extra_args

    def ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        if not wait_port(self.host, port, timeout=0.2):
            return False
        # Something listens -- make sure it is *our* process: on a bind conflict gearmand does
        # not exit, it keeps retrying (measured on 1.1.20), so only the pid it reports tells.
        try:
            pid: int | None = admin.getpid(self.host, port, timeout=1.0)
        except (GearmanError, OSError):
            pid = None
        if pid != proc.pid:
            raise PortTaken
        return True

    def lost_race(self, failure: Failure) -> bool:
        # gearmand never exits over a taken port (see ready()): an exit is a bad option or an
        # unusable queue db, and a timeout would just repeat; only another answering process is a race.
        return failure.taken

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

    def start_error(self, failures: list[Failure]) -> str:
        return (f"gearmand failed to start on {self.host}: {'; '.join(map(str, failures[-3:]))}\n"
                f"command: {' '.join(self.command(failures[-1].port))}\n{self.log_tail()}")

    def kill9(self) -> None:
        """Crash the server (SIGKILL) -- for testing persistence and reconnects."""
        proc, self.proc = self.proc, None
        if proc is not None:
            process.kill_group(proc.pid)
            proc.wait()
