"""Reproducible artifacts and race-free publishing (s3/artifact.py, put-if-absent in s3/store.py).

pack() must give byte-identical archives for the same contents and meta whoever packs them and
whenever; publish() must leave one archive per key and hand every concurrent builder the sha256
of that stored archive. The store tests run against a real MinIO on a free loopback port.

Links (issue #32): extraction resolves every link against the final tree, so no chain of links
made by later members reaches out, and a refusal leaves nothing extracted; a build's outputs are
collected and packed following no link, a link inside the tree is packed as a link, one leading
out is refused.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import zstandard

from gearfarm.hosts.minio_server import MinioServer
from gearfarm.s3 import artifact, keys
from gearfarm.s3 import store as store_mod
from gearfarm.s3.store import ArtifactStore

T = TypeVar("T")
REV = "0123456789abcdef0123456789abcdef01234567"
EXE = b"\x7fELF pretend engine binary\n" * 50
LIB = b"!<arch>\npretend static library\n" * 50


def _outputs(out: Path, umask: int, exe: bytes = EXE, owner: int | None = None) -> Path:
    """Build outputs as a compiler would leave them under ``umask`` (and ``owner``, if root)."""
    out.mkdir(parents=True)
    old = os.umask(umask)
    try:
        # Created through open() so the umask, not an explicit chmod, decides the group/other bits.
        for name, data, mode in (("gfe", exe, 0o777), ("libgfe.a", LIB, 0o666)):
            fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    finally:
        os.umask(old)
    if owner is not None and os.geteuid() == 0:
        for name in ("gfe", "libgfe.a"):
            os.chown(out / name, owner, owner)
    return out


def _touch(out: Path, when: float) -> None:
    for p in out.iterdir():
        os.utime(p, (when, when))


def _meta(**extra: Any) -> dict[str, Any]:
    return {"rev": REV, "target": "linux-x86_64", "toolchain": "tc", "flags": {"z": 1, "a": [1, 2]}, **extra}


def test_pack_is_byte_identical_across_time_umask_owner_and_directory(tmp_path: Path) -> None:
    a = _outputs(tmp_path / "host-a" / "out", umask=0o022)
    _touch(a, 1_000_000_000)
    man_a = artifact.pack(a, ["libgfe.a", "gfe"], _meta(), tmp_path / "a.tar.zst")

    # Another builder: other directory, umask 077 (gfe is 0700, libgfe.a 0600), another owner,
    # outputs listed in another order, meta keys inserted in another order, files touched later.
    b = _outputs(tmp_path / "elsewhere" / "host-b" / "out", umask=0o077, owner=4242)
    _touch(b, time.time() + 3600)
    assert (b / "gfe").stat().st_mode & 0o777 == 0o700 and (b / "libgfe.a").stat().st_mode & 0o777 == 0o600
    meta_b = dict(reversed(list(_meta().items())))
    man_b = artifact.pack(b, ["gfe", "libgfe.a"], meta_b, tmp_path / "b.tar.zst")

    # The first builder again, later, after its outputs were touched.
    _touch(a, time.time() + 7200)
    man_c = artifact.pack(a, ["gfe", "libgfe.a"], _meta(), tmp_path / "c.tar.zst")

    first = (tmp_path / "a.tar.zst").read_bytes()
    assert (tmp_path / "b.tar.zst").read_bytes() == first
    assert (tmp_path / "c.tar.zst").read_bytes() == first
    assert man_a == man_b == man_c and man_a["archive_sha256"] == hashlib.sha256(first).hexdigest()

    # Control: the comparison above can tell archives apart when contents differ.
    d = _outputs(tmp_path / "host-d" / "out", umask=0o022, exe=EXE + b"!")
    artifact.pack(d, ["gfe", "libgfe.a"], _meta(), tmp_path / "d.tar.zst")
    assert (tmp_path / "d.tar.zst").read_bytes() != first


def test_packed_members_carry_nothing_of_the_packing_host(tmp_path: Path) -> None:
    out = _outputs(tmp_path / "out", umask=0o077, owner=4242)
    artifact.pack(out, ["libgfe.a", "gfe"], _meta(built_by="w1"), tmp_path / "a.tar.zst")
    with artifact.open_tar(tmp_path / "a.tar.zst") as tar:
        members = tar.getmembers()
        assert not tar.pax_headers
        body = tar.extractfile(artifact.MANIFEST).read()  # type: ignore[union-attr]
    assert [m.name for m in members] == ["gfe", "libgfe.a", artifact.MANIFEST]
    assert [m.mode for m in members] == [0o755, 0o644, 0o644]
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", ""), m.name
        assert m.isfile() and not m.pax_headers, m.name
    # Canonical JSON: exactly the sorted-keys serialisation of its own content.
    assert body == artifact.canonical_json(json.loads(body))
    assert list(json.loads(body)) == sorted(json.loads(body))


def test_archive_is_zstd_naming_nothing_and_archives_in_gzip_still_unpack(tmp_path: Path) -> None:
    out = _outputs(tmp_path / "out", umask=0o022)
    dest = tmp_path / "artifact-with-a-name.tar.zst"
    man = artifact.pack(out, ["gfe", "libgfe.a"], _meta(), dest)
    raw = dest.read_bytes()
    assert raw[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    assert b"artifact-with-a-name" not in raw
    assert tarfile.open(fileobj=io.BytesIO(zstandard.ZstdDecompressor().decompressobj().decompress(raw)))
    # An archive stored before the codec changed (tar.gz) is still read and verified.
    old = tmp_path / "old.tar.gz"
    with tarfile.open(tmp_path / "plain.tar", "w") as tar, artifact.open_tar(dest) as packed:
        for m in packed.getmembers():
            tar.addfile(m, packed.extractfile(m))
    old.write_bytes(gzip.compress((tmp_path / "plain.tar").read_bytes(), mtime=0))
    got = artifact.unpack(old, tmp_path / "unpacked", hashlib.sha256(old.read_bytes()).hexdigest())
    assert got["files"] == man["files"]
    assert (tmp_path / "unpacked" / "gfe").read_bytes() == (out / "gfe").read_bytes()
    # Neither codec: a clear refusal, nothing extracted.
    junk = tmp_path / "junk.tar.zst"
    junk.write_bytes(b"PK\x03\x04 not an archive of ours")
    with pytest.raises(artifact.ArtifactError, match="neither zstd nor gzip"):
        artifact.unpack(junk, tmp_path / "junk", hashlib.sha256(junk.read_bytes()).hexdigest())


@pytest.fixture
def store(minio: MinioServer) -> ArtifactStore:
    # A short retry window: a wrongly retried 412 then fails the test in seconds, not minutes.
    return ArtifactStore(minio.s3_config(), retry_for=5)


def _count_requests(store: ArtifactStore, operation: str) -> list[str]:
    """Every request for ``operation`` the client actually sends (retries included)."""
    sent: list[str] = []
    store.s3.meta.events.register(f"before-send.s3.{operation}", lambda **kw: sent.append(operation))
    return sent


def test_put_bytes_if_absent_writes_once_and_keeps_the_first_object(store: ArtifactStore) -> None:
    key = "t/put-bytes/object"
    assert store.put_bytes_if_absent(key, b"first", "text/plain") is True
    puts = _count_requests(store, "PutObject")
    t0 = time.monotonic()
    assert store.put_bytes_if_absent(key, b"second", "text/plain") is False
    assert len(puts) == 1, "the 412 was retried"
    assert time.monotonic() - t0 < 2
    assert store.get_bytes(key) == b"first"


def test_put_file_if_absent_streams_one_put_and_keeps_the_first_object(store: ArtifactStore, tmp_path: Path) -> None:
    key = "t/put-file/object"
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(9 << 20))  # over boto3's 8 MiB multipart threshold
    other = tmp_path / "other.bin"
    other.write_bytes(b"other")
    puts = _count_requests(store, "PutObject")
    multipart = _count_requests(store, "CreateMultipartUpload")
    assert store.put_file_if_absent(key, big, "application/gzip") is True
    assert store.put_file_if_absent(key, other, "application/gzip") is False
    assert (len(puts), multipart) == (2, [])
    assert store.get_bytes(key) == big.read_bytes()


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> int:
    """S3's smallest part size, so a 12 MiB file goes up and down in three parts."""
    monkeypatch.setattr(store_mod, "PART_SIZE", 5 << 20)
    return 5 << 20


def test_large_file_goes_up_in_parts_with_put_if_absent_kept(store: ArtifactStore, tmp_path: Path,
                                                              small_parts: int) -> None:
    key = "t/put-parts/object"
    first, second = tmp_path / "first.bin", tmp_path / "second.bin"
    first.write_bytes(os.urandom(12 << 20))
    second.write_bytes(os.urandom(12 << 20))
    parts = _count_requests(store, "UploadPart")
    assert store.put_file_if_absent(key, first, "application/zstd") is True
    assert len(parts) == 3
    assert store.put_file_if_absent(key, second, "application/zstd") is False
    assert len(parts) == 3, "parts were sent for a key that exists"
    assert store.get_bytes(key) == first.read_bytes()
    assert store.s3.list_multipart_uploads(Bucket=store.bucket, Prefix="t/put-parts/").get("Uploads", []) == []


def test_concurrent_part_uploads_of_one_key_agree_on_one_object(minio: MinioServer, tmp_path: Path,
                                                                small_parts: int) -> None:
    # Both writers pass the existence check and send all their parts; the condition on the
    # completion decides: exactly one wins, its bytes are stored, the loser's parts are aborted.
    key = "t/put-parts-race/object"
    files = [tmp_path / f"writer-{i}.bin" for i in range(2)]
    for f in files:
        f.write_bytes(os.urandom(11 << 20))
    stores = [ArtifactStore(minio.s3_config(), retry_for=5) for _ in files]
    results = _all_at_once([lambda i=i: stores[i].put_file_if_absent(key, files[i], "application/zstd")
                            for i in range(len(files))])
    assert sorted(map(repr, results)) == ["False", "True"], results
    winner = files[results.index(True)]
    assert stores[0].get_bytes(key) == winner.read_bytes()
    assert stores[0].s3.list_multipart_uploads(Bucket=stores[0].bucket,
                                               Prefix="t/put-parts-race/").get("Uploads", []) == []


def test_large_file_comes_down_in_ranges_whole_or_not_at_all(store: ArtifactStore, tmp_path: Path,
                                                            small_parts: int) -> None:
    key = "t/get-parts/object"
    data = os.urandom((12 << 20) + 12345)
    store.put_bytes(key, data)
    gets = _count_requests(store, "GetObject")
    dest = tmp_path / "down.bin"
    dest.write_bytes(b"an older download")
    assert store.get_file(key, dest) == len(data)
    assert len(gets) == 3
    assert dest.read_bytes() == data
    # A failed download leaves neither a half file nor a stray .part next to it.
    with pytest.raises(Exception, match="404|Not Found|NoSuchKey"):
        store.get_file("t/get-parts/missing", tmp_path / "missing.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["down.bin"]


def test_a_file_of_one_part_comes_down_in_one_request(store: ArtifactStore, tmp_path: Path) -> None:
    """A job's log or JUnit file: the report copies 10,000 of them for a 5,000-job night, so
    the size comes with the first GET rather than from a HEAD before it. An empty one too."""
    store.put_bytes("t/get-one/log.txt", b"line\n" * 100)
    store.put_bytes("t/get-one/empty", b"")
    gets, heads = _count_requests(store, "GetObject"), _count_requests(store, "HeadObject")
    assert store.get_file("t/get-one/log.txt", tmp_path / "log.txt") == 500
    assert (tmp_path / "log.txt").read_bytes() == b"line\n" * 100 and (len(gets), heads) == (1, [])
    assert store.get_file("t/get-one/empty", tmp_path / "empty") == 0
    assert (tmp_path / "empty").read_bytes() == b"" and heads == []


def _pack(tmp_path: Path, who: str, exe: bytes = EXE) -> tuple[Path, dict[str, Any]]:
    out = _outputs(tmp_path / who / "out", umask=0o022, exe=exe)
    dest = tmp_path / who / "artifact.tar.zst"
    return dest, artifact.pack(out, ["gfe", "libgfe.a"], _meta(built_by=who), dest)


def _manifest_without_extras(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("uploaded_bytes", "raced", "manifest_sha256")}


def _all_at_once(calls: list[Callable[[], T]]) -> list[T]:
    """Each call in a thread of its own, all released at once; re-raise the first failure."""
    barrier = threading.Barrier(len(calls))
    results: list[T | BaseException] = [RuntimeError("call did not finish")] * len(calls)

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = calls[i]()
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def _publish_concurrently(stores: list[ArtifactStore], art_key: str, man_key: str,
                          packs: list[tuple[Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    """publish() from one thread per pack, all released at once; re-raise the first failure."""
    return _all_at_once([lambda i=i: artifact.publish(stores[i], art_key, man_key, packs[i][0], packs[i][1])
                         for i in range(len(packs))])


@pytest.mark.parametrize("round_", range(5))
def test_concurrent_publishers_of_different_archives_agree_on_the_stored_one(
        minio: MinioServer, tmp_path: Path, round_: int) -> None:
    art_key, man_key = f"t/race{round_}/artifact.tar.zst", f"t/race{round_}/manifest.json"
    # Not byte-identical (another builder name in meta), as from two hosts racing.
    packs = [_pack(tmp_path, who) for who in ("w1", "w2")]
    assert packs[0][1]["archive_sha256"] != packs[1][1]["archive_sha256"]
    stores = [ArtifactStore(minio.s3_config(), retry_for=5) for _ in packs]
    got = _publish_concurrently(stores, art_key, man_key, packs)

    stored = stores[0].get_bytes(art_key)
    stored_sha = hashlib.sha256(stored).hexdigest()
    assert [r["archive_sha256"] for r in got] == [stored_sha, stored_sha]
    assert [r["archive_size"] for r in got] == [len(stored), len(stored)]
    assert sorted(r["raced"] for r in got) == [False, True]
    winner = next(i for i, r in enumerate(got) if not r["raced"])
    manifest_bytes = len(artifact.canonical_json(_manifest_without_extras(got[winner])))
    assert got[winner]["uploaded_bytes"] in (len(stored), len(stored) + manifest_bytes)
    assert got[1 - winner]["uploaded_bytes"] in (0, manifest_bytes)
    assert got[0]["uploaded_bytes"] + got[1]["uploaded_bytes"] == len(stored) + manifest_bytes
    assert stored == packs[winner][0].read_bytes()
    # Everyone hands out the winner's manifest, and the stored manifest object agrees.
    assert got[0]["built_by"] == got[1]["built_by"] == f"w{winner + 1}"
    assert json.loads(stores[0].get_bytes(man_key))["archive_sha256"] == stored_sha

    (tmp_path / "dl.tar.zst").write_bytes(stored)
    unpacked = artifact.unpack(tmp_path / "dl.tar.zst", tmp_path / "x", got[1 - winner]["archive_sha256"])
    assert (tmp_path / "x" / "gfe").read_bytes() == EXE
    assert unpacked["files"] == got[0]["files"]


def test_publish_after_losing_the_race_returns_the_stored_archive(store: ArtifactStore, tmp_path: Path) -> None:
    art_key, man_key = "t/lost/artifact.tar.zst", "t/lost/manifest.json"
    first_path, first = _pack(tmp_path, "w1")
    second_path, second = _pack(tmp_path, "w2", exe=EXE + b"rebuilt differently")
    won = artifact.publish(store, art_key, man_key, first_path, first)
    assert won["raced"] is False and won["uploaded_bytes"] == first["archive_size"] + len(
        artifact.canonical_json(first))
    assert _manifest_without_extras(won) == first
    assert store.get_bytes(man_key) == artifact.canonical_json(first)

    lost = artifact.publish(store, art_key, man_key, second_path, second)
    assert (lost["raced"], lost["uploaded_bytes"]) == (True, 0)
    assert _manifest_without_extras(lost) == first  # the stored archive's, not ours
    assert store.get_bytes(art_key) == first_path.read_bytes()
    assert not list(second_path.parent.glob(".stored-*")), "downloaded copy left behind"


def test_a_build_never_takes_a_stored_archive_the_farm_did_not_sign(store: ArtifactStore, tmp_path: Path) -> None:
    """Put-if-absent is only a client's courtesy: a role key can put any object at a build's key
    first (or replace it). A build that finds an archive there which is neither byte for byte its
    own nor one of the farm's signed builds refuses it, naming both digests, and writes nothing."""
    art_key, man_key = "t/planted/artifact.tar.zst", "t/planted/manifest.json"
    planted_path, planted = _pack(tmp_path, "intruder", exe=EXE + b"a backdoor")
    assert store.put_file_if_absent(art_key, planted_path, "application/zstd")
    mine_path, mine = _pack(tmp_path, "w1")
    with pytest.raises(artifact.ArtifactError) as e:
        artifact.publish(store, art_key, man_key, mine_path, mine, signed=[])
    assert planted["archive_sha256"] in str(e.value) and mine["archive_sha256"] in str(e.value)
    assert "replaced or planted outside the farm" in str(e.value)
    assert not store.exists(man_key) and store.get_bytes(art_key) == planted_path.read_bytes()
    # The very same bytes (a reproducible build of the same inputs), or a build the farm signed: used.
    assert artifact.publish(store, art_key, man_key, planted_path, planted, signed=[])["raced"]
    again = artifact.publish(store, art_key, man_key, mine_path, mine, signed=[planted["archive_sha256"]])
    assert again["archive_sha256"] == planted["archive_sha256"]
    assert again["manifest_sha256"] == hashlib.sha256(store.get_bytes(man_key)).hexdigest()


def test_publish_completes_an_archive_whose_manifest_object_is_missing(store: ArtifactStore, tmp_path: Path) -> None:
    # A builder that died between the two PUTs leaves the archive alone; the next one finishes.
    art_key, man_key = "t/half/artifact.tar.zst", "t/half/manifest.json"
    first_path, first = _pack(tmp_path, "w1")
    assert store.put_file_if_absent(art_key, first_path, "application/gzip")
    second_path, second = _pack(tmp_path, "w2", exe=EXE + b"x")
    got = artifact.publish(store, art_key, man_key, second_path, second)
    body = artifact.canonical_json(first)
    assert (got["raced"], got["uploaded_bytes"]) == (True, len(body))
    assert store.get_bytes(man_key) == body


def test_publish_refuses_a_manifest_object_that_disagrees_with_the_stored_archive(
        store: ArtifactStore, tmp_path: Path) -> None:
    art_key, man_key = "t/tampered/artifact.tar.zst", "t/tampered/manifest.json"
    path, man = _pack(tmp_path, "w1")
    artifact.publish(store, art_key, man_key, path, man)
    tampered = artifact.canonical_json({**man, "archive_sha256": "0" * 64})
    store.put_bytes(man_key, tampered, "application/json")

    with pytest.raises(artifact.ArtifactError) as e:
        artifact.publish(store, art_key, man_key, path, man)
    msg = str(e.value)
    assert "0" * 64 in msg and man["archive_sha256"] in msg and man_key in msg
    assert store.get_bytes(man_key) == tampered  # never overwritten

    # Same when the manifest object was there before any archive was.
    art2, man2 = "t/tampered2/artifact.tar.zst", "t/tampered2/manifest.json"
    store.put_bytes(man2, tampered, "application/json")
    with pytest.raises(artifact.Replaced, match="replaced or planted outside the farm") as e2:
        artifact.publish(store, art2, man2, path, man)
    assert e2.value.key == man2 and store.get_bytes(man2) == tampered


def test_a_replaced_build_is_moved_aside_whole_and_kept_then_published_again(store: ArtifactStore,
                                                                             tmp_path: Path) -> None:
    """What the build worker does when publish finds an object the farm did not make: the
    build's objects move under quarantine/ (copied, then deleted), byte for byte, and the same
    publish then stores this build."""
    prefix = keys.artifact_prefix("f" * 40, "linux-x86_64", "0123456789abcdef")
    art_key, man_key = keys.artifact("f" * 40, "linux-x86_64", "0123456789abcdef"), f"{prefix}/manifest.json"
    planted_path, planted = _pack(tmp_path, "intruder", exe=EXE + b"a backdoor")
    store.put_file(art_key, planted_path, "application/zstd")
    store.put_bytes(f"{prefix}/provenance.intoto.json", b"{}", "application/json")
    mine_path, mine = _pack(tmp_path, "mine")
    with pytest.raises(artifact.Replaced) as e:
        artifact.publish(store, art_key, man_key, mine_path, mine, signed=[])
    assert e.value.key == art_key
    moved = artifact.quarantine(store, prefix, 1_800_000_000.0)
    assert moved == {k: f"quarantine/20270115T080000Z/{k}" for k in (art_key, f"{prefix}/provenance.intoto.json")}
    assert store.get_bytes(moved[art_key]) == planted_path.read_bytes() and list(store.list(prefix + "/")) == []
    got = artifact.publish(store, art_key, man_key, mine_path, mine, signed=[])
    assert not got["raced"] and got["archive_sha256"] == mine["archive_sha256"]
    with pytest.raises(ValueError):
        keys.quarantine("runs/x/log.txt", 0.0)


def test_publish_refuses_a_manifest_that_is_not_for_the_archive(store: ArtifactStore, tmp_path: Path) -> None:
    path, man = _pack(tmp_path, "w1")
    with pytest.raises(artifact.ArtifactError, match="pass the manifest pack"):
        artifact.publish(store, "t/wrong/artifact.tar.zst", "t/wrong/manifest.json", path,
                         {**man, "archive_sha256": "f" * 64})
    assert not store.exists("t/wrong/artifact.tar.zst")


def _tar_gz(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info


@pytest.mark.parametrize("members, named", [
    ([(_member("/tmp/gearfarm-escape-abs"), b"x")], "/tmp/gearfarm-escape-abs"),
    ([(_member("a/../../escape"), b"x")], "a/../../escape"),
    # A link to outside, then a file written through it.
    ([(_member("etc", tarfile.SYMTYPE, "{outside}"), None), (_member("etc/planted"), b"x")], "etc"),
    ([(_member("up", tarfile.SYMTYPE, "../.."), None)], "up"),
    ([(_member("passwd", tarfile.LNKTYPE, "{outside}/secret"), None)], "passwd"),
    ([(_member("dev-null", tarfile.CHRTYPE), None)], "dev-null"),
    ([(_member("pipe", tarfile.FIFOTYPE), None)], "pipe"),
])
def test_a_hostile_archive_is_refused_naming_its_member_and_writes_nothing_outside(
        tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], named: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("the worker's")
    for info, _ in members:
        info.linkname = info.linkname.replace("{outside}", str(outside))
    archive = tmp_path / "hostile.tar.gz"
    sha = _tar_gz(archive, members)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(artifact.ArtifactError, match=f"member {re.escape(repr(named))}"):
        artifact.safe_extract(archive, tmp_path / "tree", sha, "source snapshot")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "tree"])
    assert [p.name for p in outside.iterdir()] == ["secret"] and not Path("/tmp/gearfarm-escape-abs").exists()
    assert (outside / "secret").read_text() == "the worker's"


def test_links_inside_the_tree_unpack_and_modes_are_the_data_filters(tmp_path: Path) -> None:
    """A project's source may hold links within itself; set-id bits and group/other write never
    survive, and directories are readable by the sandbox's user (not tarfile's interim 0700)."""
    archive = tmp_path / "source.tar.gz"
    sha = _tar_gz(archive, [(_member("src", tarfile.DIRTYPE, mode=0o700), None),
                            (_member("src/tool", mode=0o6777), b"#!/bin/sh\n"),
                            (_member("src/data", mode=0o000), b"d"),
                            (_member("include", tarfile.SYMTYPE, "src"), None),
                            (_member("src/again", tarfile.LNKTYPE, "src/data"), None)])
    tree = tmp_path / "tree"
    artifact.safe_extract(archive, tree, sha, "source snapshot")
    assert (tree / "include" / "tool").read_text() == "#!/bin/sh\n"
    assert (tree / "include").is_symlink() and (tree / "src" / "again").read_text() == "d"
    assert stat.S_IMODE((tree / "src" / "tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((tree / "src" / "data").stat().st_mode) == 0o600
    assert stat.S_IMODE((tree / "src").stat().st_mode) == 0o755


# More `..` than pytest's temporary directories are deep (climbed from the tree they reach /), and few
# enough links for the kernel to follow (it stops at 40): the chain works, not only on paper.
DEEP = 16


def _climb(through: str, outside: Path, extra_up: int = 0) -> str:
    """A link target that is the tree's own root lexically (``through/`` DEEP times, then as
    many ``..``) followed by ``outside``'s path: inside while ``through`` does not exist, at
    ``outside`` once ``through`` is a link to ``.``."""
    return "/".join([through] * DEEP + [".."] * (DEEP + extra_up)) + str(outside)


def _chain(outside: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    return [(_member("p", tarfile.SYMTYPE, _climb("a", outside / "secret")), None),
            (_member("a", tarfile.SYMTYPE, "."), None)]


def _hostile(outside: Path) -> dict[str, list[tuple[tarfile.TarInfo, bytes | None]]]:
    """Archives whose every member passes a check against the tree as extracted so far, or that
    a member-time check catches; each is named after the member the refusal must name."""
    deep_dir = "/".join(["s"] * DEEP)
    return {
        # The pair: p is checked while a does not exist; a -> . then carries p out.
        "p": _chain(outside),
        # The same two levels down: d1/d2/x -> . makes x/x/.../../.. climb out of d1/d2.
        "d1/d2/p": [(_member("d1/d2", tarfile.DIRTYPE, mode=0o755), None),
                    (_member("d1/d2/p", tarfile.SYMTYPE, _climb("x", outside / "secret", extra_up=2)), None),
                    (_member("d1/d2/x", tarfile.SYMTYPE, "."), None)],
        # A chain of two links made after p: a -> b, then b -> .
        "q": [(_member("q", tarfile.SYMTYPE, _climb("a", outside / "secret")), None),
              (_member("a", tarfile.SYMTYPE, "b"), None),
              (_member("b", tarfile.SYMTYPE, "."), None)],
        # p is checked while a points DEEP directories down, then a is replaced by a -> .
        "r": [(_member(deep_dir, tarfile.DIRTYPE, mode=0o755), None),
              (_member("a", tarfile.SYMTYPE, deep_dir), None),
              (_member("r", tarfile.SYMTYPE, "a" + "/.." * DEEP + str(outside / "secret")), None),
              (_member("a", tarfile.SYMTYPE, "."), None)],
        # The chain, then a hard link through it to the worker's file.
        "h": [*_chain(outside), (_member("h", tarfile.LNKTYPE, "p"), None)],
        # A link to the outside directory by the chain, then a file written through it.
        "w/planted": [(_member("w", tarfile.SYMTYPE, _climb("a", outside)), None),
                      (_member("a", tarfile.SYMTYPE, "."), None),
                      (_member("w/planted"), b"planted")],
        # A symlink straight to an absolute path outside, behind a directory.
        "lib/passwd": [(_member("lib", tarfile.DIRTYPE, mode=0o755), None),
                       (_member("lib/passwd", tarfile.SYMTYPE, "/etc/passwd"), None)],
    }


def _links_leaving(tree: Path) -> list[str]:
    root = os.path.realpath(tree)
    out = []
    for d, dirs, files in os.walk(tree):
        for name in dirs + files:
            p = os.path.join(d, name)
            if os.path.islink(p) and os.path.commonpath([root, os.path.realpath(p)]) != root:
                out.append(os.path.relpath(p, tree))
    return out


@pytest.mark.parametrize("named", list(_hostile(Path("/x"))))
def test_links_are_resolved_against_the_final_tree_and_a_refusal_leaves_nothing_extracted(
        tmp_path: Path, named: str) -> None:
    """A link checked against the tree as it was can point outside once a later link exists:
    extraction refuses any archive whose links, in the final tree, reach out; it names the
    member, writes nothing outside, and removes what it extracted."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("the worker's")
    archive = tmp_path / "hostile.tar.gz"
    sha = _tar_gz(archive, _hostile(outside)[named])
    if named in ("p", "d1/d2/p", "q", "r"):
        # Control: unpacked unchecked, the link really reads the worker's file.
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path / "control", filter="fully_trusted")
        assert (tmp_path / "control" / named).read_text() == "the worker's"
    before = sorted(p.name for p in tmp_path.iterdir())
    tree = tmp_path / "tree"
    with pytest.raises(artifact.ArtifactError, match=re.escape(repr(named))):
        artifact.safe_extract(archive, tree, sha, "artifact")
    assert sorted(p.name for p in tmp_path.iterdir()) in (before, sorted([*before, "tree"]))
    assert [p.name for p in outside.iterdir()] == ["secret"]
    assert (outside / "secret").read_text() == "the worker's"
    # Nothing half-unpacked is left: no link reaching out, no member of the archive.
    assert not tree.exists() or (_links_leaving(tree) == [] and list(tree.iterdir()) == [])


def test_a_link_already_in_the_tree_is_resolved_with_the_archive_unpacked_over_it(tmp_path: Path) -> None:
    """An artifact is unpacked over the source snapshot: a link of the source, harmless alone,
    must not be carried out by a link of the artifact (nor the other way round). The refusal
    removes what the artifact wrote and leaves the tree's own files."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("the worker's")
    tree = tmp_path / "tree"
    source = tmp_path / "source.tar.gz"
    artifact.safe_extract(source, tree, _tar_gz(source, [(_member("p", tarfile.SYMTYPE,
                                                                  _climb("a", outside / "secret")), None),
                                                         (_member("README"), b"source\n")]), "source snapshot")
    archive = tmp_path / "artifact.tar.gz"
    sha = _tar_gz(archive, [(_member("a", tarfile.SYMTYPE, "."), None), (_member("tool"), b"#!/bin/sh\n")])
    with pytest.raises(artifact.ArtifactError, match="'p'"):
        artifact.safe_extract(archive, tree, sha, "artifact")
    assert _links_leaving(tree) == []
    assert sorted(p.name for p in tree.iterdir()) == ["README", "p"]


def _linked_outputs(root: Path) -> Path:
    """A build tree whose outputs hold links as real builds leave them: a versioned library, an
    include directory linked from the outputs, and an absolute link to a file of the tree."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "api.h").write_text("int f(void);\n")
    out = root / "out"
    out.mkdir()
    (out / "lib.so.1").write_bytes(LIB)
    fd = os.open(out / "tool", os.O_WRONLY | os.O_CREAT, 0o755)
    os.write(fd, EXE)
    os.close(fd)
    (out / "lib.so").symlink_to("lib.so.1")
    (out / "include").symlink_to("../src")
    (out / "abs.so").symlink_to(root / "out" / "lib.so.1")
    return root


def test_collect_outputs_keeps_links_inside_the_tree_and_refuses_links_out(tmp_path: Path) -> None:
    from gearfarm.step import runner as step

    root = _linked_outputs(tmp_path / "root")
    # Links are outputs of their own; a directory link is never descended (src/api.h is not
    # collected through it).
    assert step.collect_outputs(root, ["out"]) == ["out/abs.so", "out/include", "out/lib.so", "out/lib.so.1",
                                                   "out/tool"]
    assert step.collect_outputs(root, ["out/include/*.h"]) == ["out/include"]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shadow").write_text("the worker's")
    for name, target, why in [("leak", "/etc/passwd", "outside the build's tree"),
                              ("cfg", str(outside / "shadow"), "outside the build's tree"),
                              ("up", "../../outside/shadow", "outside the build's tree"),
                              ("gone", "no-such-file", "leads nowhere"),
                              ("etc", "/etc", "outside the build's tree")]:
        (root / "out" / name).symlink_to(target)
        for pattern in ("out", f"out/{name}", "out/*"):
            with pytest.raises(step.OutputsUnsafe) as e:
                step.collect_outputs(root, [pattern])
            msg = str(e.value)
            assert f"out/{name}" in msg and target in msg and why in msg and "build.outputs" in msg, msg
        (root / "out" / name).unlink()
    # A glob through a directory link leaving the tree names the link, not what it reached.
    (root / "etc").symlink_to("/etc")
    with pytest.raises(step.OutputsUnsafe, match="build output etc is a link to '/etc'"):
        step.collect_outputs(root, ["etc/passwd"])
    with pytest.raises(step.OutputsUnsafe, match="outside the build's tree"):
        step.collect_outputs(root, ["../outside/*"])


def test_a_build_leaving_a_link_out_of_its_tree_fails_naming_it(tmp_path: Path) -> None:
    from gearfarm.formats import catalog as catalog_mod
    from gearfarm.step import runner as step
    from gearfarm.step.sandbox import Sandbox

    cat = catalog_mod.parse('schema = 2\n[build]\nargv = ["sh", "-c", "mkdir out && echo x > out/a && '
                            'ln -s /etc/passwd out/leak"]\noutputs = ["out"]\n'
                            '[targets.linux-x86_64]\ntools = ["sh"]\n', "hostile")
    root, scratch = tmp_path / "root", tmp_path / "scratch"
    root.mkdir()
    scratch.mkdir()
    run = step.run_build(cat, cat.target("linux-x86_64"), root, scratch, tmp_path / "build.log", Sandbox("none"))
    assert run.status == "failed" and run.outputs == []
    assert "out/leak" in run.error and "/etc/passwd" in run.error, run.error
    assert run.error in (tmp_path / "build.log").read_text()


def test_links_are_packed_as_links_reproducibly_and_unpacked_verified(tmp_path: Path) -> None:
    from gearfarm.step import runner as step

    packs = []
    for where in ("a", "elsewhere/b"):
        root = _linked_outputs(tmp_path / where)
        dest = tmp_path / f"{where.replace('/', '-')}.tar.zst"
        packs.append((dest, artifact.pack(root, step.collect_outputs(root, ["out"]), _meta(), dest)))
    # The absolute link was made relative, so two trees at two places pack the same bytes.
    assert packs[0][0].read_bytes() == packs[1][0].read_bytes()
    man = packs[0][1]
    assert man["files"]["out/lib.so"] == {"link": "lib.so.1"}
    assert man["files"]["out/abs.so"] == {"link": "lib.so.1"}
    assert man["files"]["out/include"] == {"link": "../src"}
    assert man["files"]["out/lib.so.1"]["sha256"] == hashlib.sha256(LIB).hexdigest()
    with artifact.open_tar(packs[0][0]) as tar:
        links = {m.name: m for m in tar.getmembers() if m.issym()}
    assert sorted(links) == ["out/abs.so", "out/include", "out/lib.so"]
    for m in links.values():
        assert (m.mode, m.mtime, m.uid, m.gid, m.uname, m.size) == (0o777, 0, 0, 0, "", 0), m.name

    tree = tmp_path / "unpacked"
    got = artifact.unpack(packs[0][0], tree, man["archive_sha256"])
    assert got["files"] == man["files"]
    assert os.readlink(tree / "out" / "lib.so") == "lib.so.1"
    assert (tree / "out" / "abs.so").read_bytes() == LIB
    assert (tree / "out" / "tool").read_bytes() == EXE and os.access(tree / "out" / "tool", os.X_OK)
    # The include link dangles in the artifact (src is not an output); over the source it leads to it.
    assert os.readlink(tree / "out" / "include") == "../src" and not (tree / "out" / "include").exists()


def test_pack_follows_no_link_out_of_the_tree(tmp_path: Path) -> None:
    """pack() checks on its own what it is given: a link leaving the tree, a file reached through
    a directory link, a file that is a link where the list says file."""
    root = tmp_path / "root"
    (root / "out").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("the worker's secret")
    (root / "out" / "leak").symlink_to(outside / "secret")
    (root / "via").symlink_to(outside)
    for files, why in [(["out/leak"], "outside the build's tree"), (["via/secret"], "through a link")]:
        dest = tmp_path / "a.tar.zst"
        with pytest.raises(artifact.ArtifactError, match=why):
            artifact.pack(root, files, _meta(), dest)
        assert not dest.exists() or b"the worker's secret" not in zstandard.ZstdDecompressor().decompressobj() \
            .decompress(dest.read_bytes())


def test_unpack_refuses_a_link_its_manifest_does_not_list_and_leaves_nothing(tmp_path: Path) -> None:
    """A member that is a link where the manifest says file (or another link target) is refused,
    and what was extracted is removed: nothing unverified is left to run."""
    for member, entry in [(_member("out/lib.so", tarfile.SYMTYPE, "lib.so.2"), {"link": "lib.so.1"}),
                          (_member("out/lib.so", tarfile.SYMTYPE, "lib.so.1"),
                           {"sha256": hashlib.sha256(LIB).hexdigest(), "size": len(LIB), "mode": "644"})]:
        body = artifact.canonical_json({"rev": REV, "target": "linux-x86_64", "files": {
            "out/lib.so.1": {"sha256": hashlib.sha256(LIB).hexdigest(), "size": len(LIB), "mode": "644"},
            "out/lib.so.2": {"sha256": hashlib.sha256(LIB).hexdigest(), "size": len(LIB), "mode": "644"},
            "out/lib.so": entry}})
        archive = tmp_path / "forged.tar.gz"
        sha = _tar_gz(archive, [(_member("out/lib.so.1"), LIB), (_member("out/lib.so.2"), LIB), (member, None),
                                (_member(artifact.MANIFEST), body)])
        tree = tmp_path / "tree"
        with pytest.raises(artifact.ArtifactError, match="out/lib.so does not match its manifest"):
            artifact.unpack(archive, tree, sha)
        assert list(tree.iterdir()) == []


def test_a_small_file_goes_up_without_waiting_for_100_continue(store: ArtifactStore, tmp_path: Path) -> None:
    """botocore sends every S3 PUT with "Expect: 100-continue" and waits for the server's
    interim answer before the body: a round trip more on each of a job's PUTs (its log, its
    JUnit file, its record's copy). A body up to INLINE_PUT goes with the headers; a larger one
    still waits; all arrive whole."""
    small, large = tmp_path / "log.txt", tmp_path / "large.bin"
    small.write_bytes(b"a line of a job's log\n" * 1000)
    large.write_bytes(os.urandom(store_mod.INLINE_PUT + 1))
    sent: list[tuple[str, str | None]] = []
    store.s3.meta.events.register("before-send.s3.PutObject", lambda request, **_: sent.append(
        (request.url.rsplit("/", 1)[-1], request.headers.get("Expect"))))
    store.put_file("t/inline/log.txt", small, "text/plain")
    assert store.put_file_if_absent("t/inline/first.txt", small, "text/plain") is True
    store.put_bytes("t/inline/bytes.txt", b"a record")
    store.put_file("t/inline/large.bin", large)
    assert sent == [("log.txt", None), ("first.txt", None), ("bytes.txt", None), ("large.bin", b"100-continue")]
    assert store.get_bytes("t/inline/log.txt") == store.get_bytes("t/inline/first.txt") == small.read_bytes()
    assert store.get_bytes("t/inline/large.bin") == large.read_bytes()
    assert store.get_bytes("t/inline/bytes.txt") == b"a record"
