"""Dashboard accounts: a name and a token. Reading the dashboard needs none; triage, cancel
and starting runs do. The token is shown once when the account is made (`gearfarm web user
add NAME`) and only its sha256 is stored, so a copy of the database gives no one a login.
A browser that logs in gets a session: a random id in its cookie, kept on the server (its
sha256) until it logs out, the account is removed or SESSION_DAYS pass, so a copy of the
cookie stops working when the session ends."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time

from sqlalchemy import delete, select

from gearfarm.db.results import ResultsDB, WebSession, WebUser

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$")
# A session older than this ends even if the browser never logs out (a forgotten laptop).
SESSION_DAYS = 30.0


class AccountError(ValueError):
    """A bad account name, or one that exists (or does not)."""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add(db: ResultsDB, name: str) -> str:
    """Make an account; its token (shown once)."""
    if not NAME_RE.match(name):
        raise AccountError(f"account name {name!r}: use letters, digits, '.', '_' or '-', starting with a letter")
    token = secrets.token_urlsafe(24)
    with db.writing() as conn:
        stmt = db.insert(WebUser).values(name=name, token_sha256=_digest(token), created_at=time.time())
        if conn.execute(stmt.on_conflict_do_nothing(index_elements=["name"]).returning(WebUser.name)).first() is None:
            raise AccountError(f"account {name!r} exists; remove it first (gearfarm web user remove {name})")
    return token


def remove(db: ResultsDB, name: str) -> None:
    """Remove the account and end its sessions: an account made again under the same name is
    someone else, and must not inherit a browser that was logged in as the old one."""
    with db.writing() as conn:
        conn.execute(delete(WebSession).where(WebSession.user == name))
        if conn.execute(delete(WebUser).where(WebUser.name == name)).rowcount == 0:
            raise AccountError(f"no account {name!r}")


def exists(db: ResultsDB, name: str) -> bool:
    with db.session() as s:
        return s.get(WebUser, name) is not None


def names(db: ResultsDB) -> list[str]:
    with db.session() as s:
        return list(s.scalars(select(WebUser.name).order_by(WebUser.name)))


def who(db: ResultsDB, token: str) -> str | None:
    """The account a token belongs to, or None."""
    if not token:
        return None
    digest = _digest(token)
    with db.session() as s:
        row = s.scalars(select(WebUser).where(WebUser.token_sha256 == digest)).first()
    # The lookup is by digest; compare again in constant time so the answer's timing says nothing.
    return row.name if row is not None and hmac.compare_digest(row.token_sha256, digest) else None


def start_session(db: ResultsDB, name: str) -> str:
    """A new session for account ``name``: the random id for its cookie (only the id's sha256
    is stored)."""
    sid = secrets.token_urlsafe(32)
    with db.writing() as conn:
        # Expired sessions are refused when read; deleted here, so the table stays small.
        conn.execute(delete(WebSession).where(WebSession.created_at < time.time() - SESSION_DAYS * 86400))
        conn.execute(db.insert(WebSession).values(id_sha256=_digest(sid), user=name, created_at=time.time()))
    return sid


def session_user(db: ResultsDB, sid: object) -> str | None:
    """The account whose live session ``sid`` is, or None (ended, expired, its account gone,
    or not a session id at all)."""
    if not isinstance(sid, str) or not sid:
        return None
    with db.session() as s:
        row = s.execute(select(WebSession.user).join(WebUser, WebUser.name == WebSession.user)
                        .where(WebSession.id_sha256 == _digest(sid),
                               WebSession.created_at > time.time() - SESSION_DAYS * 86400)).first()
    return row[0] if row is not None else None


def end_session(db: ResultsDB, sid: object) -> None:
    """End session ``sid`` on the server (logging out); nothing to do for one that is not live."""
    if isinstance(sid, str) and sid:
        with db.writing() as conn:
            conn.execute(delete(WebSession).where(WebSession.id_sha256 == _digest(sid)))
