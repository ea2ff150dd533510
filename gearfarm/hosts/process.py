"""Starting and stopping the farm's local daemons (MinIO, workers, the collector) so that
nothing outlives the farm: each runs in its own process group, which stop() kills whole.
Also running a job's catalog command so that nothing of it outlives the job or its worker
(run_logged, through gearfarm/step/reaper.c) and its output stays within the job's log limit
(the head and the tail of it, and a note of what was dropped between), the per-job temporary
directories that a restarted worker sweeps (job_dir, sweep_work_dirs), and telling whether a
pid is still the very process that was recorded (identity, is_same), so that a stale pid is
never killed."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import re
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from gearfarm.hosts import jobtree

# A daemon's log (a farm's worker, its collector, MinIO) is appended to by every process started
# on it: the embedded farm's state directory keeps the same logs/<name>.log night after night.
# A log past this size when the next process starts is moved to <name>.1, replacing the one
# before: each of the two holds at most this plus what one process wrote (issue #38, the soak).
SPAWN_LOG_ROTATE = 16 * 1024 * 1024


def rotate_log(path: Path, limit: int | None = None) -> bool:
    """Move ``path`` to ``path``.1 if it is larger than ``limit`` (default SPAWN_LOG_ROTATE)."""
    try:
        if path.stat().st_size <= (SPAWN_LOG_ROTATE if limit is None else limit):
            return False
    except FileNotFoundError:
        return False
    os.replace(path, path.with_name(path.name + ".1"))
    return True


def spawn(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, its output appended to ``log_path`` (rotated
    first when it is past SPAWN_LOG_ROTATE)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rotate_log(log_path)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
        )


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``timeout``."""
    stop_all([proc], timeout)


def stop_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    """SIGTERM every process group at once, then SIGKILL what is left after ``timeout``: the
    stop takes as long as the slowest process, not the sum of them."""
    for proc in procs:
        if proc.poll() is None:
            kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    # The groups too: a job's children outlive a worker that exited on SIGTERM.
    for proc in procs:
        kill_group(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def log_tail(path: Path, lines: int = 20, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of a log, read from its last ``max_bytes`` only: a job's log may
    be as large as its limit, and this is asked of every failed job."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class Cancelled(Exception):
    """The job was cancelled while its command ran; the command's whole tree is gone."""


class CancelFlag:
    """A job's cancel flag, which a command's wait sleeps on beside its supervisor's report
    (an eventfd), so a slot waiting for its command wakes when one of them speaks and not
    before. Looking at a threading.Event every 0.25 s was 64 wake-ups of the slot's thread in
    a 16 s suite, a cost that grew with the job (docs/speed.md). Set from the heartbeat's thread;
    closed when the job ends, after which setting it only sets the flag: its descriptor number
    may belong to another file by then."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self._lock = threading.Lock()
        self._fd: int | None = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        # Why the job was stopped, kept from the first set(): "cancelled" (a person), "deadline"
        # (its run's deadline passed), "refused" (the job is no longer this worker's) or "limit" (it
        # reached one of the farm's limits, [farm] min_free: its own failure), and
        # the words the job's log and record give for it.
        self.kind = "cancelled"
        self.reason = ""

    def set(self, kind: str = "cancelled", reason: str = "") -> None:
        with self._lock:
            if not self._set.is_set():
                self.kind, self.reason = kind, reason
        self._set.set()
        with self._lock:
            if self._fd is not None:
                os.eventfd_write(self._fd, 1)

    def is_set(self) -> bool:
        return self._set.is_set()

    def fileno(self) -> int:
        """Readable once the flag is set (and stays so); -1 once closed."""
        with self._lock:
            return -1 if self._fd is None else self._fd

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> CancelFlag:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


# The cancel flag of the job the calling thread runs (set by gearfarm.workers.base for the
# job's duration): every command the job starts is stopped when it is set, without passing it
# through each role's code.
CANCEL: ContextVar[CancelFlag | None] = ContextVar("gearfarm_job_cancel", default=None)


REAPER = Path(__file__).resolve().parents[1] / "step" / "reaper.c"
# As the engine is built: C11, every warning an error.
REAPER_CC = ("cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror")


class ReaperError(RuntimeError):
    """The job supervisor could not be built: no command can run on this host."""


def cache_dir() -> Path:
    """Where the farm keeps what it builds for this host (the job supervisor, the report's compiled
    templates): $GEARFARM_CACHE (as make setup's MinIO), else the user's cache directory's
    gearfarm/ (as probe.py's), which a systemd unit gives with CacheDirectory= and XDG_CACHE_HOME
    (docker/systemd/gearfarm-worker@.service: it has no home)."""
    if os.environ.get("GEARFARM_CACHE"):
        return Path(os.environ["GEARFARM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gearfarm"


@functools.cache
def reaper_command() -> list[str]:
    """The job supervisor's command (gearfarm/step/reaper.c), compiled on first use into the
    cache's bin/ under a name that holds the sha256 of its source and flags: a changed source
    is built again, and two workers that build it at once each rename a whole binary into
    place. Every host that runs jobs has a C compiler (make setup-worker's build-essential);
    ReaperError, saying so, where none is."""
    digest = hashlib.sha256(REAPER.read_bytes() + " ".join(REAPER_CC).encode()).hexdigest()[:16]
    binary = cache_dir() / "bin" / f"gearfarm-reaper-{digest}"
    if not binary.is_file():
        try:
            binary.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ReaperError(f"cannot build the job supervisor into {binary.parent} ({e}): point $GEARFARM_CACHE "
                              "at a directory this user can write") from e
        tmp = binary.with_name(f".{binary.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            built = subprocess.run([*REAPER_CC, "-o", str(tmp), str(REAPER)], capture_output=True, text=True)
        except FileNotFoundError as e:
            raise ReaperError(f"cannot build the job supervisor {REAPER}: no C compiler ({REAPER_CC[0]}) on this "
                              "host; install build-essential (make setup-worker does)") from e
        if built.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise ReaperError(f"cannot build the job supervisor {REAPER} ({' '.join(REAPER_CC)}): "
                              f"{(built.stderr or built.stdout).strip()[-2000:]}")
        os.replace(tmp, binary)
    # The worker, root on a lab host, runs it for every command: nobody but this user (or root)
    # may replace it.
    for path in (binary.parent, binary):
        st = path.stat()
        if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
            raise ReaperError(f"the job supervisor's {'directory' if path.is_dir() else 'binary'} {path} is owned by "
                              f"uid {st.st_uid} with mode {st.st_mode & 0o7777:o}: another user could replace what "
                              "this worker runs for every command. Fix: point $GEARFARM_CACHE at a directory of "
                              "this user's own that only it can write")
    return [str(binary)]


# The reaper enforces the timeout itself; the worker waits this much longer before deciding
# the reaper is wedged (it needs at most its startup, TERM_GRACE and KILL_PATIENCE past the timeout).
REAPER_GRACE = 60.0

MiB = 1024 * 1024
# The most of a command's output a job's log keeps by default (a worker passes its [farm] log_limit,
# through its sandbox: gearfarm.step.runner). Past it the log keeps the output's head and its
# tail, with a note between of how many bytes were dropped there.
LOG_LIMIT = 64 * MiB
# The part of the limit kept from the end of the output: a failure is usually at the end, and the
# tail is held in memory until the command ends, so it bounds what a job costs its worker.
TAIL_SHARE = 4
# The tail kept of output appended to a log that is full already (a benchmark's later runs): the
# log then grows by this and a note per command, not by a quarter of its limit.
MIN_TAIL = 64 * 1024
# The output pipe's size (the kernel's default is 64 KiB): fewer, larger reads for the pump.
# 1 MiB is also the most an unprivileged process may ask for (/proc/sys/fs/pipe-max-size).
PIPE_SIZE = MiB
# After the reaper has reported, how long the pump still reads: to the pipe's end, unless a
# process the reaper could not kill holds it open.
PUMP_DRAIN = 5.0


def _size_text(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n} bytes"


class CappedLog:
    """Output written into an open log file with at most ``limit`` bytes of the log kept: what
    fits first (the output's head) goes straight to the file, the last ``limit // TAIL_SHARE``
    bytes are kept in a ring buffer of that size, allocated once, and written, after a note of
    how many bytes were dropped before them, by close(). Output that fits is written whole and
    unchanged. The log's size when this starts (its header, earlier commands) counts: appended to
    a full log, a command's output keeps only its last MIN_TAIL bytes.

    One buffer, allocated once, not a queue of the chunks read: what a flood costs the worker is
    the tail and nothing that depends on how the output happened to arrive."""

    def __init__(self, out: BinaryIO, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"a log limit must be a number of bytes above 0, not {limit}")
        used = out.tell()
        self.out, self.limit = out, limit
        self.tail = min(limit // TAIL_SHARE, max(limit - used, MIN_TAIL))
        self.head = max(0, limit - used - self.tail)
        self.total = 0  # bytes of output seen
        self.written = 0  # of them, the head written to the file
        self.ring: bytearray | None = None  # made when the head is full
        self.pos = 0  # where the ring's next byte goes
        self.kept = 0  # bytes in the ring

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        self.total += len(view)
        if self.written < self.head:
            n = min(len(view), self.head - self.written)
            self.out.write(view[:n])
            self.written += n
            view = view[n:]
        if not len(view):
            return
        if self.ring is None:
            self.ring = bytearray(self.tail)
        if len(view) >= self.tail:
            self.ring[:] = view[len(view) - self.tail:]
            self.pos, self.kept = 0, self.tail
            return
        first = min(len(view), self.tail - self.pos)
        self.ring[self.pos:self.pos + first] = view[:first]
        rest = len(view) - first
        self.ring[:rest] = view[first:]
        self.pos = (self.pos + len(view)) % self.tail
        self.kept = min(self.tail, self.kept + len(view))

    def close(self) -> int:
        """Write the note (if anything was dropped) and the tail; the bytes dropped."""
        dropped = self.total - self.written - self.kept
        if dropped:
            self.out.write(f"\n*** {dropped} bytes of output dropped here (log capped at {_size_text(self.limit)}: "
                           "[farm] log_limit) ***\n".encode())
        if self.ring is not None:
            ring = memoryview(self.ring)
            if self.kept < self.tail:
                self.out.write(ring[:self.kept])
            else:
                self.out.write(ring[self.pos:])
                self.out.write(ring[:self.pos])
        self.ring = None
        self.pos = self.kept = 0
        self.out.flush()
        return dropped


def append_capped(src: Path, dst: Path, limit: int | None = None, header: str = "") -> int:
    """Append ``header`` and the file ``src`` to the log ``dst``, streaming, within the log's
    limit (default LOG_LIMIT) as run_logged keeps it; the bytes dropped."""
    with dst.open("ab") as out, src.open("rb") as f:
        out.write(header.encode())
        capped = CappedLog(out, limit or LOG_LIMIT)
        while chunk := f.read(MiB):
            capped.write(chunk)
        return capped.close()


class _Pump(threading.Thread):
    """Reads a command's output pipe into its CappedLog until the pipe's end, or until told the
    command is over and PUMP_DRAIN has passed. A write error (disk full) is kept for the caller,
    and reading goes on, so the command is never left blocked on a full pipe."""

    def __init__(self, fd: int, sink: CappedLog) -> None:
        super().__init__(name="gearfarm-log-pump", daemon=True)
        self.fd, self.sink = fd, sink
        self.over = threading.Event()
        self.error: OSError | None = None

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        # Read into one buffer: no allocation per read (see CappedLog).
        buf = bytearray(PIPE_SIZE)
        view = memoryview(buf)
        until: float | None = None
        while True:
            if until is None and self.over.is_set():
                until = time.monotonic() + PUMP_DRAIN
            wait = 0.25 if until is None else until - time.monotonic()
            if wait <= 0:
                return  # a process the reaper could not kill still holds the pipe: stop reading it
            if not poller.poll(wait * 1000):
                continue
            n = os.readv(self.fd, [buf])
            if not n:
                return
            if self.error is None:
                try:
                    self.sink.write(view[:n])
                except OSError as e:
                    self.error = e


def reaper_input(argv: Sequence[str], env: Mapping[str, str], stage: tuple[str, Sequence[str]] | None = None,
                 cgroup: Sequence[str] = ()) -> bytes:
    """What the reaper reads on its stdin: the command, its whole environment, its stage, its
    cgroup, as NUL-terminated strings (none of them can hold a NUL): the argv's count and items,
    the environment's count and KEY=VALUE items, then "0", or "1", the stage's top, the count of
    its directories and each of them; then the count of the cgroup.procs files the command joins
    and each of them."""
    items = [str(len(argv)), *argv, str(len(env)), *(f"{k}={v}" for k, v in env.items())]
    items += ["0"] if stage is None else ["1", stage[0], str(len(stage[1])), *stage[1]]
    items += [str(len(cgroup)), *cgroup]
    return b"".join(os.fsencode(i) + b"\0" for i in items)


def run_logged(argv: Sequence[str], log_path: Path, timeout: float, cwd: Path | None = None,
               env: Mapping[str, str] | None = None, shown: Sequence[str] | None = None,
               limit: int | None = None, stage: tuple[str, Sequence[str]] | None = None,
               cgroup: Sequence[str] = ()) -> tuple[int | None, bool]:
    """Run a catalog command with its output appended to ``log_path``, at most ``limit`` bytes
    of the log (default LOG_LIMIT, the worker's [farm] log_limit) kept: see CappedLog.
    ``stage``: (where, directories) the command's supervisor binds in a mount namespace of the
    command's own before it starts it (reaper.c's stage(); the sandbox's, for a root worker's job uid).
    ``cgroup``: the cgroup.procs files the command joins before it stages or execs anything, so
    it and all it starts are in its job's cgroups (gearfarm.hosts.cgroup) from the first instruction.

    Returns (exit code, timed_out); the exit code is Popen's returncode (negative: killed by
    that signal). Whatever happens -- the command exits, the timeout passes, or the worker
    is killed, even by kill -9 -- every process the command started is killed, grandchildren
    that left the process group or daemonised included, because suites spawn children (the
    recovery suite's writers, wine's server) that would otherwise outlive the job and hold
    the worker's files. The command runs under gearfarm/step/reaper.c, see there how.

    ``shown`` is what the log says was run, when that is not all of ``argv`` (the catalog's
    command without the sandbox's wrapping).

    When the calling thread's job is cancelled (CANCEL), the command's tree is stopped the same
    way and Cancelled is raised.

    The output reaches the log through a pipe that a thread of the caller pumps (the reaper's
    stdout and stderr, which the command inherits), not by giving the command the log file: the
    cap is kept as the output arrives, so neither the disk nor the worker's memory ever holds
    more than the limit, and the job never holds the log file itself. The cap is here rather
    than in the reaper, which stays a small single-threaded loop around signals.

    Any thread may call this. The reaper hears of its parent's death through
    PR_SET_PDEATHSIG, which the kernel also fires when only the calling thread exits; the
    reaper then checks getppid() and goes on while the worker process lives.
    """
    with log_path.open("ab") as log:
        log.write(("$ " + " ".join(shown if shown is not None else argv) + "\n").encode())
        log.flush()
        # argv and env go through a pipe, not the reaper's own argv and environment: the command
        # must get exactly the environment it was given, and an argv or environment of any size.
        job = reaper_input(argv, dict(env) if env is not None else dict(os.environ), stage, cgroup)
        capped = CappedLog(log, limit or LOG_LIMIT)
        status_r, status_w = os.pipe()
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        with suppress(OSError):
            fcntl.fcntl(out_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        pump = _Pump(out_r, capped)
        began = time.monotonic()
        try:
            try:
                reaper = subprocess.Popen(
                    [*reaper_command(), str(os.getpid()), str(status_w), repr(float(timeout))],
                    stdin=subprocess.PIPE, stdout=out_w, stderr=subprocess.STDOUT, cwd=cwd,
                    start_new_session=True, pass_fds=(status_w,))
            except OSError as e:
                log.write(f"cannot start {(shown or argv)[0]}: {e}\n".encode())
                return 127, False
            finally:
                # Only the reaper and its command hold the pipe now: its end means they are gone.
                os.close(status_w)
                os.close(out_w)
            pump.start()
            try:
                report, wedged = _supervise(reaper, job, timeout, status_r, CANCEL.get(), TIDY.get())
            finally:
                pump.over.set()
                pump.join()
            reason, _, detail = report.decode(errors="replace").partition(" ")
        finally:
            os.close(status_r)
            os.close(out_r)
        capped.close()
        if pump.error is not None:
            raise OSError(pump.error.errno, f"cannot write the job's log {log_path}: {pump.error.strerror}")
        cancel = CANCEL.get()
        if cancel is not None and cancel.is_set():
            why = cancel.reason or "cancelled"
            log.write(f"\n*** {why}: the command and everything it started were stopped ***\n".encode())
            raise Cancelled(f"{argv[0]} stopped: {cancel.reason or 'the job was cancelled'}")
        if reason == "error":
            log.write(f"cannot start {argv[0]}: {detail}\n".encode())
            return 127, False
        if reason == "timeout" or wedged:
            log.write(f"\n*** killed after the catalog timeout of {timeout:.0f}s ***\n".encode())
            return None, True
        if reason in ("exit", "terminated") and detail.isdigit():
            code = os.waitstatus_to_exitcode(int(detail))
            # How the command ended, as its last line: a quiet command (make -s) otherwise
            # leaves a log that stops at its own "$ " line, saying nothing of how it went.
            log.write(f"--- {_ended(code)} after {time.monotonic() - began:.1f} s ---\n".encode())
            return code, False
        log.write(f"\n*** the job's supervisor gearfarm-reaper ended ({reaper.returncode}) with "
                  f"{reason or 'no'} result {detail} ***\n".encode())
        return None, False


def _ended(code: int) -> str:
    """An exit code as a log says it: "exit status 0", "killed by SIGABRT"."""
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _supervise(reaper: subprocess.Popen[bytes], job: bytes, timeout: float, status_r: int,
               cancel: CancelFlag | None = None, tidying: bool = False) -> tuple[bytes, bool]:
    """Hand the job to the reaper, wait for its report; (report, True if it had to be stopped
    as wedged). Waits on the report pipe and the job's cancel flag, not with
    Popen.wait(timeout), which polls with sleeps of up to 50 ms and would add them to every job.
    ``tidying``: the job dirs left for later are removed once the command is on its way."""
    assert reaper.stdin is not None
    wedged = False
    try:
        try:
            reaper.stdin.write(job)
            reaper.stdin.close()
        except BrokenPipeError:
            pass  # it died at once; its missing report says so
        if tidying:
            tidy()
        deadline = time.monotonic() + timeout + REAPER_GRACE
        poller = select.poll()
        poller.register(status_r, select.POLLIN)
        flag = cancel.fileno() if cancel is not None else -1
        if flag >= 0:
            poller.register(flag, select.POLLIN)
        chunks = []
        while True:
            if flag >= 0 and cancel is not None and cancel.is_set():
                poller.unregister(flag)  # it stays readable: once is enough
                flag = -1
                reaper.terminate()  # the reaper kills the command's tree, reports and exits
            left = deadline - time.monotonic()
            if left <= 0:
                wedged = True
                reaper.terminate()  # SIGTERM: the reaper kills the job's tree, then exits
                try:
                    reaper.wait(REAPER_GRACE)
                except subprocess.TimeoutExpired:
                    reaper.kill()
                break
            if not any(fd == status_r for fd, _ in poller.poll(min(left, 3600.0) * 1000)):
                continue  # the time ran out, or the job was cancelled: looked at above
            chunk = os.read(status_r, 4096)
            if not chunk:
                break
            chunks.append(chunk)
        reaper.wait()
        return b"".join(chunks), wedged
    except BaseException:
        # Interrupted (KeyboardInterrupt in an interactive worker): the job must not outlive us.
        reaper.terminate()
        reaper.wait()
        raise


# -- knowing a process again ----------------------------------------------------------------

class ProcStat(NamedTuple):
    state: str
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: with the pid, names one process for the boot's life


def proc_stat(pid: int) -> ProcStat | None:
    """Fields of /proc/<pid>/stat; None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat[stat.rindex(b")") + 2:].split()
    return ProcStat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))


def start_time(pid: int) -> int | None:
    """The start time (field 22 of /proc/<pid>/stat) of a live process; None if it is gone or
    a zombie (dead, waiting to be reaped)."""
    st = proc_stat(pid)
    return st.start if st is not None and st.state not in ("Z", "X") else None


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip().replace("-", "")


def cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return [os.fsdecode(a) for a in raw.split(b"\0")[:-1]]


def identity(pid: int, argv: Sequence[str] | None = None, wait: float = 5.0) -> dict[str, Any] | None:
    """What proves later that ``pid`` is still this process (JSON-ready); None if it is gone.
    The start time tells a recycled pid apart, the boot id a pid of an earlier boot, the
    command line guards against both failing at once.

    ``argv``: what the process was just started with (Popen's), waited for up to ``wait``
    seconds. Popen returns before the kernel shows the new command line: /proc/<pid>/cmdline
    read at once was still the parent's or empty in 151 of 300 starts, and a process recorded
    so is never "provably" the one started (is_same), so a stop from the state file left it
    running (issue #76, case 11: a restarted slot outlived `gearfarm farm stop`)."""
    args = cmdline(pid)
    if argv is not None:
        until = time.monotonic() + wait
        while args is not None and args != list(argv) and time.monotonic() < until:
            time.sleep(0.001)
            args = cmdline(pid)
    st = proc_stat(pid)
    if st is None or st.state in ("Z", "X") or args is None:
        return None
    return {"pid": pid, "start": st.start, "boot": boot_id(), "pgid": st.pgid, "cmdline": args}


def is_same(record: Mapping[str, Any]) -> bool:
    """True if the process ``record`` (from identity()) describes is alive and is still it."""
    try:
        pid = int(record["pid"])
        if record["boot"] != boot_id() or start_time(pid) != record["start"]:
            return False
        now = identity(pid)
    except (KeyError, TypeError, ValueError):
        return False  # a record we did not write: nothing proves the process is ours
    return now is not None and now["start"] == record["start"] and now["cmdline"] == record["cmdline"]


# -- per-job temporary directories ----------------------------------------------------------

_OWNER = re.compile(r"(\d+)-(\d+)-([0-9a-f]+)")
_owner_cache: tuple[int, str] | None = None


def _owner() -> str:
    """This process's owner directory name: pid, start time and boot, so that no other
    process -- a later one with the recycled pid, or one of another boot -- is taken for it
    (its job dirs, its jobs' cgroups: gearfarm.hosts.cgroup)."""
    global _owner_cache
    pid = os.getpid()
    if _owner_cache is None or _owner_cache[0] != pid:  # recomputed in a forked child
        _owner_cache = (pid, f"{pid}-{start_time(pid)}-{boot_id()[:12]}")
    return _owner_cache[1]


owner_name = _owner


def owner_gone(name: str) -> bool:
    """Whether ``name`` is an owner name (_owner's) of a process that is gone: a dead pid, the
    pid now another process, or an earlier boot. Other names are not owners: False."""
    m = _OWNER.fullmatch(name)
    if m is None:
        return False
    return m.group(3) != boot_id()[:12] or start_time(int(m.group(1))) != int(m.group(2))


@contextmanager
def job_dir(root: Path, prefix: str, later: bool = False) -> Iterator[Path]:
    """A fresh directory for one job under ``root/<owner>/``, removed on exit, or with
    ``later`` when the next command starts (TIDY) or the worker is idle (tidy). What a worker
    killed in the middle of a job, or before it removed one, leaves behind, sweep_work_dirs()
    removes."""
    owner = owner_dir(root)
    owner.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=owner))
    try:
        yield path
    finally:
        if later:
            remove_later(path)
        else:
            remove(path)


def owner_dir(root: Path) -> Path:
    """This process's own directory under ``root``, where its job dirs are (job_dir)."""
    return root / _owner()


def remove_later(path: Path) -> None:
    """Remove the job dir ``path`` when the next command starts or the worker is idle (tidy)."""
    with _LATER_LOCK:
        _LATER.append(path)


def pending() -> list[Path]:
    """The job dirs left for later (remove_later) and not removed yet."""
    with _LATER_LOCK:
        return _LATER[:]


def remove(path: Path) -> None:
    """Remove a job dir now, whatever the job left in it."""
    _rmtree(path)


# Job dirs to remove later (job_dir's ``later``): a test job's dir took 2 ms to remove, on the
# way from one job's end to the next one's start, where the next command's first seconds, or an
# idle worker, have the time (as Jenkins' workspace cleanup deletes asynchronously).
_LATER: list[Path] = []
_LATER_LOCK = threading.Lock()
# Whether a command started in this context removes them meanwhile: not a benchmark's, which
# measures the host.
TIDY: ContextVar[bool] = ContextVar("tidy", default=True)


def untidy() -> bool:
    """Whether job dirs are left for later."""
    with _LATER_LOCK:
        return bool(_LATER)


def tidy() -> None:
    """Remove now the job dirs left for later."""
    with _LATER_LOCK:
        paths = _LATER[:]
        _LATER.clear()
    for path in paths:
        _rmtree(path)


def jobs_root(job: Path) -> Path:
    """Where the job dir ``job`` (job_dir's, or one on its owner's job disk) and this host's other
    jobs' dirs are: ``root``."""
    for up in job.parents:
        if _OWNER.fullmatch(up.name):
            return up.parent
    return job.parent.parent


def release_work_dir(root: Path) -> None:
    """On a clean exit: remove this process's owner directory (empty by then: every job_dir
    removes itself, or is removed here), so stopped workers leave nothing for the next sweep."""
    tidy()
    with suppress(OSError):
        (root / _owner()).rmdir()


def sweep_work_dirs(root: Path) -> list[Path]:
    """Remove the owner directories under ``root`` of processes that are gone (a dead pid,
    the pid now another process, or an earlier boot); returns what was removed. Directories
    of live owners, and names that are not owner directories, are left alone.
    Never raises: what cannot be removed is quarantined (_rmtree), and a start goes on.
    What earlier removals quarantined is tried once more (a mount gone since, say)."""
    removed: list[Path] = []
    try:
        if not root.is_dir():
            return removed
        for d in sorted(root.iterdir()):
            if not owner_gone(d.name) or d.is_symlink() or not d.is_dir():
                continue
            _rmtree(d)
            if not os.path.lexists(d):
                removed.append(d)
        kept = quarantine_dir(root)
        for q in sorted(kept.iterdir()) if kept.is_dir() else []:
            jobtree.remove(q, None, "quarantined earlier")
            if not os.path.lexists(q):
                removed.append(q)
    except Exception:
        logging.getLogger(__name__).exception("sweeping %s", root)
    return removed


def quarantine_dir(root: Path) -> Path:
    """Where what a job left and no removal could take is moved (jobtree.remove), beside the
    jobs root ``root`` and on its filesystem: out of every slot's way, kept for a look."""
    return root.parent / "quarantine"


def _job_named(path: Path) -> str:
    """The job a job dir was made for, from the first line of the worker's log in it
    ("gearfarm test-x of engine for linux-x86_64 at <rev> on <worker>"); else the dir's owner."""
    with suppress(OSError, StopIteration):
        log = next(p for p in (path / f"{role}.log" for role in ("build", "test", "perf")) if p.is_file())
        head, _ = jobtree.read_capped(log, 1024)
        first = head.decode("utf-8", "replace").split("\n", 1)[0].strip()
        if first:
            return first
    owner = path.parent.name if _OWNER.fullmatch(path.parent.name) else path.name
    return f"a job of worker process {owner}"


def _rmtree(path: Path) -> None:
    """Remove a job dir (or an owner dir of them) whatever its job left there; what cannot go is
    quarantined and logged, naming the job. Never raises: a job's leftovers stop no slot."""
    try:
        if _OWNER.fullmatch(path.name):
            for job in sorted(path.iterdir()) if path.is_dir() and not path.is_symlink() else []:
                jobtree.remove(job, quarantine_dir(path.parent), _job_named(job))
            what = f"worker process {path.name}'s job dirs"
            root = path.parent
        else:
            what, root = _job_named(path), jobs_root(path)
        jobtree.remove(path, quarantine_dir(root), what)
    except Exception:  # nothing a job left may stop the slot or the worker's start
        logging.getLogger(__name__).exception("cannot remove %s", path)
