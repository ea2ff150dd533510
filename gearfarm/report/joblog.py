"""Where a job's files (log.txt, junit.xml) are read: from the results database when its record
carried them (gearfarm.formats.result: a build's or test's small files), else from S3 at the
record's keys; and where they can be read once the farm is gone: the run's directory on disk
keeps a copy of each (state/runs/<run>/logs/<target>/<step>/<name>), made as the job ends
(Copier) or else when the report is published, so the report's links and the dashboard still
work the next morning on the embedded default, whose MinIO stops with the farm. The database
and the store stay the first places to read from when they answer (a lab's keep everything);
the copy is the fallback.

Wherever a file is read from, its bytes are checked against the sha256 and size its signed record
gives (ResultRecord.file_sums): a worker role's S3 keys can write its role's keys of every run
(docs/security.md, "Files in S3"), so a file that does not match is refused, saying so (Altered;
the copy on disk holds that sentence instead), and never served as the job's."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from botocore.exceptions import ClientError
from sqlalchemy.exc import SQLAlchemyError

from gearfarm.db.results import StoredFiles
from gearfarm.formats.job import JobId
from gearfarm.formats.result import JOB_FILES, TERMINAL, FileSum, ResultRecord, check_file, file_sum, unpack_file
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
# A file being checked is held in memory up to this size, on disk beyond (a log may be 64 MiB).
SPOOL_IN_MEMORY = 4 * 1024 * 1024


class Altered(Exception):
    """A job's file found in the store, the results database or the copy on disk is not the one
    its signed record names: the message says where and that it is not shown."""


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
        return _place(store, files, JobId(r.run_id, r.target, r.step), name,
                      runs_dir / r.run_id / relative(r.target, r.step, name), f"{r.target}/{r.step} {name}")

    with ThreadPoolExecutor(COPIERS, thread_name_prefix="joblog-copy") as pool:
        return [p for p in pool.map(copy, todo) if p]


def _place(store: ArtifactStore, files: StoredFiles, jid: JobId, name: str, dest: Path, what: str) -> str:
    """One of a job's files to disk, as its row knows it (carried, or at a key in the store),
    checked against its record: "" when it is there or it has none, else the problem. A file that
    does not match its record is not copied: the copy says so instead, where the report links."""
    carried, key, want = files.carried.get(name), _named(files, name, jid), files.sums.get(name)
    if carried is None:
        return _copy(store, key, want, name, dest, what) if key else ""
    try:
        data = unpack_file(carried)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp")
        tmp.write_bytes(data)
        why = "" if want is None else check_file(want.sha256, want.size, hashlib.sha256(data).hexdigest(),
                                                  len(data), name, "results database")
        return _keep(tmp, dest, why, what)
    except (ValueError, OSError) as e:  # a row changed since it was applied; the disk full or not writable
        return f"{what} not copied to disk: {e}"


def _copy(store: ArtifactStore, key: str, want: FileSum | None, name: str, dest: Path, what: str) -> str:
    """One file from the store to disk, checked against its record: "" when it is there or the
    store has none, else the problem."""
    tmp = dest.with_name(f".{dest.name}.get")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(key, tmp)
        got = file_sum(tmp) if want is not None else None
        return _keep(tmp, dest, "" if got is None or want is None else
                     check_file(want.sha256, want.size, got.sha256, got.size, name, "store"), what)
    except ClientError as e:
        if _code(e) not in ("NoSuchKey", "404"):
            return f"{what} not copied to disk: {e}"
    except (StoreError, OSError) as e:  # the store away; the disk full or not writable
        return f"{what} not copied to disk: {e}"
    finally:
        with contextlib.suppress(OSError):  # gone once kept; its directory perhaps not one
            tmp.unlink(missing_ok=True)
    return ""


def _keep(tmp: Path, dest: Path, why: str, what: str) -> str:
    """``tmp`` becomes the copy at ``dest`` when it is the job's (``why`` empty); otherwise the
    copy is the refusal, so whoever follows the report's link reads why there is no log."""
    if why:
        tmp.write_text(f"gearfarm: {why}\n")
    tmp.replace(dest)
    return f"{what} not copied to disk: {why}" if why else ""


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
                problems = [_place(self.store, stored, jid, name,
                                   self.runs_dir / jid.run_id / relative(jid.target, jid.step, name),
                                   f"{jid.target}/{jid.step} {name}") for name in FILES]
                if not any(problems):
                    self.made[job_id] = stored.made


def _named(files: StoredFiles, name: str, jid: JobId) -> str | None:
    """The key in the store where the job's record says its file ``name`` is: the one the layout
    gives it (by the sha256 the record gives, or the key of records from before files were named
    by content), else None (a record names another key only when its signer chose to point
    elsewhere: logged, and not read)."""
    key = files.keys.get(name)
    if not key:
        return None
    want = files.sums.get(name)
    own = {keys.job_file(jid.run_id, jid.target, jid.step, name)}
    if want is not None:
        own.add(keys.job_file(jid.run_id, jid.target, jid.step, name, want.sha256))
    if key not in own:
        log.error("the record of %s names %s for its %s, not a key of the job's: not read", jid, key[:200], name)
        return None
    return key


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def stream(db: JobFiles | None, store: ArtifactStore | None, run_dir: Path, run_id: str, target: str, step: str,
           name: str = "log.txt") -> Iterator[bytes] | None:
    """The file's bytes in chunks, checked against the sha256 and size the job's record gives:
    from the results database when the record carried it, else from the store when the record
    names it there, else from the copy on disk; None when none has it, Altered when the one found
    is not the record's (it is not read further, and not from elsewhere: a person must learn that
    it was changed). A record from before files were bound to records names no sha256: its file
    is shown as found."""
    if name not in FILES:
        raise ValueError(f"{name!r} is not a job file ({', '.join(FILES)})")
    key = keys.job_file(run_id, target, step, name)  # ValueError for a name that is not a safe component
    job = JobId(run_id, target, step)
    jid = str(job)
    files: StoredFiles | None = None
    if db is not None:
        try:
            files = db.job_files([jid]).get(jid)
        except SQLAlchemyError as e:
            log.info("%s not read from the results database (%s); trying the store", key, e)
    want = files.sums.get(name) if files is not None else None
    if files is not None and name in files.carried:
        try:
            data = unpack_file(files.carried[name])
        except ValueError as e:
            # Checked when the record was applied: the row was changed since. Said, and then the
            # file is looked for where else it may be.
            log.error("the %s of %s in the results database cannot be read: %s", name, jid, e)
        else:
            return _checked(iter([data]), want, name, "results database")
    # Only a file a record names is read from the store: anyone with a worker role's keys can
    # put one where no record does.
    named = _named(files, name, job) if files is not None else key if db is None else None
    if store is not None and named:
        try:
            return _checked(store.stream(named, CHUNK), want, name, "store")
        except StoreError as e:
            log.info("%s not read from the store (%s); trying the copy on disk", key, e)
    path = run_dir / relative(target, step, name)
    if not path.is_file():
        return None
    return _checked(_read(path), want, name, "copy on disk")


def _checked(chunks: Iterator[bytes], want: FileSum | None, name: str, where: str) -> Iterator[bytes]:
    """``chunks`` checked against ``want`` (checked), or as they come when there is nothing to
    check them against."""
    return chunks if want is None else checked(chunks, want.sha256, want.size, name, where)


def checked(chunks: Iterator[bytes], sha256: str, size: int | None, name: str, where: str) -> Iterator[bytes]:
    """``chunks`` once they are all read and have this sha256 (and size, when given), else
    Altered saying so (formats.result.check_file). Held in a spool meanwhile, in memory up to
    SPOOL_IN_MEMORY and on disk beyond; reading stops at the first byte past ``size``."""
    h, got = hashlib.sha256(), 0
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115 - handed to _replay
    try:
        for chunk in chunks:
            h.update(chunk)
            got += len(chunk)
            if size is not None and got > size:
                break
            spool.write(chunk)
    except BaseException:
        spool.close()
        raise
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    why = check_file(sha256, size, h.hexdigest(), got, name, where)
    if why:
        spool.close()
        raise Altered(why)
    spool.seek(0)
    return _replay(spool)


def _replay(spool: tempfile.SpooledTemporaryFile[bytes]) -> Iterator[bytes]:
    with spool:
        while chunk := spool.read(CHUNK):
            yield chunk


def _read(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk
