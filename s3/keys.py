"""The one definition of the farm's S3 key layout.

artifacts/<rev>/<target>/<toolchain>/artifact.tar.zst  the packed build outputs + manifest
artifacts/<rev>/<target>/<toolchain>/manifest.json     the manifest alone (read before download)
artifacts/<rev>/<target>/<toolchain>/provenance.intoto.json   its signed provenance (gearfarm.formats.provenance)
sources/<rev>/source.tar.zst                            the tree at a commit (the nightly uploads it once)
sources/<rev>/manifest.json                            its sha256 and size
catalogs/<sha256>.toml                                 a catalog the nightly validated, by content
projects/<project>/latest.json                         the project's newest catalog (worker probing)
runs/<run>/<target>/<step>/files/<sha256>/log.txt | junit.xml   a job's files, when too large for its record to carry
runs/<run>/<target>/<step>/results/<attempt>-<digest>.json   one sealed result record each
runs/<run>/<target>/<step>/cases/<sha256>.json.zst          a record's cases, when too many for the record
cancels/<run>/run.json | cancels/<run>/<target>/<step>.json   a person cancelled the run / the job (a marker)
quarantine/<UTC time>/artifacts/...                    a build's objects found replaced in S3, moved aside for a look
runs/<run>/report.json | report.html
"""

from __future__ import annotations

import hashlib
import re
import time

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:#-]*$")


def part(value: str) -> str:
    """A key component (a run id, target, step...) as it is, or ValueError when it could
    escape its place in a key."""
    if not _SAFE.match(value) or ".." in value:
        raise ValueError(f"unsafe S3 key component {value!r}")
    return value


def toolchain_id(compiler_version: str, flags: str) -> str:
    """Artifacts built by different compilers or flags never share a key."""
    return hashlib.sha256(f"{compiler_version}\n{flags}".encode()).hexdigest()[:16]


def artifact_prefix(rev: str, target: str, toolchain: str) -> str:
    return f"artifacts/{part(rev)}/{part(target)}/{part(toolchain)}"


def artifact(rev: str, target: str, toolchain: str) -> str:
    return f"{artifact_prefix(rev, target, toolchain)}/artifact.tar.zst"


def manifest(rev: str, target: str, toolchain: str) -> str:
    return f"{artifact_prefix(rev, target, toolchain)}/manifest.json"


def provenance(rev: str, target: str, toolchain: str) -> str:
    """The build's signed provenance (an in-toto DSSE envelope), beside the archive it names."""
    return f"{artifact_prefix(rev, target, toolchain)}/provenance.intoto.json"


def provenance_of(artifact_key: str) -> str:
    """The provenance beside an archive key (keys.artifact's)."""
    prefix, _, name = artifact_key.rpartition("/")
    if name != "artifact.tar.zst" or not prefix.startswith("artifacts/"):
        raise ValueError(f"{artifact_key[:200]!r} is not an artifact key")
    return f"{prefix}/provenance.intoto.json"


def quarantine(key: str, at: float) -> str:
    """Where an artifact's object found replaced outside the farm is kept for a look: its key
    under ``quarantine/`` and the UTC time it was moved (its second; a clash is a new copy of the
    same object, which the move then overwrites)."""
    if not key.startswith("artifacts/"):
        raise ValueError(f"{key[:200]!r} is not an artifact's object")
    for piece in key.split("/"):
        part(piece)
    return f"quarantine/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(at))}/{key}"


def source(rev: str) -> str:
    """Content-addressed by the commit: a tree at a commit never changes, so one upload serves
    every later nightly of that revision."""
    return f"sources/{part(rev)}/source.tar.zst"


def source_manifest(rev: str) -> str:
    return f"sources/{part(rev)}/manifest.json"


def catalog(sha256: str) -> str:
    return f"catalogs/{part(sha256)}.toml"


def project_latest(project: str) -> str:
    return f"projects/{part(project)}/latest.json"


def job_file(run_id: str, target: str, step: str, name: str, sha256: str | None = None) -> str:
    """Where a job's file is in S3, by the sha256 of its bytes, which its record gives
    (gearfarm.formats.result.FileSum): two attempts of a job (one taken over while the other
    still ran) never write one key, and no key of a file is known before the file is. Without
    ``sha256``: the key records from before files were named by content give (read, never
    written: no role may write there)."""
    own = f"runs/{part(run_id)}/{part(target)}/{part(step)}/"
    if sha256 is None:
        return own + part(name)
    return f"{own}files/{_sha256(sha256, 'file')}/{part(name)}"


def _sha256(value: str, what: str) -> str:
    if len(value) != 64 or value.strip("0123456789abcdef"):
        raise ValueError(f"{what} digest {value[:80]!r} is not a sha256 (64 hex digits)")
    return value


def result(run_id: str, target: str, step: str, attempt: int, digest: str) -> str:
    """One key per record, never overwritten: every attempt's record stays for reconcile,
    and the ledger, not the last write, decides which one counts."""
    return f"{results_of(run_id, target, step, attempt)}{part(digest[:16])}.json"


def results_of(run_id: str, target: str, step: str, attempt: int) -> str:
    """The prefix of every record one attempt of a job delivered."""
    return f"{job_results(run_id, target, step)}{int(attempt)}-"


def job_results(run_id: str, target: str, step: str) -> str:
    """The prefix of every record of every attempt of a job."""
    return f"runs/{part(run_id)}/{part(target)}/{part(step)}/results/"


def cases(run_id: str, target: str, step: str, sha256: str) -> str:
    """A result record's test cases when they would make it too large (gearfarm.formats.result.offload_cases):
    under the job's own prefix, which its role may write and the collector may read (ROLE_WRITES,
    ROLE_READS); named by the sha256 of the object, which the record is sealed with."""
    return f"runs/{part(run_id)}/{part(target)}/{part(step)}/cases/{_sha256(sha256, 'cases')}.json.zst"


def is_result(key: str) -> bool:
    return "/results/" in key and key.endswith(".json")


def run_prefix(run_id: str) -> str:
    return f"runs/{part(run_id)}/"


def report(run_id: str, ext: str) -> str:
    return f"runs/{part(run_id)}/report.{part(ext)}"


def cancel(run_id: str, target: str | None = None, step: str | None = None) -> str:
    """The marker that a run (or one of its jobs) was cancelled: workers drop a queued job
    that has one and stop a running one (gearfarm.workers.base). Outside runs/, where no worker
    role may write (ROLE_WRITES' patterns span '/': under a job's own prefix, its role could
    cancel any job of that kind). Retention prunes them with their run."""
    if target is None or step is None:
        return f"{cancels(run_id)}run.json"
    return f"{cancels(run_id)}{part(target)}/{part(step)}.json"


def cancels(run_id: str) -> str:
    """The prefix of a run's cancel markers, the run's and its jobs': one LIST shows them all."""
    return f"cancels/{part(run_id)}/"


# -- who may touch what: each worker role's MinIO user gets exactly this (s3/minio.py) ----

def _job_keys(step: str, *names: str) -> tuple[str, ...]:
    """The keys a job of steps ``step`` writes under its own prefix: its files by content and name
    (job_file), its sealed records (result) and, for a suite, its offloaded cases (cases)."""
    own = f"runs/*/{{target}}/{step}/"
    return (*(f"{own}files/*/{n}" for n in names), own + "results/*.json",
            *((own + "cases/*.json.zst",) if step.startswith("test") else ()))


# The objects of one build, as a role pattern.
ARTIFACT_FILES = ("artifacts/*/{target}/*/artifact.tar.zst", "artifacts/*/{target}/*/manifest.json",
                  "artifacts/*/{target}/*/provenance.intoto.json")


# Object patterns under the bucket, {target} being each target a user serves ('*' for all). Each
# names whole keys of the layout above, one key kind a pattern, and role_policy denies any key in
# which a '*' (which in IAM matches '/' too) would stand for more than one component: so a role
# writes only its own kind of key, of its own targets, at the place the layout gives it. Every
# worker role reads the whole bucket (sources, catalogs, artifacts, the nightly's markers); only
# builds write artifacts. The collector takes results over Gearman and may read the runs' files.
# The nightly and the dashboard use the farm's own [s3] keys. Which run a key is of, no static
# policy can know: a test host can write the files of its targets' test jobs of any run, and
# what makes that harmless is the sha256 each record gives its files (docs/security.md, "Files
# in S3").
ROLE_WRITES: dict[str, tuple[str, ...]] = {
    # A build moves an artifact's objects it finds replaced aside (quarantine: a copy, then a
    # delete) and stores its own in their place: a host that may write an artifact's keys may as
    # well move what stands there.
    "build": (*ARTIFACT_FILES, *_job_keys("build", "log.txt")),
    "test": _job_keys("test-*", "log.txt", "junit.xml"),
    "perf": _job_keys("perf-*", "log.txt"),
    "collector": (),
}
# What a role writes whatever the targets it serves: a build's objects moved aside (one pattern,
# not one a target: a policy holds 20 KiB in MinIO, and a host of forty targets must fit).
ROLE_WRITES_ANY: dict[str, tuple[str, ...]] = {"build": tuple(f"quarantine/*/{a.format(target='*')}"
                                                              for a in ARTIFACT_FILES)}
ROLE_DELETES: dict[str, tuple[str, ...]] = {"build": ("artifacts/*/{target}/*/*",)}
ROLE_READS: dict[str, tuple[str, ...]] = {"build": ("*",), "test": ("*",), "perf": ("*",), "collector": ("runs/*",)}
ALL_TARGETS = ("*",)


def role_policy(bucket: str, role: str, targets: tuple[str, ...] = ALL_TARGETS) -> dict[str, object]:
    """The S3 policy (IAM JSON) of ``role``'s MinIO user on ``bucket``, for hosts that serve
    ``targets``: a host's user cannot write another target's artifacts or files."""
    if role not in ROLE_WRITES:
        raise ValueError(f"no S3 policy for role {role!r}; roles: {', '.join(ROLE_WRITES)}")
    targets = tuple(t if t == "*" else part(t) for t in targets) or ALL_TARGETS
    arn = f"arn:aws:s3:::{bucket}"
    statements: list[dict[str, object]] = [
        # Listing is needed for a missing key to answer 404 rather than 403.
        {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"], "Resource": [arn]},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"{arn}/{p}" for p in ROLE_READS[role]]},
    ]
    if ROLE_WRITES[role]:
        writes = [*(p.format(target=t) for p in ROLE_WRITES[role] for t in targets), *ROLE_WRITES_ANY.get(role, ())]
        statements.append({"Effect": "Allow", "Action": ["s3:PutObject", "s3:AbortMultipartUpload",
                                                           "s3:ListMultipartUploadParts"],
                           "Resource": [f"{arn}/{p}" for p in writes]})
    if ROLE_DELETES.get(role):
        statements.append({"Effect": "Allow", "Action": ["s3:DeleteObject"],
                           "Resource": [f"{arn}/{p.format(target=t)}" for p in ROLE_DELETES[role] for t in targets]})
    if ROLE_WRITES[role]:
        # A Deny wins over any Allow: the keys that match a write (or delete) pattern only through
        # a '*' standing for several components (runs/R/T/build/results/T/test-x.json). (A '*'
        # standing for nothing makes an empty component, which MinIO refuses in any key.) Made from
        # the patterns of every target, once: a policy holds 20 KiB in MinIO, whatever a host serves.
        denied = dict.fromkeys(d for p in (*ROLE_WRITES[role], *ROLE_WRITES_ANY.get(role, ()),
                                           *ROLE_DELETES.get(role, ()))
                               for d in spanning(p.format(target="*")))
        statements.append({"Effect": "Deny", "Action": ["s3:PutObject", "s3:DeleteObject"],
                           "Resource": [f"{arn}/{d}" for d in denied]})
    return {"Version": "2012-10-17", "Statement": statements}


def spanning(pattern: str) -> list[str]:
    """The patterns of the keys that match ``pattern`` only when one of its '*' takes in a '/':
    each '*' in turn made '*/*'. A key of the layout has exactly as many '/' as the pattern of its
    kind, so it matches none of these; a key with more matches one."""
    at = [i for i, c in enumerate(pattern) if c == "*"]
    return [f"{pattern[:i]}*/*{pattern[i + 1:]}" for i in at]
