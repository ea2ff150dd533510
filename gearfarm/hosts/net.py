"""Loopback networking helpers shared by the embedded farm and the tests."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now.

    There is an unavoidable race between closing this socket and the server binding it;
    callers that start servers retry on a bind failure rather than trusting the port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts a TCP connection on (host, port) within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port(host: str, port: int, timeout: float = 20.0) -> bool:
    """Wait until something accepts TCP connections on (host, port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(host, port):
            return True
        time.sleep(0.05)
    return False
