"""The result record: what every job reports. Workers seal it with the farm key and write it to
S3 beside the job's logs (the durable copy) and send it to the collector; the run ledger
(gearfarm.ledger) decides what each record changes.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gearfarm.seal import SealError, canonical, seal, unseal

Status = Literal["passed", "failed", "skipped", "timed_out", "no_worker", "infra", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"passed", "failed", "skipped", "timed_out", "no_worker", "infra", "cancelled"})
# What the product did (the job ran to an answer) as opposed to what the farm decided.
PRODUCT: frozenset[str] = frozenset({"passed", "failed", "timed_out"})
# "cancelled": a person stopped the job (gearfarm web); neither the product's result nor a fault.
FARM_MADE: frozenset[str] = frozenset({"skipped", "no_worker", "infra", "cancelled"})
# Statuses that mean the product is broken, as opposed to the farm.
PRODUCT_FAILURES: frozenset[str] = frozenset({"failed", "timed_out"})


class RecordError(ValueError):
    """A result record was malformed, unsigned or forged."""


class CaseResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    classname: str = ""
    name: str
    status: Literal["passed", "failed", "skipped", "error"]
    time: float = 0.0
    message: str = ""


class Sample(BaseModel):
    """One benchmark figure from one repetition."""

    model_config = ConfigDict(extra="forbid")
    benchmark: str
    metric: str
    value: float
    repetition: int = 0
    # "ratio" is new/baseline of one A/B pair: the paired measure of tonight's change;
    # "ref_ratio" new/reference of the same runs: tonight's build against the pinned reference.
    variant: Literal["new", "baseline", "reference", "ratio", "ref_ratio"] = "new"


class CurveRecord(BaseModel):
    """One curve of one benchmark run (gearfarm.catalog.Curve): its lines (split value -> [x, y]
    points, "" without a split), for tonight's build or its baseline."""

    model_config = ConfigDict(extra="forbid")
    benchmark: str
    title: str
    x: str
    y: str
    variant: Literal["new", "baseline"] = "new"
    # The key whose values split the curve into lines ("threads"), "" when it has one line.
    split_name: str = ""
    lines: dict[str, list[tuple[float, float]]] = Field(default_factory=dict)


class ResultRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    job_id: str
    run_id: str
    target: str
    kind: Literal["build", "test", "perf"]
    step: str
    name: str | None = None
    rev: str
    status: Status
    attempt: int = 1
    worker: str = ""
    host: dict[str, str] = Field(default_factory=dict)
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    # Per-stage seconds: queue_wait, host_wait (for a benchmark to end: gearfarm.hostlock),
    # export, build, upload, download, verify, test.
    timings: dict[str, float] = Field(default_factory=dict)
    artifact_key: str | None = None
    artifact_sha256: str | None = None
    bytes_uploaded: int = 0
    reused_artifact: bool = False
    log_key: str | None = None
    junit_key: str | None = None
    message: str = ""
    log_tail: str = ""
    cases: list[CaseResult] = Field(default_factory=list)
    samples: list[Sample] = Field(default_factory=list)
    # Perf jobs: how quiet the host was while they measured (gearfarm.host.Activity: load,
    # other farm jobs, other processes' CPU, clock) and the seconds they waited for it.
    quietness: dict[str, float] = Field(default_factory=dict)
    # Perf jobs: tonight's build is byte for byte the baseline it was paired with, so no
    # change of the code can show in its figures (None: not paired, or not known).
    baseline_identical: bool | None = None
    # Perf jobs: the revision of the build they were paired with (None: ran unpaired).
    baseline_rev: str | None = None
    # Perf jobs: the revision of the reference build they were measured against (None: none).
    reference_rev: str | None = None
    # Perf jobs: the curves the benchmark recorded while it ran (its catalog entry's curves).
    curves: list[CurveRecord] = Field(default_factory=list)

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    @property
    def work_seconds(self) -> float | None:
        """The job's own wall time: a build or test starts its clock once it holds the host
        lock; a benchmark's wait for the host (lock_wait) is inside its clock but not its work."""
        if self.duration is None:
            return None
        return max(0.0, self.duration - self.quietness.get("lock_wait", 0.0))

    @property
    def digest(self) -> str:
        """The record's identity: the same record delivered twice has the same digest."""
        return hashlib.sha256(canonical(self.model_dump(mode="json"))).hexdigest()


def seal_record(rec: ResultRecord, keys: list[str]) -> bytes:
    return seal("result", rec.model_dump(mode="json"), keys)


def open_record(data: bytes, keys: list[str]) -> ResultRecord:
    """A genuine record; RecordError naming the problem (never the key) otherwise."""
    try:
        body = unseal(data, "result", keys)
    except SealError as e:
        raise RecordError(str(e)) from e
    try:
        return ResultRecord.model_validate(body)
    except ValidationError as e:
        raise RecordError(f"invalid result record: {e.errors()[0]['loc']} {e.errors()[0]['msg']}") from e
