"""The registry of worker host keys: each host's Ed25519 public key, with the roles and targets
it may serve (the PostgreSQL buildfarm's one secret per animal, made asymmetric). It lives in the
results database beside the ledger that consults it: a worker's result record is applied only
when its signer is registered, not revoked, for the record's role and target, and the record
names that host (``Registry.authorize``). ``gearfarm keys add/list/revoke`` edit it; a host's
key is rotated by adding the new key, switching the host to it, and revoking the old one, with
no moment when the host cannot deliver.

Lookups are cached for ``ttl`` seconds (the collector applies thousands of records a minute): a
revocation takes effect on every collector and nightly within that time."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import select, update

from gearfarm.db.results import HostKey, ResultsDB
from gearfarm.formats.job import KINDS
from gearfarm.formats.seal import key_id, parse_public

HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ROLES: tuple[str, ...] = KINDS  # a host signs the records of the jobs of its roles: build, test, perf
ANY_TARGET = "*"


class RegistryError(ValueError):
    """A registry change that cannot be made, saying why and what to do instead."""


@dataclass(frozen=True)
class HostKeyEntry:
    kid: str
    host: str
    public_key: str
    roles: tuple[str, ...]
    targets: tuple[str, ...]
    added_at: float
    revoked_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def serves(self, role: str, target: str) -> bool:
        return role in self.roles and (ANY_TARGET in self.targets or target in self.targets)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t or 0))


def _entry(row: HostKey, revoked_at: float | None = None) -> HostKeyEntry:
    return HostKeyEntry(row.kid, row.host, row.public_key, tuple(row.roles), tuple(row.targets), row.added_at,
                        revoked_at or row.revoked_at)


class Registry:
    def __init__(self, db: ResultsDB, ttl: float = 2.0) -> None:
        self.db = db
        self.ttl = ttl
        self._cache: dict[str, HostKeyEntry] = {}
        self._loaded = float("-inf")

    # ------------------------------------------------------------------ reading

    def entries(self) -> list[HostKeyEntry]:
        with self.db.session() as s:
            return [_entry(r) for r in s.scalars(select(HostKey).order_by(HostKey.host, HostKey.added_at))]

    def entry(self, kid: str) -> HostKeyEntry | None:
        """The entry of a key id (revoked ones too), from a cache at most ``ttl`` seconds old."""
        now = time.monotonic()
        if now - self._loaded > self.ttl:
            self._cache = {e.kid: e for e in self.entries()}
            self._loaded = now
        return self._cache.get(kid)

    def public_key(self, kid: str) -> Ed25519PublicKey | None:
        """The key that verifies envelopes of ``kid``, if it is registered (revoked too: whether
        it may sign is ``authorize``'s answer, which says it was revoked)."""
        e = self.entry(kid)
        return parse_public(e.public_key) if e is not None else None

    def authorize(self, kid: str, kind: str, target: str, host: str) -> str:
        """Why the holder of ``kid`` may not sign for a ``kind`` job of ``target`` as ``host``
        ("" when it may)."""
        e = self.entry(kid)
        if e is None:
            return f"signed by key {kid}, which no host is registered with (gearfarm keys list)"
        if not e.active:
            return f"signed by key {kid} of host {e.host}, revoked at {_when(e.revoked_at)}"
        if not e.serves(kind, target):
            return (f"host {e.host} (key {kid}) is registered for {', '.join(e.roles)} on "
                    f"{', '.join(e.targets)}, not {kind} on {target}")
        if host != e.host:
            return f"it names host {host[:64]!r}, but was signed by the key of host {e.host} ({kid})"
        return ""

    # ------------------------------------------------------------------ changing

    def add(self, host: str, public_key: str, roles: Iterable[str], targets: Iterable[str]) -> HostKeyEntry:
        if not HOST_RE.match(host):
            raise RegistryError(f"host name {host[:80]!r}: letters, digits, '.', '_' and '-', at most 64")
        key = parse_public(public_key)
        roles_, targets_ = sorted(set(roles)), sorted(set(targets))
        unknown = [r for r in roles_ if r not in ROLES]
        if not roles_ or unknown:
            raise RegistryError(f"roles {', '.join(unknown) or '(none)'}: a host signs records of "
                                f"{', '.join(ROLES)} jobs; name at least one")
        if not targets_:
            raise RegistryError(f"name the targets the host serves, or {ANY_TARGET!r} for all")
        kid = key_id(key)
        now = time.time()
        with self.db.session(write=True) as s:
            row = s.get(HostKey, kid)
            if row is not None and row.revoked_at is not None:
                raise RegistryError(f"key {kid} was revoked at {_when(row.revoked_at)}; a revoked key never comes "
                                    "back: make a new one (gearfarm keys new)")
            if row is not None and row.host != host:
                raise RegistryError(f"key {kid} is registered to host {row.host}; one key, one host")
            if row is None:
                row = HostKey(kid=kid, host=host, public_key=public_key, roles=roles_, targets=targets_,
                              added_at=now, revoked_at=None)
                s.add(row)
            else:
                row.roles, row.targets = roles_, targets_
            s.flush()
            entry = _entry(row)
        self._loaded = float("-inf")
        return entry

    def revoke(self, who: str) -> list[HostKeyEntry]:
        """Revoke one key (by its id) or every key of a host (by its name); the entries revoked."""
        now = time.time()
        with self.db.session(write=True) as s:
            cond = (HostKey.kid == who) | (HostKey.host == who)
            rows = list(s.scalars(select(HostKey).where(cond, HostKey.revoked_at.is_(None))))
            if not rows:
                raise RegistryError(f"no active key with id or host {who[:80]!r} (gearfarm keys list)")
            s.execute(update(HostKey).where(cond, HostKey.revoked_at.is_(None)).values(revoked_at=now))
        self._loaded = float("-inf")
        return [_entry(r, now) for r in rows]
