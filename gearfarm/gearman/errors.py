"""Exceptions raised by the gearfarm Gearman client, worker and admin helpers.

They live in one module so callers can catch ``GearmanError`` for "anything the job
server side did wrong" without importing the client, worker and admin modules.
"""

from __future__ import annotations

from collections.abc import Sequence


class GearmanError(Exception):
    """Base class of every error raised by :mod:`gearfarm.gearman`."""


class ProtocolError(GearmanError):
    """The peer sent bytes that are not a valid Gearman packet (or admin reply)."""


class ConnectionClosed(GearmanError, ConnectionError):
    """The job server closed the connection (EOF) in the middle of an exchange."""


class ServerError(GearmanError):
    """The job server answered with an ERROR packet (or ``ERR`` admin line)."""

    def __init__(self, address: str, code: str, text: str) -> None:
        super().__init__(f"gearmand {address} returned error {code}: {text}")
        self.address = address
        self.code = code
        self.text = text


class ServerUnavailable(GearmanError, ConnectionError):
    """No configured job server could be reached.

    The message names every address tried, with the reason each one failed, because
    "connection refused" without the address is useless in a farm with several servers.
    """

    def __init__(self, attempts: Sequence[tuple[str, BaseException | str]]) -> None:
        details = "; ".join(f"{addr}: {err}" for addr, err in attempts) or "no servers configured"
        super().__init__(f"no Gearman job server available (tried {details})")
        self.attempts = list(attempts)
        self.addresses = [addr for addr, _ in attempts]


class JobFailed(GearmanError):
    """A foreground job ended with WORK_FAIL or WORK_EXCEPTION."""

    def __init__(self, handle: str, exception: bytes | None = None) -> None:
        detail = f": {exception.decode('utf-8', 'replace')}" if exception else ""
        super().__init__(f"job {handle} failed{detail}")
        self.handle = handle
        self.exception = exception


class JobLost(GearmanError, ConnectionError):
    """The connection to the server died while waiting for a foreground job's result.

    The job may or may not have run; foreground jobs are not persisted by gearmand, so
    the caller has to decide whether resubmitting is safe.
    """
