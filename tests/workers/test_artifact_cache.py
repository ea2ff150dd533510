"""A test host's cache of build artifacts (gearfarm.hosts.cache) with a real MinIO: a build's
suites on one host fetch its archive from S3 once; every use is verified against the signed
sha256, and a cached copy that was changed is dropped and fetched again, never run."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from botocore.exceptions import ClientError

from gearfarm.hosts.cache import ArchiveCache
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.s3 import artifact
from gearfarm.s3.store import ArtifactStore, StoreError
from gearfarm.workers.test import fetch_artifact

T = "linux-x86_64"
REV = "c" * 40


def _build(tmp_path: Path, store: ArtifactStore) -> tuple[str, str]:
    out = tmp_path / "out"
    out.mkdir()
    (out / "gfe").write_bytes(b"#!/bin/sh\necho engine\n")
    (out / "gfe").chmod(0o755)
    archive = tmp_path / "build.tar.zst"
    artifact.pack(out, ["gfe"], {"rev": REV, "target": T}, archive)
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    store.put_file("artifacts/x/build.tar.zst", archive)
    return "artifacts/x/build.tar.zst", sha


def test_a_hosts_suites_fetch_a_build_once_and_a_changed_cached_copy_never_runs(
        tmp_path: Path, minio: MinioServer) -> None:
    store = ArtifactStore(minio.s3_config(), retry_for=0.0, attempts=1)
    key, sha = _build(tmp_path, store)
    gets: list[str] = []
    store.s3.meta.events.register("before-send.s3.GetObject", lambda **kw: gets.append("get"))
    cache = ArchiveCache(tmp_path / "state" / "cache" / "artifacts")
    ctx = SimpleNamespace(store=store, archives=cache)
    p = SimpleNamespace(artifact_key=key, artifact_sha256=sha, rev=REV, target=T, source_sha256=None)

    def job(n: int) -> Path:
        d = tmp_path / f"job{n}"
        d.mkdir()
        return fetch_artifact(ctx, p, d / "root", {})  # type: ignore[arg-type]

    # Three suites of one build on this host: one download.
    for n in range(3):
        assert (job(n) / "gfe").read_bytes() == b"#!/bin/sh\necho engine\n"
    assert len(gets) == 1
    entry = cache.root / sha
    assert stat.S_IMODE(entry.stat().st_mode) == 0o444 and not list(tmp_path.glob("job*/*.tar.zst"))

    # The cached copy changed (a disk error, or someone with the worker's rights): the job
    # refuses it by its sha256, drops it and fetches what the payload names again.
    os.chmod(entry, 0o644)
    entry.write_bytes(b"planted")
    assert (job(3) / "gfe").read_bytes() == b"#!/bin/sh\necho engine\n"
    assert len(gets) == 2 and hashlib.sha256(entry.read_bytes()).hexdigest() == sha

    # Changed again, and S3 no longer has the build: the job fails; nothing is left to run.
    os.chmod(entry, 0o644)
    entry.write_bytes(b"planted")
    store.delete([key])
    with pytest.raises((StoreError, ClientError)):  # the worker records it as `infra`
        job(4)
    assert not (tmp_path / "job4" / "root" / "gfe").exists() and not entry.exists()


def test_a_hosts_slots_starting_suites_of_one_build_together_fetch_it_once(tmp_path: Path, minio: MinioServer) -> None:
    """A build's release starts many of its suites at once, on every slot of a host: the slot
    that fetches the archive holds the others off until it is cached, and they take it there."""
    store = ArtifactStore(minio.s3_config(), retry_for=0.0, attempts=1)
    key, sha = _build(tmp_path, store)
    gets: list[str] = []

    def slow_get(**_: object) -> None:  # the first GET takes a while, as under a burst
        gets.append("get")
        time.sleep(0.5)

    store.s3.meta.events.register("before-send.s3.GetObject", slow_get)
    p = SimpleNamespace(artifact_key=key, artifact_sha256=sha, rev=REV, target=T, source_sha256=None)
    slots = [SimpleNamespace(store=store, archives=ArchiveCache(tmp_path / "state" / "cache" / "artifacts"))
             for _ in range(3)]  # a slot each, one host's state directory

    def job(n: int) -> bytes:
        d = tmp_path / f"job{n}"
        d.mkdir()
        return (fetch_artifact(slots[n], p, d / "root", {}) / "gfe").read_bytes()  # type: ignore[arg-type]

    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(job, range(3)))
    assert got == [b"#!/bin/sh\necho engine\n"] * 3
    assert len(gets) == 1, gets
    assert sorted(p.name for p in slots[0].archives.root.iterdir() if not p.name.startswith(".fetch-")) == [sha]


def test_the_cache_keeps_the_newest_entries_and_refuses_names_that_are_not_digests(tmp_path: Path) -> None:
    cache = ArchiveCache(tmp_path / "c", keep=2)
    shas = []
    for i in range(3):
        f = tmp_path / f"a{i}"
        f.write_bytes(b"x" * i)
        shas.append(hashlib.sha256(f.read_bytes()).hexdigest())
    for i in (0, 1):
        cache.add(shas[i], tmp_path / f"a{i}")
        os.utime(cache.root / shas[i], (1000 + i, 1000 + i))
    assert cache.take(shas[0], tmp_path / "got0") is True  # used: now the newest
    cache.add(shas[2], tmp_path / "a2")
    assert sorted(p.name for p in cache.root.iterdir()) == sorted([shas[0], shas[2]])
    assert cache.take(shas[1], tmp_path / "got1") is False
    with pytest.raises(ValueError, match="not a sha256"):
        cache.take("../../etc/passwd", tmp_path / "x")
