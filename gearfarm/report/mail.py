"""The nightly's mail: one aggregated message for all the runs it covers (never one per job or
per project), multipart/alternative with the plain-text report first and the HTML report
second (its plots as related PNG parts), sent by SMTP as [mail] in the config says (none,
STARTTLS or implicit TLS; login when a username is set). The caller renders the content (a
Letter): this module knows mail, not reports.

The message is always written as report.eml into the directory the caller names first, so a
mail that cannot be sent loses nothing: sending is retried, and a final failure is returned for
the caller to put on the console and in the runs' records. Without [mail] host the .eml is the
delivery.
"""

from __future__ import annotations

import logging
import smtplib
import ssl
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path
from typing import Any

from gearfarm.config import MailConfig

log = logging.getLogger(__name__)
SECURITY = ("none", "starttls", "tls")


class MailError(RuntimeError):
    """The message could not be sent (after every retry); ``attempts`` says how many were made."""

    def __init__(self, message: str, attempts: int = 0) -> None:
        super().__init__(message)
        self.attempts = attempts


@dataclass
class Letter:
    """A message's content, rendered by the caller: the runs it covers (the X-Gearfarm-Run
    header lists them), text and HTML bodies, and the PNG images the HTML names by content id."""

    subject: str
    runs: list[str]
    text: str
    html: str
    images: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Delivery:
    """What happened to a message; stored in the notes of every run it covers, under "mail"."""

    eml: str
    runs: list[str] = field(default_factory=list)
    sent: bool = False
    recipients: list[str] = field(default_factory=list)
    attempts: int = 0
    error: str | None = None
    at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compose(letter: Letter, cfg: MailConfig) -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = letter.subject
    msg["From"] = cfg.sender
    msg["To"] = ", ".join(cfg.recipients) if cfg.recipients else cfg.sender
    msg["Date"] = formatdate(localtime=False)
    msg["Message-ID"] = make_msgid(domain=cfg.sender.rpartition("@")[2] or "gearfarm")
    msg["X-Gearfarm-Run"] = ", ".join(letter.runs)
    msg.set_content(letter.text)
    msg.add_alternative(letter.html, subtype="html")
    html = msg.get_payload()[1]  # type: ignore[index]
    for cid, png in letter.images.items():
        html.add_related(png, "image", "png", cid=f"<{cid}>", filename=f"{cid}.png")
    return msg


def _describe(e: BaseException) -> str:
    # smtplib's errors carry the server's reply, never the password we sent.
    return f"{type(e).__name__}: {e}"


def send(msg: EmailMessage, cfg: MailConfig, *, timeout: float = 30.0, backoff: float = 2.0,
         sleep: Callable[[float], None] = time.sleep) -> int:
    """Send, trying 1 + cfg.retries times with growing pauses; returns the attempts it took.
    Raises MailError naming the server and the last error."""
    if not cfg.host:
        raise MailError("no [mail] host configured")
    if cfg.security not in SECURITY:
        raise MailError(f"[mail] security must be one of {', '.join(SECURITY)}, not {cfg.security!r}")
    if not cfg.recipients:
        raise MailError("[mail] recipients is empty")
    tries = 1 + max(0, cfg.retries)
    last: BaseException | None = None
    for attempt in range(1, tries + 1):
        try:
            _send_once(msg, cfg, timeout)
            log.info("mail %r sent to %s via %s:%d", msg["Subject"], ", ".join(cfg.recipients), cfg.host, cfg.port)
            return attempt
        except (smtplib.SMTPException, OSError, ssl.SSLError) as e:
            last = e
            log.warning("mail to %s:%d failed (attempt %d of %d): %s", cfg.host, cfg.port, attempt, tries,
                        _describe(e))
            # A permanent refusal (bad login, no AUTH, refused recipients) will not change by waiting.
            if isinstance(e, smtplib.SMTPAuthenticationError | smtplib.SMTPRecipientsRefused
                          | smtplib.SMTPNotSupportedError):
                break
            if attempt < tries:
                sleep(backoff * 2 ** (attempt - 1))
    raise MailError(f"mail via {cfg.host}:{cfg.port} ({cfg.security}) failed after {attempt} attempt(s): "
                    f"{_describe(last) if last else 'unknown error'}", attempts=attempt)


def _send_once(msg: EmailMessage, cfg: MailConfig, timeout: float) -> None:
    assert cfg.host is not None
    ctx = ssl.create_default_context()
    smtp: smtplib.SMTP
    if cfg.security == "tls":
        smtp = smtplib.SMTP_SSL(cfg.host, cfg.port, timeout=timeout, context=ctx)
    else:
        smtp = smtplib.SMTP(cfg.host, cfg.port, timeout=timeout)
    with smtp:
        smtp.ehlo()
        if cfg.security == "starttls":
            smtp.starttls(context=ctx)
            smtp.ehlo()
        if cfg.username:
            smtp.login(cfg.username, cfg.password or "")
        smtp.send_message(msg, from_addr=cfg.sender, to_addrs=cfg.recipients)


def deliver(letter: Letter, out_dir: Path, cfg: MailConfig, send_mail: bool = True, name: str = "report.eml",
            **send_args: Any) -> Delivery:
    """Write the message as ``out_dir``/``name``, then send it when [mail] has a host (and
    ``send_mail``). Never raises for a mail problem: the Delivery says what happened."""
    msg = compose(letter, cfg)
    eml = out_dir / name
    out_dir.mkdir(parents=True, exist_ok=True)
    eml.write_bytes(bytes(msg))
    d = Delivery(eml=str(eml), runs=list(letter.runs), recipients=list(cfg.recipients))
    if not cfg.host or not send_mail:
        return d
    try:
        d.attempts = send(msg, cfg, **send_args)
        d.sent = True
    except MailError as e:
        d.error = str(e)
        d.attempts = e.attempts
    return d
