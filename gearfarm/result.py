"""The result record: what every job reports, once. Written to S3 beside the job's logs (the
durable copy) and sent to the collector, which keeps exactly one row per job id.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["passed", "failed", "skipped", "timed_out", "no_worker", "infra"]
TERMINAL: frozenset[str] = frozenset({"passed", "failed", "skipped", "timed_out", "no_worker", "infra"})
# Statuses that mean the product is broken, as opposed to the farm.
PRODUCT_FAILURES: frozenset[str] = frozenset({"failed", "timed_out"})


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
    # "ratio" is new/baseline of one A/B pair: the paired measure of tonight's change.
    variant: Literal["new", "baseline", "ratio"] = "new"


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
    # Per-stage seconds: queue_wait, export, build, upload, download, verify, test.
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

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at
