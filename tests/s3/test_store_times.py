"""The times S3 gives back (a listing's ISO 8601 dates, a HEAD's RFC 1123 header) are read as
the object's own, in epoch seconds, by the store's own timestamp parser (gearfarm.s3.store:
botocore's took 0.3 ms a date, most of a nightly's CPU when it listed a large run)."""

from __future__ import annotations

import time

from gearfarm.hosts.minio_server import MinioServer
from gearfarm.s3.store import ArtifactStore


def test_a_listing_and_a_head_give_the_objects_time_in_epoch_seconds(minio: MinioServer) -> None:
    store = ArtifactStore(minio.s3_config())
    before = time.time()
    store.put_bytes("times/a.txt", b"a")
    after = time.time()
    [(key, size, at)] = store.objects("times/")
    assert key == "times/a.txt" and size == 1
    assert before - 2 <= at <= after + 2, (before, at, after)
    head = store.s3.head_object(Bucket=store.bucket, Key="times/a.txt")["LastModified"]
    assert head.tzinfo is not None and abs(head.timestamp() - at) < 1.5
