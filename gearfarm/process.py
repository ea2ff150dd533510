"""Starting and stopping the farm's local daemons (MinIO, workers, the collector) so that
nothing outlives the farm: each runs in its own process group, which stop() kills whole."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def spawn(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
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
    if proc.poll() is None:
        kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def run_logged(argv: Sequence[str], log_path: Path, timeout: float, cwd: Path | None = None,
               env: Mapping[str, str] | None = None) -> tuple[int | None, bool]:
    """Run a catalog command with its output appended to ``log_path``.

    Returns (exit code, timed_out). On timeout the whole process group is killed, because
    suites spawn children (the recovery suite's writers, wine's server) that would otherwise
    outlive the job and hold the worker's files.
    """
    with log_path.open("ab") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        try:
            proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=cwd, env=dict(env) if env is not None else None, start_new_session=True)
        except OSError as e:
            log.write(f"cannot start {argv[0]}: {e}\n".encode())
            return 127, False
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait()
            log.write(f"\n*** killed after the catalog timeout of {timeout:.0f}s ***\n".encode())
            return None, True
        # Children left behind by a suite that exited are killed too.
        kill_group(proc.pid)
        return rc, False
