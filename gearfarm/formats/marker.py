"""The nightly's markers in S3, what workers obey without asking anyone: a person cancelled a run
or one of its jobs (gearfarm.s3.keys.cancel). A job not yet started is refused by the ledger when
it claims it, and a running one learns it from the ledger's answer to its signed beat; a marker
is what a running job looks at when the ledger does not answer its beat (workers/base.py
Heartbeat), so a cancel reaches it without the collector. Only the nightly that owns the run writes them,
sealed with its key (gearfarm.formats.seal, purpose "marker"; the dashboard records a cancel in the
database and the nightly writes its marker within a poll). A worker obeys a marker only when
the seal verifies against [farm] nightly_keys and the marker names the run and job at whose
key it lies; any other is ignored and said in the worker's log.

Why signed, not only kept where the worker roles cannot write: S3 permissions are the store's,
and a store with looser policies, a leaked farm key or a role added later would let whoever
writes there stop any job; the nightly's signature is the farm's own word. Why the names
inside: a genuine marker copied to another run's key must not stop that run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gearfarm.formats.seal import Lookup, SealError, Signer, seal, unseal
from gearfarm.s3 import keys

MarkerKind = Literal["cancel"]


@dataclass(frozen=True)
class Marker:
    kind: MarkerKind
    run_id: str
    target: str | None = None  # a cancel of one job: its target and step; of the run: None
    step: str | None = None
    who: str = ""  # the person who cancelled
    at: float = 0.0

    @property
    def key(self) -> str:
        return keys.cancel(self.run_id, self.target, self.step)

    def names(self) -> str:
        return ":".join(x for x in (self.run_id, self.target, self.step) if x is not None)


def sealed(signer: Signer | None, m: Marker) -> bytes:
    """The marker's bytes, sealed by the nightly's key."""
    return seal("marker", {m.kind: {"run_id": m.run_id, "target": m.target, "step": m.step,
                                    "who": m.who, "at": m.at}}, signer)


def read(data: bytes, lookup: Lookup, at: Marker) -> Marker:
    """What a marker found at ``at``'s key says; SealError naming why it is not to be obeyed
    (not signed by the nightly, another kind, or signed for another run or job)."""
    body, _ = unseal(data, "marker", lookup)
    m = body.get(at.kind)
    if not isinstance(m, dict) or len(body) != 1:
        raise SealError(f"a marker signed by the nightly, but not a {at.kind} marker")
    said = Marker(at.kind, *(m.get(k) for k in ("run_id", "target", "step")))  # type: ignore[arg-type]
    if (said.run_id, said.target, said.step) != (at.run_id, at.target, at.step):
        raise SealError(f"a {at.kind} of {said.names()} lies at the key of {at.names()}: copied, not obeyed")
    who, when = m.get("who"), m.get("at")
    return Marker(at.kind, at.run_id, at.target, at.step, who if isinstance(who, str) else "?",
                  float(when) if isinstance(when, (int, float)) else 0.0)
