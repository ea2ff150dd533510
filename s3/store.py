"""The artifact store on S3-compatible storage (MinIO) through boto3.

Every call retries with backoff (botocore's standard mode plus our own outer loop), because an
outage of minutes must delay a job, never fail or lose it. The put-if-absent calls let concurrent
writers of one key agree on a single object: the first PUT wins and later ones learn it exists.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import boto3
import botocore.session
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, SSLError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.utils import determine_content_length, parse_timestamp

from gearfarm.s3.settings import S3Config

log = logging.getLogger(__name__)
T = TypeVar("T")
S3Client = Any  # boto3's client class is made at run time

# The endpoint did not answer: refused, timed out, or dropped the connection (EndpointConnection-,
# ConnectTimeout-, ConnectionClosed-, ReadTimeoutError...). SSLError is a ConnectionError too,
# but is caught before these: a certificate the CA does not vouch for is not an outage.
_UNREACHABLE = (BotoConnectionError, HTTPClientError)
# Guards making clients (boto3's default session is not safe to make them from in parallel) and
# the switch to another endpoint.
_MAKING = threading.RLock()

_SESSION: boto3.session.Session | None = None


def _timestamp(text: str) -> datetime.datetime:
    """A response's timestamp. A listing's are ISO 8601, which the standard library reads in a
    microsecond; botocore's own parser (dateutil's) took 0.3 ms each, and a nightly's look at a
    5,000-job run's 15,000 objects spent most of its CPU in it (docs/speed.md). Headers'
    (RFC 1123 dates) and anything else still go to botocore's parser."""
    try:
        got = datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return parse_timestamp(text)
    return got if got.tzinfo is not None else got.replace(tzinfo=datetime.UTC)


def _session() -> boto3.session.Session:
    """The process's boto3 session, its response parsers reading timestamps with _timestamp
    (set before any client is made: a client's parser is made with it)."""
    global _SESSION
    with _MAKING:
        if _SESSION is None:
            core = botocore.session.get_session()
            core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=_timestamp)
            _SESSION = boto3.session.Session(botocore_session=core)
        return _SESSION


# S3's limit for one PUT, and for one part of a multipart upload.
MAX_SINGLE_PUT = 5 * 1024**3
# Objects of at least two parts go up and down in parts of this size, PARALLEL at a time, like
# `mc cp` (16 MiB parts). One PUT over plain HTTP is read twice, once for SigV4's payload hash
# and once to send; in parts the hashing and sending of one part overlap those of the others
# (measured in bench/farm_speed.py, transfer: 100 MiB in one PUT went up at 0.84× mc's speed).
PART_SIZE = 16 * 1024**2
PARALLEL = 4
# A PUT of a body up to this size goes without "Expect: 100-continue" (_without_100_continue).
INLINE_PUT = 1024**2
MAX_PARTS = 10_000  # S3's limit per multipart upload
# What S3 (and MinIO) answer a conditional PUT with: the key exists / a concurrent conditional
# write of the key is in flight.
_EXISTS = ("PreconditionFailed", 412)
_CONFLICT = ("ConditionalRequestConflict", 409)


class StoreError(RuntimeError):
    """S3 could not be reached or refused a request, after retries."""


def _without_100_continue(request: Any, **_: Any) -> None:
    """botocore sends every S3 PUT with "Expect: 100-continue" (bytes too: it makes them a file
    object first) and waits for the server's interim answer before the body, a round trip more
    on every PUT. A job puts its log, its JUnit file and its record's copy: py-spy on a slot at
    one host had the log's PUT at 8.7 ms a job, a quarter of it that wait. Up to INLINE_PUT the
    body goes with the headers; a larger one still waits, which is nothing beside its sending
    and saves sending it to a server that refuses it."""
    size = determine_content_length(request.body)
    if size is not None and size <= INLINE_PUT and "Expect" in request.headers:
        del request.headers["Expect"]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _FilePart(io.RawIOBase):
    """One part of a file as the body of an upload_part: read from disk as botocore hashes and
    sends it, never held whole. A worker uploading a 64 MiB JUnit held PARALLEL parts of
    PART_SIZE in memory (and botocore a copy of each) when parts were read in as bytes. Written
    here because neither boto3 nor io has a file window that botocore sizes by len() (given a
    fileno(), botocore would size the body by the whole file)."""

    def __init__(self, path: Path, offset: int, length: int) -> None:
        super().__init__()
        self._f = path.open("rb", buffering=0)
        self._start, self._length, self._pos = offset, length, 0

    def __len__(self) -> int:
        return self._length

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, min(self._length, base + pos))
        return self._pos

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self._length - self._pos)
        if n <= 0:
            return 0
        got = os.preadv(self._f.fileno(), [memoryview(buf)[:n]], self._start + self._pos)
        self._pos += got
        return got

    def close(self) -> None:
        self._f.close()
        super().close()


class ArtifactStore:
    def __init__(self, cfg: S3Config, retry_for: float = 300.0, attempts: int = 3) -> None:
        """``retry_for`` seconds of outage are waited out; a reader that has somewhere else to
        look (the dashboard, with the copies on disk) passes 0 and ``attempts`` 1. Either way
        every endpoint of [s3] is tried once before anything is waited for."""
        self.cfg = cfg
        self.bucket = cfg.bucket
        self.retry_for = retry_for
        self.endpoints = cfg.endpoint_list()
        # botocore's retries after the first try (its max_attempts counts only those). With
        # another node to go to, one that does not answer is left at once rather than asked
        # again after botocore's backoff: retrying is then only the outer loop's, per round.
        self.retries = attempts if len(self.endpoints) == 1 else 0
        self._clients: dict[str, S3Client] = {}
        # The client calls go through, and its endpoint; the next endpoint's client is made only
        # when this one fails (each costs ~50 ms, and most stores never need a second).
        self.endpoint = self.endpoints[0]
        self.s3 = self._client(self.endpoint)

    def _client(self, endpoint: str) -> S3Client:
        with _MAKING:
            if endpoint not in self._clients:
                cfg = self.cfg
                # Path-style + s3v4 + checksums only when required: what MinIO accepts with
                # current boto3 (measured; without s3v4, presigned URLs come out as SigV2).
                self._clients[endpoint] = _session().client(
                    "s3",
                    endpoint_url=endpoint,
                    aws_access_key_id=cfg.access_key,
                    aws_secret_access_key=cfg.secret_key,
                    region_name=cfg.region,
                    verify=cfg.ca_bundle if cfg.ca_bundle else None,
                    config=BotoConfig(
                        signature_version="s3v4",
                        s3={"addressing_style": "path"},
                        request_checksum_calculation="when_required",
                        response_checksum_validation="when_required",
                        retries={"mode": "standard", "max_attempts": self.retries},
                        connect_timeout=5,
                        read_timeout=60,
                    ),
                )
                self._clients[endpoint].meta.events.register("before-sign.s3.PutObject", _without_100_continue)
            return self._clients[endpoint]

    def _fail_over(self, at: str, failed: list[str], err: Exception) -> bool:
        """After ``err`` from endpoint ``at``, go on at the next one (in [s3] order, wrapping
        around) that has not failed in this round; False when every endpoint has."""
        if at not in failed:
            failed.append(at)
        with _MAKING:
            if self.endpoint not in failed:
                return True  # another thread of this store has moved on already
            i = self.endpoints.index(at)
            for nxt in self.endpoints[i + 1:] + self.endpoints[:i + 1]:
                if nxt not in failed:
                    log.warning("S3 endpoint %s does not answer (%s); going on at %s", at, err, nxt)
                    self.s3, self.endpoint = self._client(nxt), nxt
                    return True
        return False

    def _where(self, failed: list[str]) -> str:
        """The endpoints a failure is about: every one tried, else the one in use."""
        return ", ".join(failed) if len(failed) > 1 else self.endpoint

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.retry_for
        delay = 0.5
        failed: list[str] = []  # endpoints that did not answer in this round
        while True:
            at = self.endpoint
            try:
                return fn()
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                # A refusal is an answer, not an outage: retrying cannot change it.
                if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden"):
                    raise StoreError(
                        f"S3 at {at} refused to {what} for access key {self.cfg.access_key!r} "
                        f"({code}): a worker role's user may do only what the role does "
                        "(gearfarm.s3.keys.ROLE_WRITES); otherwise check the keys in the config") from e
                # Nor is a missing key or a failed precondition, which callers look for.
                if code in ("NoSuchKey", "404", "NoSuchBucket", "PreconditionFailed", "412"):
                    raise
                err: Exception = e
            except SSLError as e:
                # A certificate problem does not heal by waiting, nor by another node of the
                # same storage with the same CA: say so now, not in 5 minutes.
                raise StoreError(f"S3 at {at}: TLS verification failed ({e}); check [s3] "
                                 "ca_bundle") from e
            except _UNREACHABLE as e:
                # This node is away; another node of the same storage may not be.
                if self._fail_over(at, failed, e):
                    continue
                err = e
            except BotoCoreError as e:
                err = e
            if time.monotonic() + delay > deadline:
                raise StoreError(f"S3 at {self._where(failed)}: {what} failed: {err}") from err
            log.warning("S3 %s failed at %s (%s); retrying in %.1fs", what, self._where(failed), err, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
            failed = []

    def check(self) -> None:
        """Fail fast, naming the endpoints, when S3 is unreachable or the bucket is missing:
        every endpoint is tried once, without waiting."""
        failed: list[str] = []
        while True:
            at = self.endpoint
            try:
                self.s3.head_bucket(Bucket=self.bucket)
                return
            except ClientError as e:
                raise StoreError(
                    f"S3 at {at}: bucket {self.bucket!r} is not usable: {e}; "
                    "create it or fix [s3] in the config"
                ) from e
            except _UNREACHABLE as e:
                if not self._fail_over(at, failed, e):
                    raise StoreError(f"S3 endpoint {self._where(failed)} is unreachable: {e}") from e
            except BotoCoreError as e:
                raise StoreError(f"S3 endpoint {at} is unreachable: {e}") from e

    def ensure_bucket(self) -> None:
        def make() -> None:
            try:
                self.s3.head_bucket(Bucket=self.bucket)
            except ClientError:
                self.s3.create_bucket(Bucket=self.bucket)

        self._retry("create bucket", make)

    def exists(self, key: str) -> bool:
        def head() -> bool:
            try:
                self.s3.head_object(Bucket=self.bucket, Key=key)
                return True
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise

        return self._retry(f"head {key}", head)

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> int:
        self._retry(f"put {key}", lambda: self.s3.put_object(
            Bucket=self.bucket, Key=key, Body=data, ContentType=content_type))
        return len(data)

    def put_file(self, key: str, path: Path, content_type: str = "application/octet-stream") -> int:
        size = path.stat().st_size
        if size >= 2 * PART_SIZE:
            self._retry(f"upload {key}", lambda: self.s3.upload_file(
                str(path), self.bucket, key, ExtraArgs={"ContentType": content_type}))
            return size

        # One PUT streamed from disk: boto3's upload_file starts a transfer manager and its
        # threads for every file, 3.5 ms more than the PUT itself for a job's log (a job puts
        # two or three such files).
        def put() -> None:
            with path.open("rb") as f:
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=f, ContentType=content_type)

        self._retry(f"upload {key}", put)
        return size

    def put_bytes_if_absent(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        """Write ``data`` at ``key`` unless the key exists; True when this call wrote it.

        False also when an earlier attempt of this very call landed but its response was lost
        (the retry then finds the key taken): the caller must read what is stored, not assume.
        """
        return self._put_if_absent(key, data, content_type)

    def put_file_if_absent(self, key: str, path: Path, content_type: str = "application/octet-stream") -> bool:
        """put_bytes_if_absent() for a file: one PUT streamed from disk, or, from two parts up, a
        multipart upload whose completion carries the condition (If-None-Match on
        CompleteMultipartUpload: S3 and MinIO refuse it with 412 when the key exists)."""
        size = path.stat().st_size
        if size >= 2 * PART_SIZE:
            if size > PART_SIZE * MAX_PARTS:
                raise StoreError(f"{path} is {size} bytes, over the {PART_SIZE * MAX_PARTS} bytes of "
                                 f"{MAX_PARTS} parts of {PART_SIZE} that an upload to {key} can have")
            return self._retry(f"multipart put-if-absent {key}",
                               lambda: self._put_parts_if_absent(key, path, size, content_type))
        return self._put_if_absent(key, path, content_type)

    def _put_parts_if_absent(self, key: str, path: Path, size: int, content_type: str) -> bool:
        if self.exists(key):
            return False  # no need to send the parts; the condition below still decides races
        upload = self.s3.create_multipart_upload(Bucket=self.bucket, Key=key, ContentType=content_type)["UploadId"]
        completed = False
        try:
            with ThreadPoolExecutor(PARALLEL, thread_name_prefix="s3-put") as pool:

                def send(number: int) -> dict[str, object]:
                    offset = (number - 1) * PART_SIZE
                    with _FilePart(path, offset, min(PART_SIZE, size - offset)) as body:
                        etag = self.s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number,
                                                   Body=body)["ETag"]
                    return {"ETag": etag, "PartNumber": number}

                parts = list(pool.map(send, range(1, -(-size // PART_SIZE) + 1)))

            def complete() -> None:
                self.s3.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload, IfNoneMatch="*",
                                                  MultipartUpload={"Parts": parts})

            completed = self._conditionally(key, complete)
            return completed
        finally:
            if not completed:
                # Parts of an upload that never completes would stay in the bucket until aborted.
                try:
                    self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
                except (ClientError, BotoCoreError) as e:
                    log.warning("S3 %s: cannot abort multipart upload %s (%s); its parts stay until a "
                                "lifecycle rule removes them", key, upload, e)

    def _put_if_absent(self, key: str, body: bytes | Path, content_type: str) -> bool:
        def put_once() -> None:
            if isinstance(body, Path):
                # Reopened per attempt: a retry after a partial send must start from byte 0.
                with body.open("rb") as f:
                    self.s3.put_object(Bucket=self.bucket, Key=key, Body=f, ContentType=content_type,
                                       IfNoneMatch="*")
            else:
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type,
                                   IfNoneMatch="*")

        return self._retry(f"put-if-absent {key}", lambda: self._conditionally(key, put_once))

    @staticmethod
    def _conditionally(key: str, write: Callable[[], None]) -> bool:
        """Run ``write`` (a request with If-None-Match: *); True if it wrote, False if the key exists."""
        try:
            write()
            return True
        except ClientError as e:
            if _error(e) == _EXISTS:
                return False
            if _error(e) != _CONFLICT:
                raise
        # 409: another conditional write of the key was in flight. It usually completes, so one
        # retry after it normally gets the 412; if it still conflicts, someone is writing the key
        # and it is theirs.
        log.info("S3 put-if-absent %s: concurrent conditional write (409); retrying once", key)
        time.sleep(0.2)
        try:
            write()
            return True
        except ClientError as e:
            if _error(e) in (_EXISTS, _CONFLICT):
                return False
            raise

    def get_bytes(self, key: str) -> bytes:
        return self._retry(f"get {key}", lambda: self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def stream(self, key: str, chunk: int = 1 << 16) -> Iterator[bytes]:
        """The object's bytes in chunks, for a reader that passes them on (the dashboard's log
        view) without holding the whole object. The GET is made before this returns, so a
        missing key or an unreachable store is a StoreError here, not halfway through."""
        try:
            body = self._retry(f"get {key}", lambda: self.s3.get_object(Bucket=self.bucket, Key=key)["Body"])
        except ClientError as e:
            raise StoreError(f"S3 {key}: {_error(e)[0] or e}") from e

        def chunks() -> Iterator[bytes]:
            try:
                yield from body.iter_chunks(chunk)
            finally:
                body.close()

        return chunks()

    def get_file(self, key: str, path: Path) -> int:
        """Download ``key`` to ``path`` (replaced whole, never left half-written): from two parts
        up, PART_SIZE ranges on PARALLEL connections at once, each written at its offset."""
        return self._retry(f"download {key}", lambda: self._get_file(key, path))

    def _get_file(self, key: str, path: Path) -> int:
        # The first part's GET also says the size and the ETag (no HEAD first): an object of one
        # part, as most job files are, is one request (docs/speed.md, "At scale").
        try:
            first = self.s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=0-{PART_SIZE - 1}")
        except ClientError as e:
            if _error(e)[0] != "InvalidRange":
                raise
            first = self.s3.get_object(Bucket=self.bucket, Key=key)  # an empty object has no byte 0
        total = str(first.get("ContentRange") or "").rpartition("/")[2]
        size, etag = int(total) if total.isdigit() else int(first["ContentLength"]), str(first["ETag"])
        part = path.with_name(path.name + ".part")
        try:
            with part.open("wb") as f:
                fd = f.fileno()

                def write(body: Any, offset: int, end: int) -> None:
                    at = offset
                    for chunk in body.iter_chunks(1 << 20):
                        at += os.pwrite(fd, chunk, at)
                    if at != end + 1:
                        raise StoreError(f"S3 {key}: range {offset}-{end} ended at byte {at}")

                def fetch(offset: int) -> None:
                    end = min(size, offset + PART_SIZE) - 1
                    # If-Match: every range from the object the first GET saw, even if the key is rewritten.
                    write(self.s3.get_object(Bucket=self.bucket, Key=key, IfMatch=etag,
                                             Range=f"bytes={offset}-{end}")["Body"], offset, end)

                write(first["Body"], 0, min(size, PART_SIZE) - 1)
                if size > PART_SIZE:
                    os.ftruncate(fd, size)
                    with ThreadPoolExecutor(PARALLEL, thread_name_prefix="s3-get") as pool:
                        list(pool.map(fetch, range(PART_SIZE, size, PART_SIZE)))
            if part.stat().st_size != size:
                raise StoreError(f"S3 {key}: got {part.stat().st_size} of {size} bytes")
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)
        return size

    def list(self, prefix: str) -> Iterator[str]:
        def page_all() -> list[str]:
            keys: list[str] = []
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                keys.extend(o["Key"] for o in page.get("Contents", []))
            return keys

        yield from self._retry(f"list {prefix}", page_all)

    def objects(self, prefix: str = "") -> list[tuple[str, int, float]]:
        """(key, size, last modified as epoch seconds) of every object under ``prefix``."""
        def page_all() -> list[tuple[str, int, float]]:
            out: list[tuple[str, int, float]] = []
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                out.extend((o["Key"], int(o["Size"]), o["LastModified"].timestamp()) for o in page.get("Contents", []))
            return out

        return self._retry(f"list {prefix or 'the bucket'}", page_all)

    def copy(self, src: str, dst: str) -> None:
        """Copy the object at ``src`` to ``dst`` inside the bucket, on the server (boto3's managed
        copy: in parts past 5 GiB, which one CopyObject cannot)."""
        self._retry(f"copy {src} to {dst}", lambda: self.s3.copy({"Bucket": self.bucket, "Key": src},
                                                                  self.bucket, dst))

    def delete(self, keys: list[str]) -> int:
        """Delete ``keys`` (1,000 a request, S3's most); returns how many the store deleted.
        StoreError naming the first key it refused."""
        done = 0
        for start in range(0, len(keys), 1000):
            batch = keys[start:start + 1000]

            def send(batch: list[str] = batch) -> dict[str, Any]:
                return self.s3.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": k} for k in batch], "Quiet": True})

            answer = self._retry(f"delete objects ({len(batch)})", send)
            errors = answer.get("Errors") or []
            if errors:
                e = errors[0]
                raise StoreError(f"S3 refused to delete {e.get('Key')}: {e.get('Code')} {e.get('Message')} "
                                 f"({len(errors)} of {len(batch)} refused)")
            done += len(batch)
        return done

    def presign(self, key: str) -> str:
        """A URL at the endpoint in use (the last that answered): every node serves any object."""
        return str(self.s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=self.cfg.presign_expiry))


def _error(e: ClientError) -> tuple[str, int]:
    """Map a ClientError onto the (code, HTTP status) pair it stands for, either way it is reported
    (a HEAD-style error may carry only the status; some servers send only the code)."""
    code = str(e.response.get("Error", {}).get("Code", ""))
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    for known in (_EXISTS, _CONFLICT):
        if code == known[0] or status == known[1] or code == str(known[1]):
            return known
    return code, status
