"""The artifact store on S3-compatible storage (MinIO) through boto3.

Every call retries with backoff (botocore's standard mode plus our own outer loop), because an
outage of minutes must delay a job, never fail or lose it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, SSLError

from gearfarm.config import S3Config

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreError(RuntimeError):
    """S3 could not be reached or refused a request, after retries."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class ArtifactStore:
    def __init__(self, cfg: S3Config, retry_for: float = 300.0) -> None:
        self.cfg = cfg
        self.bucket = cfg.bucket
        self.retry_for = retry_for
        # Path-style + s3v4 + checksums only when required: what MinIO accepts with current
        # boto3 (measured; without s3v4, presigned URLs come out as SigV2).
        self.s3 = boto3.client(
            "s3",
            endpoint_url=cfg.endpoint,
            aws_access_key_id=cfg.access_key,
            aws_secret_access_key=cfg.secret_key,
            region_name=cfg.region,
            verify=cfg.ca_bundle if cfg.ca_bundle else None,
            config=BotoConfig(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                retries={"mode": "standard", "max_attempts": 3},
                connect_timeout=5,
                read_timeout=60,
            ),
        )

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.retry_for
        delay = 0.5
        while True:
            try:
                return fn()
            except ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                if code in ("NoSuchKey", "404", "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                            "SignatureDoesNotMatch"):
                    raise
                err: Exception = e
            except SSLError as e:
                # A certificate problem does not heal by waiting: say so now, not in 5 minutes.
                raise StoreError(f"S3 at {self.cfg.endpoint}: TLS verification failed ({e}); check [s3] "
                                 "ca_bundle") from e
            except (BotoCoreError, EndpointConnectionError) as e:
                err = e
            if time.monotonic() + delay > deadline:
                raise StoreError(f"S3 at {self.cfg.endpoint}: {what} failed: {err}") from err
            log.warning("S3 %s failed (%s); retrying in %.1fs", what, err, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)

    def check(self) -> None:
        """Fail fast, naming the endpoint, when S3 is unreachable or the bucket is missing."""
        try:
            self.s3.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            raise StoreError(
                f"S3 at {self.cfg.endpoint}: bucket {self.bucket!r} is not usable: {e}; "
                "create it or fix [s3] in the config"
            ) from e
        except (BotoCoreError, EndpointConnectionError) as e:
            raise StoreError(f"S3 endpoint {self.cfg.endpoint} is unreachable: {e}") from e

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
        self._retry(f"upload {key}", lambda: self.s3.upload_file(
            str(path), self.bucket, key, ExtraArgs={"ContentType": content_type}))
        return path.stat().st_size

    def get_bytes(self, key: str) -> bytes:
        return self._retry(f"get {key}", lambda: self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def get_file(self, key: str, path: Path) -> int:
        self._retry(f"download {key}", lambda: self.s3.download_file(self.bucket, key, str(path)))
        return path.stat().st_size

    def list(self, prefix: str) -> Iterator[str]:
        def page_all() -> list[str]:
            keys: list[str] = []
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                keys.extend(o["Key"] for o in page.get("Contents", []))
            return keys

        yield from self._retry(f"list {prefix}", page_all)

    def presign(self, key: str) -> str:
        return str(self.s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=self.cfg.presign_expiry))
