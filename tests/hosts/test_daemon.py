"""Tests of gearfarm.hosts.daemon, the life cycle gearmand, stunnel and MinIO share, with a real
tiny daemon on loopback (no mocks): it becomes ready, a port lost to another process is given
up for another one while a port the caller chose is kept, a daemon that exits at once is an
error naming its log, and stop() leaves no process behind. Only processes the tests started
are looked at."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm.hosts import process
from gearfarm.hosts.daemon import Daemon, Failure, PortTaken
from gearfarm.hosts.net import free_port

# Answers every connection with its pid, so that ready() can tell it from another process on
# its port. Modes: "exit-on-taken" exits when its port is taken (like stunnel and MinIO),
# "retry-bind" keeps trying to bind it (like gearmand), "exit-now" exits before binding (a
# daemon with a bad configuration), "ignore-term" ignores SIGTERM.
TINY = r"""
import os, signal, socket, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
if mode == "exit-now":
    print("tiny: no configuration at /nonexistent/tiny.conf", flush=True)
    sys.exit(3)
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    try:
        server = socket.create_server(("127.0.0.1", port))
        break
    except OSError as e:
        print(f"tiny: cannot bind port {port}: {e}", flush=True)
        if mode != "retry-bind":
            sys.exit(1)
        time.sleep(0.1)
while True:
    conn, _ = server.accept()
    conn.sendall(f"{os.getpid()}\n".encode())
    conn.close()
"""


class Tiny(Daemon):
    name = "tiny"

    def __init__(self, state_dir: Path, mode: str = "exit-on-taken", port: int | None = None,
                 ports: list[int] | None = None, races: frozenset[str] = frozenset({"exited", "taken"}),
                 start_timeout: float = 10.0) -> None:
        super().__init__(state_dir, state_dir / "tiny.log", port=port, start_timeout=start_timeout)
        self.mode = mode
        self.races = races
        self._ports = iter(ports or [])
        self.stopped: list[int] = []  # the pid of every launch stopped, a failed one or not

    def pick_port(self) -> int:
        return next(self._ports, None) or super().pick_port()

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-c", TINY, str(port), self.mode]

    def ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        try:
            with socket.create_connection((self.host, port), timeout=1) as conn:
                answer = conn.makefile().readline().strip()
        except OSError:
            return False
        if answer == str(proc.pid):
            return True
        if self.mode == "retry-bind":
            raise PortTaken
        return False  # like stunnel's, this daemon's exit is what tells a lost race

    def stop(self, timeout: float | None = None) -> None:
        if self.proc is not None:
            self.stopped.append(self.proc.pid)
        super().stop(timeout)

    def lost_race(self, failure: Failure) -> bool:
        return (failure.exited and "exited" in self.races) or (failure.taken and "taken" in self.races)


def pid_of(address: tuple[str, int]) -> int:
    with socket.create_connection(address, timeout=2) as conn:
        return int(conn.makefile().readline())


def gone(identity: dict[str, object] | None) -> bool:
    """Whether the process ``identity`` recorded no longer exists (a recycled pid is not it)."""
    assert identity is not None
    return not process.is_same(identity)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Tiny]:
    """A tiny daemon already holding a port: the thief another daemon loses its race to."""
    with Tiny(tmp_path / "holder") as d:
        yield d


def test_a_daemon_becomes_ready_and_stop_leaves_no_process(tmp_path: Path) -> None:
    with Tiny(tmp_path / "tiny") as d:
        assert d.running and d.pid is not None
        assert pid_of(d.address) == d.pid
        assert d.address[0] == "127.0.0.1"
        started = process.identity(d.pid)
    assert not d.running and d.pid is None
    assert gone(started)


def test_stop_kills_a_daemon_that_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    d = Tiny(tmp_path / "tiny", mode="ignore-term").start()
    assert d.pid is not None
    started = process.identity(d.pid)
    begun = time.monotonic()
    d.stop(timeout=0.5)
    took = time.monotonic() - begun
    assert gone(started)
    assert 0.5 <= took < 5, f"stop took {took:.1f}s"


def test_restart_comes_back_on_the_same_port(tmp_path: Path) -> None:
    with Tiny(tmp_path / "tiny") as d:
        port, first = d.port, d.pid
        d.restart()
        assert d.port == port and d.pid != first
        assert pid_of(d.address) == d.pid


@pytest.mark.parametrize("mode", ["exit-on-taken", "retry-bind"])
def test_a_port_lost_to_another_process_is_retried_on_another(holder: Tiny, tmp_path: Path, mode: str) -> None:
    """exit-on-taken loses the race by exiting, retry-bind by another process answering on its port."""
    assert holder.port is not None
    d = Tiny(tmp_path / "racer", mode=mode, ports=[holder.port])
    with d:
        assert d.port != holder.port
        assert pid_of(d.address) == d.pid
        assert len(d.stopped) == 1, "one launch lost its port"
        if mode == "exit-on-taken":
            assert f"cannot bind port {holder.port}" in d.log_path.read_text()
    assert len(d.stopped) == 2
    assert all(process.start_time(pid) is None for pid in d.stopped), "a launch was left running"
    assert holder.running and pid_of(holder.address) == holder.pid


def test_a_port_the_caller_chose_is_kept_not_moved(holder: Tiny, tmp_path: Path) -> None:
    assert holder.port is not None
    d = Tiny(tmp_path / "fixed", mode="retry-bind", port=holder.port, start_timeout=1)
    with pytest.raises(RuntimeError, match=f"tiny failed to start on 127.0.0.1: port {holder.port}: "
                                           r"did not answer within 1s") as err:
        d.start()
    assert str(d.log_path) in str(err.value)
    assert d.port == holder.port and not d.running
    assert len(d.stopped) == 1 and process.start_time(d.stopped[0]) is None


@pytest.mark.parametrize("races, launches", [(frozenset({"taken"}), 1), (frozenset({"exited"}), 5)])
def test_a_daemon_that_exits_at_once_is_an_error_naming_its_log(tmp_path: Path, races: frozenset[str],
                                                                launches: int) -> None:
    """Retried only where the daemon's race rule counts an exit as a lost race (stunnel, MinIO)."""
    d = Tiny(tmp_path / "broken", mode="exit-now", races=races)
    with pytest.raises(RuntimeError) as err:
        d.start()
    message = str(err.value)
    assert message.startswith("tiny failed to start on 127.0.0.1: port ")
    assert message.count("exited with code 3") == launches
    assert f"log {d.log_path}:" in message
    assert "tiny: no configuration at /nonexistent/tiny.conf" in message
    assert not d.running and d.pid is None


def test_address_before_start_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"tiny has no port yet; call start\(\) first"):
        _ = Tiny(tmp_path / "tiny").address


def test_a_given_free_port_is_used(tmp_path: Path) -> None:
    port = free_port()
    with Tiny(tmp_path / "tiny", port=port) as d:
        assert d.port == port and pid_of(("127.0.0.1", port)) == d.pid
