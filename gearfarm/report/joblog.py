"""Where a job's files (log.txt, junit.xml) are read: from the results database when its record
carried them (gearfarm.formats.result: a build's or test's small files), else from S3 at the
record's keys; and where they can be read once the farm is gone: the run's directory on disk
keeps a copy of each (state/runs/<run>/logs/<target>/<step>/<name>), made as the job ends
(Copier) or else when the report is published, so the report's links and the dashboard still
work the next morning on the embedded default, whose MinIO stops with the farm. The database
and the store stay the first places to read from when they answer (a lab's keep everything);
the copy is the fallback."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from botocore.exceptions import ClientError
from sqlalchemy.exc import SQLAlchemyError

from gearfarm.db.results import StoredFiles
from gearfarm.formats.job import JobId
from gearfarm.formats.result import JOB_FILES, TERMINAL, ResultRecord, unpack_file
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore, StoreError

log = logging.getLogger(__name__)
# Which of a job's records its files on disk are from: (attempt, finished).
Made = tuple[int, float | None]


class JobFiles(Protocol):
    """Where the files of the jobs' records are (gearfarm.db.results.ResultsDB)."""

    def job_files(self, job_ids: Iterable[str]) -> dict[str, StoredFiles]: ...

    def job_file(self, job_id: str, name: str) -> bytes | None: ...


FILES = JOB_FILES
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


def copy_all(store: ArtifactStore, db: JobFiles, records: list[ResultRecord], runs_dir: Path,
             copied: Mapping[str, Made] | None = None) -> list[str]:
    """Copy every job's files, from the results database where its record carried them, else from
    the store, into its run's directory under ``runs_dir``; the problems, one line each (a file
    the store does not have is not one: a job that never ran has no log). A record whose files
    ``copied`` says are on disk already (Copier.close: the same attempt and finish) is left as it
    is."""
    copied = copied or {}
    wanted = [r for r in records if (r.log_key or r.junit_key) and copied.get(r.job_id) != (r.attempt, r.finished_at)]
    try:
        stored = db.job_files([r.job_id for r in wanted])
    except SQLAlchemyError as e:
        return [f"job files not copied to disk: the results database did not answer ({e})"]
    todo = [(r, name, stored[r.job_id]) for r in wanted if r.job_id in stored for name in FILES]

    def copy(item: tuple[ResultRecord, str, StoredFiles]) -> str:
        r, name, files = item
        return _place(store, files, name, runs_dir / r.run_id / relative(r.target, r.step, name),
                      f"{r.target}/{r.step} {name}")

    with ThreadPoolExecutor(COPIERS, thread_name_prefix="joblog-copy") as pool:
        return [p for p in pool.map(copy, todo) if p]


def _place(store: ArtifactStore, files: StoredFiles, name: str, dest: Path, what: str) -> str:
    """One of a job's files to disk, as its row knows it (carried, or at a key in the store):
    "" when it is there or it has none, else the problem."""
    carried, key = files.carried.get(name), files.keys.get(name)
    if carried is None:
        return _copy(store, key, dest, what) if key else ""
    try:
        data = unpack_file(carried)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(dest)
    except (ValueError, OSError) as e:  # a row changed since it was applied; the disk full or not writable
        return f"{what} not copied to disk: {e}"
    return ""


def _copy(store: ArtifactStore, key: str, dest: Path, what: str) -> str:
    """One file from the store to disk: "" when it is there or the store has none, else the
    problem."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(key, dest)
    except ClientError as e:
        if _code(e) not in ("NoSuchKey", "404"):
            return f"{what} not copied to disk: {e}"
    except (StoreError, OSError) as e:  # the store away; the disk full or not writable
        return f"{what} not copied to disk: {e}"
    return ""


class Copier:
    """Copies a night's job files to disk while it runs, as each job ends (the nightly offers its
    poll's states), so that the report is left with those of the last jobs: at 5,000 jobs the
    10,000 copies took 45 s after the report, between the last job and the nightly's end
    (docs/speed.md). One thread: records end at a few a second, each file one request. What it
    could not copy, or what a later record replaced, the report's copy_all copies."""

    def __init__(self, store: ArtifactStore, db: JobFiles, runs_dir: Path) -> None:
        self.store, self.db, self.runs_dir = store, db, runs_dir
        self.offered: dict[str, str] = {}
        self.made: dict[str, Made] = {}
        self._queue: queue.SimpleQueue[list[str] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def offer(self, states: Mapping[str, str]) -> None:
        """The jobs whose state is now terminal and was not when last offered (a later record may
        end a job again): queued for copying."""
        ended = [j for j, s in states.items() if s in TERMINAL and self.offered.get(j) != s]
        if not ended:
            return
        for j in ended:
            self.offered[j] = states[j]
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="joblog-copier", daemon=True)
            self._thread.start()
        self._queue.put(ended)

    def close(self) -> dict[str, Made]:
        """Stop (what is still queued is left to copy_all) and say which records' files are on
        disk: {job id: (attempt, finished)}."""
        self._stop.set()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        return dict(self.made)

    def _run(self) -> None:
        while not self._stop.is_set():
            ended = self._queue.get()
            if ended is None:
                return
            try:
                files = self.db.job_files(ended)
            except SQLAlchemyError as e:
                log.info("job files not copied while the night runs (%s); the report copies them", e)
                continue
            for job_id, stored in files.items():
                if self._stop.is_set():
                    return
                jid = JobId.parse(job_id)
                problems = [_place(self.store, stored, name,
                                   self.runs_dir / jid.run_id / relative(jid.target, jid.step, name),
                                   f"{jid.target}/{jid.step} {name}") for name in FILES]
                if not any(problems):
                    self.made[job_id] = stored.made


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def stream(db: JobFiles | None, store: ArtifactStore | None, run_dir: Path, run_id: str, target: str, step: str,
           name: str = "log.txt") -> Iterator[bytes] | None:
    """The file's bytes in chunks: from the results database when the job's record carried it,
    else from the store when it has it, else from the copy on disk; None when none has it."""
    if name not in FILES:
        raise ValueError(f"{name!r} is not a job file ({', '.join(FILES)})")
    key = keys.job_file(run_id, target, step, name)  # ValueError for a name that is not a safe component
    if db is not None:
        try:
            carried = db.job_file(str(JobId(run_id, target, step)), name)
        except SQLAlchemyError as e:
            log.info("%s not read from the results database (%s); trying the store", key, e)
        else:
            if carried is not None:
                return iter([carried])
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
