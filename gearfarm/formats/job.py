"""The one definition of the farm's Gearman wire format: function names, job ids, unique ids,
and the signed, versioned JSON payload, made by one factory. Payloads name catalog entries;
they never carry a command.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gearfarm.formats.seal import Lookup, SealError, Signer, seal, unseal

SCHEMA_VERSION = 6
Kind = Literal["build", "test", "perf"]
KINDS: tuple[str, ...] = ("build", "test", "perf")
COLLECT_FUNCTION = "collect"

_HEX40 = r"^[0-9a-f]{40}$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_RUN_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
_TARGET = r"^[a-z0-9]+-[a-z0-9_]+$"
_SHA256 = r"^[0-9a-f]{64}$"
MAX_PAYLOAD = 64 * 1024


class PayloadError(ValueError):
    """A payload was malformed, unsigned, forged, replayed or of an unknown schema."""


def function_name(kind: Kind, target: str) -> str:
    return f"{kind}:{target}"


def step_name(kind: Kind, name: str | None = None) -> str:
    return kind if kind == "build" else f"{kind}-{name}"


@dataclass(frozen=True, order=True)
class JobId:
    """A job's identity across retries: one result row per job id. Written "run:target:step";
    run ids and targets never contain a colon, so the text parses back unambiguously."""

    run_id: str
    target: str
    step: str

    def __str__(self) -> str:
        return f"{self.run_id}:{self.target}:{self.step}"

    @classmethod
    def parse(cls, text: str) -> JobId:
        parts = text.split(":")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"job id {text!r} is not 'run:target:step'")
        jid = cls(*parts)
        if jid.kind not in KINDS or (jid.kind != "build" and not jid.name):
            raise ValueError(f"job id {text!r} has an unknown step {jid.step!r} (build, test-NAME or perf-NAME)")
        return jid

    @property
    def kind(self) -> Kind:
        return self.step.split("-", 1)[0]  # type: ignore[return-value]

    @property
    def name(self) -> str | None:
        return self.step.split("-", 1)[1] if "-" in self.step else None

    @property
    def function(self) -> str:
        return function_name(self.kind, self.target)

    def unique(self, attempt: int) -> str:
        return unique_id(str(self), attempt)


def unique_id(job: str, attempt: int, salt: str = "") -> str:
    """gearmand dedupes on (unique, function): a resubmitted run with the same attempt is a
    no-op, while a deliberate retry (attempt+1) is a new job. gearmand caps unique ids at 64
    bytes, so the id is a digest of the job id (the payload carries the readable one)."""
    return hashlib.sha256(f"{job}#{attempt}#{salt}".encode()).hexdigest()[:48] + f"#{attempt}"


@dataclass(frozen=True)
class Source:
    """What a run builds: a project's tree at one commit (its snapshot in S3 by sha256) and the
    catalog the nightly validated for it (by sha256). Both go into every signed payload, so a
    worker builds and runs exactly what the nightly resolved, from S3 alone."""

    project: str
    rev: str
    sha256: str
    catalog_sha256: str


@dataclass(frozen=True)
class Artifact:
    """A stored build: its archive key and sha256 (and, for a baseline, its revision)."""

    key: str
    sha256: str
    rev: str | None = None


class SignedBuild(BaseModel):
    """A build of the farm's, as a signed build record the ledger applied names it: the only
    kind of stored artifact a build may reuse (its manifest checked by sha256 first)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    artifact_key: str = Field(max_length=512)
    artifact_sha256: str = Field(pattern=_SHA256)
    manifest_sha256: str = Field(pattern=_SHA256)


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[6] = SCHEMA_VERSION
    kind: Kind
    run_id: str = Field(pattern=_RUN_ID)
    project: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    rev: str = Field(pattern=_HEX40)
    # The source snapshot of rev and the catalog, both checked by sha256 before use.
    source_sha256: str = Field(pattern=_SHA256)
    catalog_sha256: str = Field(pattern=_SHA256)
    target: str = Field(pattern=_TARGET)
    # build: the suites (and benchmarks) the nightly fans out to after a good build.
    suites: list[str] = Field(default_factory=list, max_length=64)
    benchmarks: list[str] = Field(default_factory=list, max_length=64)
    # build: this revision's and target's earlier builds, from signed records: an artifact found
    # in S3 is reused only when it is one of these, so the digest the farm signed is the truth,
    # not whatever the bucket holds (a role key can overwrite an object).
    signed_builds: list[SignedBuild] = Field(default_factory=list, max_length=16)
    # test / perf: the catalog entry to run, and the artifact to run it on.
    name: str | None = Field(default=None, pattern=_NAME)
    artifact_key: str | None = Field(default=None, max_length=512)
    artifact_sha256: str | None = Field(default=None, pattern=_SHA256)
    # perf (and the build that fans it out): the last good build of the same target, run
    # alternately with tonight's (A B A B ...) so drift and noise between nights cancel.
    baseline_rev: str | None = Field(default=None, pattern=_HEX40)
    baseline_key: str | None = Field(default=None, max_length=512)
    baseline_sha256: str | None = Field(default=None, pattern=_SHA256)
    # perf (and its build): the target's pinned reference build, run as a third side beside the
    # two above (ResultsDB.reference_build): every night measured against one build, so a step shows in
    # every night after it, not only in its first night's pairs.
    reference_rev: str | None = Field(default=None, pattern=_HEX40)
    reference_key: str | None = Field(default=None, max_length=512)
    reference_sha256: str | None = Field(default=None, pattern=_SHA256)
    # test (and the build that fans it out): run only these cases of the suite, by the catalog's
    # `only` items (a bisection's probe); empty: the whole suite. Each name goes into single argv
    # items, never a shell: no control characters.
    cases: list[Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]{1,200}$")]] = Field(
        default_factory=list, max_length=16)
    seed: int = Field(default=1, ge=0, lt=2**31)
    attempt: int = Field(default=1, ge=1, le=100)
    submitted_at: float
    # The run's deadline (epoch seconds): a worker drops a job found in a queue after it, so a
    # job left in gearmand's persistent queue never runs on a later start of the farm.
    deadline: float

    @property
    def job(self) -> JobId:
        return JobId(self.run_id, self.target, self.step)

    @property
    def step(self) -> str:
        return step_name(self.kind, self.name)

    @property
    def job_id(self) -> str:
        return str(self.job)

    @property
    def function(self) -> str:
        return function_name(self.kind, self.target)

    @property
    def unique(self) -> str:
        """The Gearman unique id this payload must arrive under. It is derived from signed
        fields, so the signature binds it: a worker drops a payload found under another."""
        return self.job.unique(self.attempt)

    @property
    def source(self) -> Source:
        return Source(self.project, self.rev, self.source_sha256, self.catalog_sha256)

    @property
    def artifact(self) -> Artifact | None:
        return Artifact(self.artifact_key, self.artifact_sha256) if self.artifact_key and self.artifact_sha256 \
            else None

    @property
    def baseline(self) -> Artifact | None:
        if self.baseline_key and self.baseline_sha256 and self.baseline_rev:
            return Artifact(self.baseline_key, self.baseline_sha256, self.baseline_rev)
        return None

    @property
    def reference(self) -> Artifact | None:
        if self.reference_key and self.reference_sha256 and self.reference_rev:
            return Artifact(self.reference_key, self.reference_sha256, self.reference_rev)
        return None


def make_payload(job: JobId, *, source: Source, deadline: float, attempt: int = 1, seed: int = 1,
                 suites: Sequence[str] = (), benchmarks: Sequence[str] = (), artifact: Artifact | None = None,
                 baseline: Artifact | None = None, reference: Artifact | None = None,
                 cases: Sequence[str] = (), signed_builds: Sequence[SignedBuild] = ()) -> Payload:
    """Every payload the farm sends (build, test, perf; first attempts, resubmissions, re-runs)
    is made here, so no path can drop a field another path sets. A build carries what its
    dependents need (suites, benchmarks, baseline); a test or perf job carries its artifact;
    only perf jobs carry the baseline and the reference they are measured against."""
    kind = job.kind
    if kind == "build" and artifact is not None:
        raise ValueError("a build payload names no artifact")
    if kind != "build" and artifact is None:
        raise ValueError(f"a {kind} payload needs the artifact it runs on")
    base = baseline if kind in ("build", "perf") else None
    ref = reference if kind in ("build", "perf") else None
    return Payload(
        kind=kind, run_id=job.run_id, project=source.project, rev=source.rev, source_sha256=source.sha256,
        catalog_sha256=source.catalog_sha256, target=job.target, name=job.name,
        suites=list(suites) if kind == "build" else [], benchmarks=list(benchmarks) if kind == "build" else [],
        signed_builds=list(signed_builds)[:16] if kind == "build" else [],
        artifact_key=artifact.key if artifact else None, artifact_sha256=artifact.sha256 if artifact else None,
        baseline_rev=base.rev if base else None, baseline_key=base.key if base else None,
        baseline_sha256=base.sha256 if base else None,
        reference_rev=ref.rev if ref else None, reference_key=ref.key if ref else None,
        reference_sha256=ref.sha256 if ref else None, cases=list(cases) if kind in ("build", "test") else [],
        seed=seed, attempt=attempt, submitted_at=time.time(), deadline=deadline)


def sign(payload: Payload, signer: Signer | None) -> bytes:
    """Encode a payload as an envelope signed with the nightly's key (only the nightly host
    holds it: a worker host cannot make a payload)."""
    try:
        return seal("payload", payload.model_dump(mode="json"), signer)
    except SealError as e:
        raise PayloadError(str(e)) from e


def verify(data: bytes, nightly: Lookup, max_age: float, now: float | None = None) -> Payload:
    """Decode and check an envelope signed by one of the nightly's keys (``nightly``: the
    [farm] nightly_keys of the worker's config); raise PayloadError saying exactly what is
    wrong. A genuine payload past its run's deadline is not an error here: the worker drops it."""
    try:
        body, _ = unseal(data, "payload", nightly, MAX_PAYLOAD)
    except SealError as e:
        raise PayloadError(str(e)) from e
    if body.get("schema_version") != SCHEMA_VERSION:
        raise PayloadError(f"unsupported payload schema {body.get('schema_version')!r}; this worker speaks "
                           f"{SCHEMA_VERSION}")
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
