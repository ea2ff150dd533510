"""The one definition of the farm's Gearman wire format: function names, unique ids, and the
signed, versioned JSON payload. Payloads name catalog entries; they never carry a command.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 1
Kind = Literal["build", "test", "perf"]
COLLECT_FUNCTION = "collect"

_HEX40 = r"^[0-9a-f]{40}$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_RUN_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"


class PayloadError(ValueError):
    """A payload was malformed, unsigned, forged, replayed or of an unknown schema."""


def function_name(kind: Kind, target: str) -> str:
    return f"{kind}:{target}"


def job_id(run_id: str, target: str, step: str) -> str:
    """The job's identity across retries: one result row per job id."""
    return f"{run_id}:{target}:{step}"


def step_name(kind: Kind, name: str | None = None) -> str:
    return kind if kind == "build" else f"{kind}-{name}"


def unique_id(job: str, attempt: int, salt: str = "") -> str:
    """gearmand dedupes on (unique, function): a resubmitted run with the same attempt is a
    no-op, while a deliberate retry (attempt+1) is a new job. gearmand caps unique ids at 64
    bytes, so the id is a digest of the job id (the payload carries the readable one)."""
    return hashlib.sha256(f"{job}#{attempt}#{salt}".encode()).hexdigest()[:48] + f"#{attempt}"


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Kind
    run_id: str = Field(pattern=_RUN_ID)
    rev: str = Field(pattern=_HEX40)
    target: str = Field(pattern=r"^[a-z0-9]+-[a-z0-9_]+$")
    # build: the suites (and benchmarks) to fan out to after a good build.
    suites: list[str] = Field(default_factory=list, max_length=64)
    benchmarks: list[str] = Field(default_factory=list, max_length=64)
    # test / perf: the catalog entry to run, and the artifact to run it on.
    name: str | None = Field(default=None, pattern=_NAME)
    artifact_key: str | None = Field(default=None, max_length=512)
    artifact_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    # perf (and the build that fans it out): the last good build of the same target, run
    # alternately with tonight's (A B A B ...) so drift and noise between nights cancel.
    baseline_rev: str | None = Field(default=None, pattern=_HEX40)
    baseline_key: str | None = Field(default=None, max_length=512)
    baseline_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    seed: int = Field(default=1, ge=0, lt=2**31)
    attempt: int = Field(default=1, ge=1, le=100)
    submitted_at: float

    @property
    def step(self) -> str:
        return step_name(self.kind, self.name)

    @property
    def job_id(self) -> str:
        return job_id(self.run_id, self.target, self.step)

    @property
    def function(self) -> str:
        return function_name(self.kind, self.target)

    @property
    def unique(self) -> str:
        return unique_id(self.job_id, self.attempt)


def _canonical(obj: dict[str, object]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _mac(key: str, body: bytes) -> str:
    return hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


def key_id(key: str) -> str:
    """A short, non-secret name for a key, so logs can say which key signed."""
    return hashlib.sha256(b"gearfarm-kid:" + key.encode()).hexdigest()[:8]


def sign(payload: Payload, keys: list[str]) -> bytes:
    """Encode a payload as a signed envelope, signed with the first key."""
    if not keys:
        raise PayloadError("no signing key configured ([farm] secrets)")
    body = payload.model_dump(mode="json")
    return _canonical({"payload": body, "kid": key_id(keys[0]), "sig": _mac(keys[0], _canonical(body))})


def verify(data: bytes, keys: list[str], max_age: float, now: float | None = None) -> Payload:
    """Decode and check an envelope; raise PayloadError saying exactly what is wrong."""
    if len(data) > 64 * 1024:
        raise PayloadError(f"payload too large ({len(data)} bytes)")
    try:
        env = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PayloadError(f"payload is not JSON: {e}") from e
    if not isinstance(env, dict) or set(env) != {"payload", "kid", "sig"}:
        raise PayloadError("payload is not a signed envelope {payload, kid, sig}")
    body, sig = env["payload"], env["sig"]
    if not isinstance(body, dict) or not isinstance(sig, str):
        raise PayloadError("payload envelope has the wrong shape")
    mac_body = _canonical(body)
    if not any(hmac.compare_digest(_mac(k, mac_body), sig) for k in keys):
        raise PayloadError(f"bad signature (kid {str(env['kid'])[:16]!r}): forged, or signed with an unknown key")
    if body.get("schema_version") != SCHEMA_VERSION:
        raise PayloadError(f"unsupported payload schema {body.get('schema_version')!r}; this worker speaks 1")
    try:
        p = Payload.model_validate(body)
    except ValidationError as e:
        raise PayloadError(f"invalid payload: {e.errors()[0]['loc']} {e.errors()[0]['msg']}") from e
    age = (time.time() if now is None else now) - p.submitted_at
    if age > max_age or age < -300:
        raise PayloadError(f"payload outside its time window (age {age:.0f}s, limit {max_age:.0f}s): replay?")
    if p.kind == "build" and (p.name or p.artifact_key):
        raise PayloadError("a build payload names no suite and no artifact")
    if p.kind != "build" and not (p.name and p.artifact_key and p.artifact_sha256):
        raise PayloadError(f"a {p.kind} payload needs name, artifact_key and artifact_sha256")
    return p
