"""A job attempt's lease: the wire format of the claim a worker makes before it runs an attempt,
and of the heartbeats that keep it, both signed with the worker host's own key and sent to the
collector, whose ledger keeps one lease per (job, attempt) (gearfarm.run.ledger.Ledger.lease).

Why through the ledger and not gearmand: anything holding a Gearman connection can grab a job
and send WORK_STATUS for it forever; only a registered host can sign a claim. So

- each attempt runs once: the first claim wins; a second copy of the attempt (a replay, or the
  same job from a second gearmand) is refused while the holder beats, and for good once the
  attempt delivered its record; a holder that stopped beating for TAKEOVER seconds (its worker
  died, gearmand handed the job on) can be taken over;
- a held job is noticed: the nightly judges a running job by its lease's signed beats, and
  resubmits one held with no lease at all (a rogue worker) or whose beats stopped;
- a record is applied only from the host holding its attempt's lease."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gearfarm.formats.seal import Lookup, SealError, Signer, seal, unseal

# Seconds between a holder's signed beats: each is a write of the ledger's, so fewer than the
# worker's 5 s WORK_STATUS (a lease is judged over [farm] lease_timeout, a minute by default).
BEAT_SECONDS = 10.0
# Seconds without a beat after which another worker may take an attempt over (three beats).
TAKEOVER = 3 * BEAT_SECONDS
MAX_LEASE = 4096
# Seconds between a worker's looks at its running job (its WORK_STATUS, the cancel markers);
# a signed beat goes with every few of them.
HEARTBEAT_SECONDS = 5.0


def beat_every(lease_timeout: float) -> int:
    """How many of a worker's heartbeats there are to one signed beat: a beat every
    BEAT_SECONDS, or every third of the lease time the nightly judges by if that is shorter."""
    return max(1, round(min(BEAT_SECONDS, lease_timeout / 3) / HEARTBEAT_SECONDS))


def beat_seconds(lease_timeout: float) -> float:
    """Seconds between a live holder's signed beats."""
    return beat_every(lease_timeout) * HEARTBEAT_SECONDS


class LeaseError(ValueError):
    """A lease message that is malformed or not genuinely signed."""


class Lease(BaseModel):
    """A claim (beat 0) or a heartbeat (beat n) of one attempt by one worker process."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    job_id: str = Field(max_length=200)
    attempt: int = Field(ge=1, le=100)
    host: str = Field(max_length=64)
    worker: str = Field(max_length=200)
    beat: int = Field(ge=0)

    @field_validator("job_id", "host", "worker")
    @classmethod
    def _no_nul(cls, text: str) -> str:
        # The ledger keeps these in text columns, which hold no NUL: a lease with one was
        # taken for a database outage and held a collector thread for ever.
        if "\x00" in text:
            raise ValueError("has a NUL character")
        return text


# The ledger's answer to a claim or a beat. `cancelled` is a refusal a running attempt obeys:
# the nightly recorded its job (or run) cancelled, and the answer to the job's next signed
# beat is how its worker learns it (workers/base.py Heartbeat).
Answer = Literal["granted", "held", "done", "refused", "cancelled"]
ANSWERS: tuple[Answer, ...] = get_args(Answer)


def seal_lease(lease: Lease, signer: Signer) -> bytes:
    return seal("lease", lease.model_dump(mode="json"), signer)


def open_lease(data: bytes, lookup: Lookup) -> tuple[Lease, str]:
    """(the lease, the signer's key id); LeaseError saying what is wrong."""
    try:
        body, kid = unseal(data, "lease", lookup, MAX_LEASE)
        return Lease.model_validate(body), kid
    except SealError as e:
        raise LeaseError(str(e)) from e
    except ValidationError as e:
        raise LeaseError(f"invalid lease: {e.errors()[0]['loc']} {e.errors()[0]['msg']}") from e


def answer(text: bytes) -> tuple[Answer, str]:
    """The collector's answer to a claim or beat: (granted | held | done | refused | cancelled, why)."""
    word, _, why = text.decode(errors="replace").partition(" ")
    if word not in ANSWERS:
        return "refused", f"unexpected answer {text[:100]!r}"
    return word, why  # type: ignore[return-value]
