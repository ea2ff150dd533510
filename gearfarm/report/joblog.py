"""Where a job's files (log.txt, junit.xml) can be read once the farm is gone: the run's
directory on disk keeps a copy of each (state/runs/<run>/logs/<target>/<step>/<name>), made when
the report is published, so the report's links and the dashboard still work the next morning
on the embedded default, whose MinIO stops with the farm. The store stays the first place to
read from when it answers (a lab's MinIO keeps everything); the copy is the fallback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from botocore.exceptions import ClientError

from gearfarm.formats.result import ResultRecord
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore, StoreError

log = logging.getLogger(__name__)

FILES = ("log.txt", "junit.xml")
CHUNK = 64 * 1024


def relative(target: str, step: str, name: str = "log.txt") -> str:
    """The copy's path relative to its run's directory."""
    keys.job_file("r", target, step, name)  # the same components the S3 layout accepts, no more
    return f"logs/{target}/{step}/{name}"


def link(rec: ResultRecord, run_id: str, name: str = "log.txt") -> str:
    """The copy of ``rec``'s file as linked from run ``run_id``'s directory: its own run's
    directory is a sibling when it is another run's (a re-run's records in its parent's report)."""
    path = relative(rec.target, rec.step, name)
    return path if rec.run_id == run_id else f"../{rec.run_id}/{path}"


# Files copied at once: a 5,000-job night has 10,000, and each copy waits a round trip on the
# store, which for a lab's MinIO is another host. (With MinIO on the same 2 cores, boto3's CPU,
# ~4 ms a request, is the cost and overlapping gains little: docs/speed.md, "At scale".)
COPIERS = 8


def copy_all(store: ArtifactStore, records: list[ResultRecord], runs_dir: Path) -> list[str]:
    """Copy every job's files from the store into its run's directory under ``runs_dir``; the
    problems, one line each (a file the store does not have is not one: a job that never ran
    has no log)."""
    todo = [(r, name, key) for r in records for name, key in (("log.txt", r.log_key), ("junit.xml", r.junit_key))
            if key]

    def copy(item: tuple[ResultRecord, str, str]) -> str:
        r, name, key = item
        dest = runs_dir / r.run_id / relative(r.target, r.step, name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            store.get_file(key, dest)
        except ClientError as e:
            if _code(e) not in ("NoSuchKey", "404"):
                return f"{r.target}/{r.step} {name} not copied to disk: {e}"
        except StoreError as e:
            return f"{r.target}/{r.step} {name} not copied to disk: {e}"
        return ""

    with ThreadPoolExecutor(COPIERS, thread_name_prefix="joblog-copy") as pool:
        return [p for p in pool.map(copy, todo) if p]


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def stream(store: ArtifactStore | None, run_dir: Path, run_id: str, target: str, step: str,
           name: str = "log.txt") -> Iterator[bytes] | None:
    """The file's bytes in chunks, from the store when it has them, else from the copy on
    disk; None when neither has it."""
    if name not in FILES:
        raise ValueError(f"{name!r} is not a job file ({', '.join(FILES)})")
    key = keys.job_file(run_id, target, step, name)  # ValueError for a name that is not a safe component
    if store is not None:
        try:
            return store.stream(key, CHUNK)
        except StoreError as e:
            log.info("%s not read from the store (%s); trying the copy on disk", key, e)
    path = run_dir / relative(target, step, name)
    if not path.is_file():
        return None
    return _read(path)


def _read(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk
