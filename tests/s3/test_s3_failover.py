"""[s3] endpoints: the store goes on at the next node of a distributed MinIO when the one in use
does not answer, at once rather than after the outage wait, and stays there.

Two MinIO servers would be two storages, not two nodes of one, so the nodes that fail here are
loopback ports nobody listens on (refused) or a listener that drops every connection (closed),
in front of one real MinIO.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from pydantic import ValidationError

from gearfarm.config import S3Config, S3Keys
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.hosts.net import free_port
from gearfarm.s3 import keys
from gearfarm.s3.minio import make_role_users
from gearfarm.s3.store import ArtifactStore, StoreError

# Well under the first outage wait: the store's default retry_for is 300 s.
QUICK = 10.0


def dead() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused


class Dropper:
    """A node that accepts connections and closes them unanswered, counting them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def s3(minio: MinioServer, first: str, *rest: str) -> S3Config:
    return S3Config(**{**minio.s3_config().model_dump(), "endpoint": first, "endpoints": list(rest)})


def test_a_dead_first_endpoint_is_left_at_once_for_the_next(minio: MinioServer,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    gone = dead()
    t0 = time.monotonic()
    store = ArtifactStore(s3(minio, gone, minio.endpoint))  # the default 300 s of outage wait
    with caplog.at_level(logging.WARNING, logger="gearfarm.s3.store"):
        store.put_bytes("failover/a", b"one")
    assert store.get_bytes("failover/a") == b"one"
    assert list(store.list("failover/")) == ["failover/a"]
    assert store.exists("failover/a") and not store.exists("failover/b")
    assert time.monotonic() - t0 < QUICK
    assert store.endpoint == minio.endpoint == store.s3.meta.endpoint_url
    assert any(gone in r.message and minio.endpoint in r.message for r in caplog.records), caplog.text


def test_a_store_that_failed_over_stays_at_the_endpoint_that_answers(minio: MinioServer) -> None:
    node = Dropper()
    try:
        store = ArtifactStore(s3(minio, node.endpoint, minio.endpoint))
        store.check()  # a dropped connection is an outage too
        assert node.connections == 1  # left after one try, not botocore's four
        for i in range(5):
            store.put_bytes(f"sticky/{i}", b"x")
            assert store.get_bytes(f"sticky/{i}") == b"x"
        assert node.connections == 1
        assert store.s3.meta.endpoint_url == minio.endpoint
    finally:
        node.close()


def test_every_endpoint_dead_is_an_error_naming_each_of_them(minio: MinioServer) -> None:
    nodes = [dead(), dead(), dead()]
    store = ArtifactStore(s3(minio, *nodes), retry_for=1)
    t0 = time.monotonic()
    with pytest.raises(StoreError) as e:
        store.put_bytes("nowhere/a", b"x")
    assert time.monotonic() - t0 < QUICK
    assert all(n in str(e.value) for n in nodes), e.value
    with pytest.raises(StoreError, match="unreachable") as e:
        store.check()
    assert all(n in str(e.value) for n in nodes), e.value


def test_a_refusal_is_an_answer_not_a_reason_to_fail_over(minio: MinioServer) -> None:
    cfg = s3(minio, minio.endpoint, dead())
    store = ArtifactStore(cfg.model_copy(update={"secret_key": "wrong-secret-123"}))
    with pytest.raises(StoreError, match=f"S3 at {minio.endpoint} refused"):
        store.put_bytes("refused/a", b"x")
    assert store.endpoint == minio.endpoint


def test_role_users_are_made_at_the_first_endpoint_that_answers(minio: MinioServer) -> None:
    roles = {"test": S3Keys(access_key="failover-test", secret_key="failover-secret-0123456789")}
    admin = s3(minio, dead(), minio.endpoint)
    make_role_users(admin, roles)
    store = ArtifactStore(admin.model_copy(update={"roles": roles}).for_role("test"), retry_for=0)
    store.put_bytes(keys.job_file("r1", "linux-x86_64", "test-unit", "log.txt", "f" * 64), b"mine")


def test_endpoints_are_urls_listed_once() -> None:
    with pytest.raises(ValidationError, match="must start with http:// or https://"):
        S3Config(endpoint="http://a:9000", endpoints=["b:9000"])
    with pytest.raises(ValidationError, match="listed twice"):
        S3Config(endpoint="http://a:9000", endpoints=["http://b:9000", "http://a:9000"])
    assert S3Config(endpoint="https://a:9000", endpoints=["https://b:9000"]).endpoint_list() == \
        ["https://a:9000", "https://b:9000"]
