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
    """The job server answered with an ERROR packet (or ``ERR`` admin line).

    ``code`` and ``text`` are gearmand's, e.g. ``QUEUE_ERROR`` / ``Job queue is full``
    (1.1.20, when a ``maxqueue`` limit is reached).  ``request`` says what the ERROR
    answered, if the caller knows.  From :meth:`Client.submit_background_many`,
    ``index`` is the 0-based position in the batch of the submission it answered and
    ``submitted`` holds the handles of the jobs before it, which stay queued.
    """

    def __init__(
        self,
        address: str,
        code: str,
        text: str,
        *,
        request: str = "",
        index: int | None = None,
        submitted: Sequence[str] = (),
    ) -> None:
        context = f" ({request})" if request else ""
        super().__init__(f"gearmand {address} returned error {code}: {text}{context}")
        self.address = address
        self.code = code
        self.text = text
        self.request = request
        self.index = index
        self.submitted = list(submitted)


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


class StatusUnknown(GearmanError):
    """A job status query got "unknown" from some servers while others did not answer.

    A handle or unique id does not say which server holds the job, so the job may be
    on a server that could not be asked: this means "cannot tell now", never "the job
    is gone".  ``attempts`` pairs every server that did not answer with the reason,
    ``addresses`` lists those servers and ``answered`` the ones that said "unknown".
    """

    def __init__(self, key: str, attempts: Sequence[tuple[str, BaseException | str]], answered: Sequence[str]) -> None:
        details = "; ".join(f"{addr}: {err}" for addr, err in attempts)
        super().__init__(
            f"cannot tell whether job {key!r} exists: no answer from {details}; unknown to {', '.join(answered)}"
        )
        self.key = key
        self.attempts = list(attempts)
        self.addresses = list(dict.fromkeys(addr for addr, _ in attempts))
        self.answered = list(answered)


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
