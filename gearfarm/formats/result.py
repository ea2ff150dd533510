"""The result record: what every job reports. Workers seal it with their host's key and send it to
the collector (and write it to S3, the copy the nightly reconciles from, when the collector
does not answer); the run ledger (gearfarm.run.ledger) checks who signed it
(gearfarm.db.registry) and decides what it changes.

A build's or test's log and JUnit file travel in its record when they are small (``files``: the
ledger keeps them with the job's row, so they are durable exactly when the record is, and no PUT
to S3 is on the job's way: docs/speed.md); larger ones are in S3 at the job's keys (s3.keys).

A record must fit its envelope (gearfarm.formats.seal.MAX_ENVELOPE). Its message and log tail are cut to
a bound (bounded); a suite's cases that would not fit travel in S3 beside the record, compressed,
named by a sha256 the record is sealed with (offload_cases), and whoever opens such a record loads
and checks them through load_cases, the one way back: a copy that does not match is a rejected
record, never a record with no cases.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, get_args

import zstandard
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from gearfarm.formats.seal import MAX_ENVELOPE, Lookup, SealError, Signer, canonical, seal, unseal
from gearfarm.formats.words import counted
from gearfarm.s3 import keys

Status = Literal["passed", "failed", "skipped", "timed_out", "no_worker", "infra", "cancelled"]
# What the ledger decided on a record offered to it (gearfarm.run.ledger), which is also what the
# collector answers the worker that sent it: any of them means the results database has the
# record's fate, so the worker needs no S3 copy of it (workers.base.Context._publish).
Disposition = Literal["applied", "duplicate", "superseded", "late", "rejected"]
DISPOSITIONS: frozenset[str] = frozenset(get_args(Disposition))
TERMINAL: frozenset[str] = frozenset({"passed", "failed", "skipped", "timed_out", "no_worker", "infra", "cancelled"})
# What the product did (the job ran to an answer) as opposed to what the farm decided.
PRODUCT: frozenset[str] = frozenset({"passed", "failed", "timed_out"})
# "cancelled": a person stopped the job (gearfarm web); neither the product's result nor a fault.
FARM_MADE: frozenset[str] = frozenset({"skipped", "no_worker", "infra", "cancelled"})
# Statuses that mean the product is broken, as opposed to the farm.
PRODUCT_FAILURES: frozenset[str] = frozenset({"failed", "timed_out"})


class RecordError(ValueError):
    """A result record was malformed, unsigned or forged."""


# A job's files, by the names its keys end in (s3.keys.job_file).
JOB_FILES = ("log.txt", "junit.xml")
# The most of them a record carries, as their zstd bytes in base64, together: with a message and
# log tail at their most (MESSAGE_MAX, LOG_TAIL_MAX) and the cases in S3 (fit), a build's or
# test's record stays under its envelope. A job whose files are larger puts them in S3.
FILES_MAX = 48 * 1024
# What one carried file may decompress to: far above what fits FILES_MAX compressed from a real
# log (a worker tries files up to 16 times the room), a bound on what a reader allocates.
FILE_MAX_BYTES = 16 * 1024 * 1024


def pack_file(data: bytes) -> str:
    """A file's bytes as a record carries them (ResultRecord.files)."""
    return base64.b64encode(zstandard.ZstdCompressor(level=3).compress(data)).decode()


def unpack_file(text: str) -> bytes:
    """A carried file's bytes; ValueError when they are not what pack_file makes."""
    out = bytearray()
    for chunk in _carried(text):
        out += chunk
    return bytes(out)


def _carried(text: str) -> Iterator[bytes]:
    """A carried file's bytes in chunks, read in bounded steps (a frame may claim any size in
    its header, and a few KB may decompress to gigabytes)."""
    try:
        blob = base64.b64decode(text, validate=True)
        size = 0
        with zstandard.ZstdDecompressor().stream_reader(blob) as reader:
            while chunk := reader.read(1 << 20):
                size += len(chunk)
                if size > FILE_MAX_BYTES:
                    raise ValueError(f"it decompresses to more than {FILE_MAX_BYTES} bytes")
                yield chunk
    except (binascii.Error, zstandard.ZstdError) as e:
        raise ValueError(f"not a file as a record carries one (zstd in base64): {e}") from e


def file_sum(path: Path) -> FileSum:
    """The sha256 and size of a file, read in chunks (a log may be 64 MiB)."""
    h, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return FileSum(sha256=h.hexdigest(), size=size)


def check_file(want_sha256: str, want_size: int | None, sha256: str, size: int, name: str, where: str) -> str:
    """"" when a file's bytes found ``where`` (the store, the results database, the copy on disk)
    are those its signed record names (its sha256, and its size when the record gives one), else
    what a reader says in their place. The one wording of the refusal: the dashboard's pages,
    downloads, the report's copies and its problems list say it."""
    if sha256 == want_sha256 and size == (size if want_size is None else want_size):
        return ""
    what = _FILE_WORDS.get(name, name)
    says = f"{want_size} bytes, sha256 {want_sha256[:16]}…" if want_size is not None else f"sha256 {want_sha256[:16]}…"
    return (f"this {what} in the {where} does not match the sha256 its signed record gives ({size} bytes, "
            f"sha256 {sha256[:16]}…; the record says {says}): it was changed after the job; not shown")


_FILE_WORDS = {"log.txt": "log", "junit.xml": "JUnit file", "artifact.tar.zst": "build archive"}


# What replaces a NUL in a record's text (PostgreSQL's text holds none).
NUL_STAND_IN = "\ufffd"


def _storable(value: Any, nested: frozenset[str] = frozenset()) -> Any:
    """``value`` with every NUL in its strings (and its dicts' keys) replaced, leaving alone the
    keys in ``nested`` (models that make their own text storable)."""
    if isinstance(value, str):
        return value.replace("\x00", NUL_STAND_IN) if "\x00" in value else value
    if isinstance(value, dict):
        return {_storable(k): v if k in nested else _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_storable(v) for v in value)
    return value


class _Stored(BaseModel):
    """A part of a record: what it says is what the results database keeps, so it must be what
    the database can keep. The database refused two things a record could say (a NUL in text
    from a project's output; a number that is NaN or infinite, which JSON columns do not hold),
    and the collector, taking its errors for an outage, held such a record for ever, one of its
    threads with it (tests/run/test_ledger.py). A NUL becomes NUL_STAND_IN here, on the worker
    that makes the record as on the ledger that opens it (so both have one digest); a number
    that is not finite makes the record invalid: a worker keeps none (the parsers of a
    project's output drop them), so only a forged one has them."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    NESTED: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _text_storable(cls, data: Any) -> Any:
        return _storable(data, cls.NESTED) if isinstance(data, dict) else data


class CaseResult(_Stored):
    classname: str = ""
    name: str
    status: Literal["passed", "failed", "skipped", "error"]
    time: float = 0.0
    message: str = ""


class Sample(_Stored):
    """One benchmark figure from one repetition."""

    benchmark: str
    metric: str
    value: float
    repetition: int = 0
    # "ratio" is new/baseline of one A/B pair: the paired measure of tonight's change;
    # "ref_ratio" new/reference of the same runs: tonight's build against the pinned reference.
    variant: Literal["new", "baseline", "reference", "ratio", "ref_ratio"] = "new"


class CurveRecord(_Stored):
    """One curve of one benchmark run (gearfarm.formats.catalog.Curve): its lines (split value -> [x, y]
    points, "" without a split), for tonight's build or its baseline."""

    benchmark: str
    title: str
    x: str
    y: str
    variant: Literal["new", "baseline"] = "new"
    # The key whose values split the curve into lines ("threads"), "" when it has one line.
    split_name: str = ""
    lines: dict[str, list[tuple[float, float]]] = Field(default_factory=dict)


class FileSum(_Stored):
    """What a record says one of its job's files is: the sha256 and size of its bytes. Sealed with
    the record, so a copy anywhere (S3, the database, the report's copy on disk) that does not
    match was changed after the job (check_file)."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class ResultRecord(_Stored):
    NESTED = frozenset({"cases", "samples", "curves"})

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
    worker: str = Field(default="", max_length=200)  # the jobs table's column
    host: dict[str, str] = Field(default_factory=dict)
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    # Per-stage seconds: queue_wait (submitted to started), admit (from the job handed over to
    # the worker to its claim answered, while the job is prepared), host_wait (for a benchmark
    # to end: gearfarm.hosts.hostlock), export, build, upload, download, verify, test, cpu.
    timings: dict[str, float] = Field(default_factory=dict)
    artifact_key: str | None = None
    artifact_sha256: str | None = None
    # A build's manifest (keys.manifest beside the archive), by sha256: what a later night's
    # build checks before it reuses the stored artifact (None: not a passed build).
    manifest_sha256: str | None = None
    bytes_uploaded: int = 0
    reused_artifact: bool = False
    log_key: str | None = None
    junit_key: str | None = None
    # The job's files it carries (JOB_FILES name -> pack_file), instead of S3 holding them at
    # log_key and junit_key, which name them either way (Attempt.record chooses).
    files: dict[str, str] = Field(default_factory=dict)
    # Each of those files (JOB_FILES name -> its sha256 and size), carried or in S3: what every
    # reader checks the bytes it found against (check_file). Empty in records from before files
    # were bound to them, whose files are shown as not verified.
    file_sums: dict[str, FileSum] = Field(default_factory=dict)
    message: str = ""
    log_tail: str = ""
    cases: list[CaseResult] = Field(default_factory=list)
    # Cases too many for the envelope are in S3 instead (keys.cases, under the job's own prefix):
    # the object's key, the sha256 of its bytes and how many cases it holds. Sealed with the
    # record, so a copy in S3 that does not match is found out (load_cases). None: in `cases`.
    cases_key: str | None = None
    cases_sha256: str | None = None
    cases_count: int | None = None
    samples: list[Sample] = Field(default_factory=list)
    # Perf jobs: how quiet the host was while they measured (gearfarm.hosts.host.Activity: load,
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
    # What the worker found done to the farm from outside and undid (a build's artifact replaced
    # in S3, moved aside): said loudly in the report and the mail, whatever the job's status.
    alarms: list[str] = Field(default_factory=list)

    @field_validator("files")
    @classmethod
    def _files(cls, files: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(files) - set(JOB_FILES))
        if unknown:
            raise ValueError(f"a record carries only {', '.join(JOB_FILES)}, not {', '.join(unknown)[:200]}")
        size = sum(len(v) for v in files.values())
        if size > FILES_MAX:
            raise ValueError(f"its files are {size} bytes, over the {FILES_MAX} a record carries")
        for name, carried in files.items():
            # Read back once here (counted, not kept), so that whoever keeps them (the ledger)
            # keeps files that read.
            try:
                for _ in _carried(carried):
                    pass
            except ValueError as e:
                raise ValueError(f"its {name} cannot be read: {e}") from e
        return files

    @model_validator(mode="after")
    def _carried_files_match_their_sums(self) -> ResultRecord:
        unknown = sorted(set(self.file_sums) - set(JOB_FILES))
        if unknown:
            raise ValueError(f"a record names the sha256 of {', '.join(JOB_FILES)} only, "
                             f"not {', '.join(unknown)[:200]}")
        for name, carried in self.files.items():
            want = self.file_sums.get(name)
            if want is not None:
                data = unpack_file(carried)
                why = check_file(want.sha256, want.size, hashlib.sha256(data).hexdigest(), len(data), name, "record")
                if why:
                    raise ValueError(why)
        return self

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
        """The record's identity: the same record delivered twice has the same digest. Cases kept
        in S3 count by their sha256, so the record as sealed and as loaded have one digest."""
        body = _body(self)
        if self.cases_key is not None:
            body["cases"] = []
        return hashlib.sha256(canonical(body)).hexdigest()


# Fields only some records have (cases kept in S3, a build's manifest): left out of the body
# when empty, so that every other record is sealed (and digested) byte for byte as before they
# existed.
_OPTIONAL_FIELDS = ("cases_key", "cases_sha256", "cases_count", "manifest_sha256", "file_sums")


def _body(rec: ResultRecord) -> dict[str, Any]:
    body = rec.model_dump(mode="json")
    for name in _OPTIONAL_FIELDS:
        if body[name] is None or body[name] == {}:
            del body[name]
    return body


def seal_record(rec: ResultRecord, signer: Signer | None) -> bytes:
    return seal("result", _body(rec), signer)


def open_record(data: bytes, lookup: Lookup) -> tuple[ResultRecord, str]:
    """A genuine record and the id of the key that signed it (whether that key may sign this
    record is the registry's question: gearfarm.db.registry.Registry.authorize); RecordError
    naming the problem (never a key) otherwise."""
    try:
        body, kid = unseal(data, "result", lookup)
    except SealError as e:
        raise RecordError(str(e)) from e
    try:
        return ResultRecord.model_validate(body), kid
    except ValidationError as e:
        raise RecordError(f"invalid result record: {e.errors()[0]['loc']} {e.errors()[0]['msg']}") from e


def peek_record(data: bytes) -> ResultRecord:
    """The record in an envelope, its signature not checked: for a worker's own spool only (the
    host's key may have been rotated since it sealed it; the ledger checks the signature)."""
    try:
        body = json.loads(data)["body"]
        return ResultRecord.model_validate(body)
    except (ValueError, KeyError, TypeError) as e:
        raise RecordError(f"not a sealed result record: {str(e)[:300]}") from e


# -- records that fit their envelope ------------------------------------------------------------

# The most a record's message and log tail keep, in characters. JSON may spell one character in
# 12 bytes (an escaped surrogate pair), so both together stay under 100 KB of the envelope.
MESSAGE_MAX = 4000
LOG_TAIL_MAX = 4000
# What the cases of one record may decompress to: far above any suite (50,000 cases are ~4 MB),
# a bound on what a reader allocates for a record it has not yet looked into.
CASES_MAX_BYTES = 1024 * 1024 * 1024
# The most cases a suite's record keeps one by one: each costs its worker about 1 KB while the
# record is made, and a results file of tiny cases can hold millions. Past it the rest are
# counted into one case (gearfarm.step.junit.Overflow), failures named, so none is lost.
CASES_MAX = 50_000
CASES_CONTENT_TYPE = "application/zstd"
_CASES = TypeAdapter(list[CaseResult])


class CaseStore(Protocol):
    """Where a record's cases are read from: gearfarm.s3.store.ArtifactStore."""

    def get_bytes(self, key: str) -> bytes: ...


def _cut(text: str, most: int, keep_end: bool = False) -> str:
    if len(text) <= most:
        return text
    note = f"[{len(text) - most} characters cut]"
    return f"{note} ...{text[-most:]}" if keep_end else f"{text[:most]}... {note}"


def bounded(rec: ResultRecord) -> ResultRecord:
    """``rec`` with its message (its start kept) and log tail (its end kept, where a failure is)
    cut to MESSAGE_MAX and LOG_TAIL_MAX characters; the whole log is in S3 (log_key)."""
    message, tail = _cut(rec.message, MESSAGE_MAX), _cut(rec.log_tail, LOG_TAIL_MAX, keep_end=True)
    if message == rec.message and tail == rec.log_tail:
        return rec
    return rec.model_copy(update={"message": message, "log_tail": tail})


def cases_blob(cases: list[CaseResult]) -> bytes:
    """The cases as the S3 object holds them: a JSON list, zstd-compressed."""
    raw = json.dumps([c.model_dump(mode="json") for c in cases], separators=(",", ":")).encode()
    return zstandard.ZstdCompressor(level=9).compress(raw)


def offload_cases(rec: ResultRecord) -> tuple[ResultRecord, bytes]:
    """``rec`` without its cases but naming them in S3, and the object to store at cases_key
    (before the record is published: a reader may open the record at once)."""
    blob = cases_blob(rec.cases)
    sha = hashlib.sha256(blob).hexdigest()
    return rec.model_copy(update={"cases": [], "cases_key": keys.cases(rec.run_id, rec.target, rec.step, sha),
                                  "cases_sha256": sha, "cases_count": len(rec.cases)}), blob


def fit(rec: ResultRecord, signer: Signer | None) -> tuple[ResultRecord, bytes, bytes | None]:
    """What a worker delivers for ``rec``: (the record, sealed, and the cases object to store at
    its cases_key first, or None). Sealed whole when it fits the envelope, else with its cases in
    S3. A record too large even then (a benchmark printing points of thousands of curves) cannot
    be delivered as it is: it is delivered failed, without its samples and curves, saying why."""
    rec = bounded(rec)
    body = seal_record(rec, signer)
    if len(body) <= MAX_ENVELOPE:
        return rec, body, None
    blob = None
    if rec.cases:
        rec, blob = offload_cases(rec)
        body = seal_record(rec, signer)
        if len(body) <= MAX_ENVELOPE:
            return rec, body, blob
    why = (f"the result record is {len(body)} bytes with its cases in S3, over the {MAX_ENVELOPE} bytes a record "
           f"may have: its {len(rec.samples)} samples and {len(rec.curves)} curves are not reported; print fewer "
           f"points (fewer curve lines) or fewer metrics. {rec.message}")
    rec = rec.model_copy(update={"status": "failed", "samples": [], "curves": [], "message": _cut(why, MESSAGE_MAX)})
    body = seal_record(rec, signer)
    if len(body) > MAX_ENVELOPE:
        raise RecordError(f"the result record of {rec.job_id} is {len(body)} bytes even without its cases, samples "
                          f"and curves, over the {MAX_ENVELOPE} bytes a record may have")
    return rec, body, blob


def load_cases(rec: ResultRecord, store: CaseStore | None) -> ResultRecord:
    """``rec`` with its cases: those it carries, or those it keeps in S3, read through ``store``
    and checked against the sha256 and count it was sealed with. RecordError naming the job and
    the problem when they are not there or not the ones it was sealed with (a forged, damaged or
    truncated copy: the record is rejected, never taken as one with no cases); StoreError when S3
    cannot be read now (try again later)."""
    if rec.cases_key is None:
        if rec.cases_sha256 is not None or rec.cases_count is not None:
            raise RecordError(f"record of {rec.job_id}: it has cases_sha256/cases_count but no cases_key")
        return rec
    who = f"record of {rec.job_id} (attempt {rec.attempt})"
    if rec.cases or rec.cases_sha256 is None or rec.cases_count is None:
        raise RecordError(f"{who}: a record keeping its cases in S3 has cases_key, cases_sha256 and cases_count, "
                          "and no cases of its own")
    try:
        own = keys.cases(rec.run_id, rec.target, rec.step, rec.cases_sha256)
    except ValueError as e:
        raise RecordError(f"{who}: cases_sha256 is not a digest ({e})") from e
    if rec.cases_key != own:
        raise RecordError(f"{who}: its cases_key {rec.cases_key[:200]!r} is not this job's ({own})")
    if store is None:
        raise RecordError(f"{who} keeps its {counted(rec.cases_count, 'case')} in S3 ({own}), and no S3 store was "
                          "given to read them: open it with the store of the collector's or the nightly's [s3] keys")
    # Imported here: boto3 is heavy, and most readers of records never need it.
    from botocore.exceptions import ClientError

    from gearfarm.s3.store import StoreError

    try:
        blob = store.get_bytes(own)
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchKey", "404"):
            raise RecordError(f"{who}: its {counted(rec.cases_count, 'case')} are missing from S3 ({own}): the worker "
                              "stores them before it publishes the record, so they were deleted or never "
                              "written") from e
        raise StoreError(f"S3 {own}: {code or e}") from e
    if hashlib.sha256(blob).hexdigest() != rec.cases_sha256:
        raise RecordError(f"{who}: its cases in S3 ({own}, {len(blob)} bytes) do not have the sha256 the record "
                          "was sealed with: forged or damaged")
    try:
        raw = _decompress(blob)
        cases = _CASES.validate_json(raw)
    except (zstandard.ZstdError, ValueError) as e:
        raise RecordError(f"{who}: its cases in S3 ({own}) are not a zstd-compressed JSON list of cases: "
                          f"{str(e)[:300]}") from e
    if len(cases) != rec.cases_count:
        raise RecordError(f"{who}: its cases_count says {counted(rec.cases_count, 'case')}, its cases in S3 "
                          f"({own}) hold {len(cases)}")
    return rec.model_copy(update={"cases": cases})


def _decompress(blob: bytes) -> bytes:
    """The cases' JSON, read in bounded steps: a frame may claim any size in its header."""
    out = bytearray()
    with zstandard.ZstdDecompressor().stream_reader(blob) as reader:
        while chunk := reader.read(1 << 20):
            out += chunk
            if len(out) > CASES_MAX_BYTES:
                raise ValueError(f"they decompress to more than {CASES_MAX_BYTES} bytes")
    return bytes(out)
