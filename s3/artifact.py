"""Packing build outputs into a reproducible artifact with a manifest, publishing it to the store
without races, and unpacking one safely.

The manifest lists the sha256 of every file; unpack() checks the archive's own sha256 and then
every file before a caller may run anything from it, and refuses absolute paths, `..` and
links that point outside (the rules of tarfile's "data" filter; see _checked).

pack() is byte-reproducible: the same file contents and meta give the same archive on any host,
at any time, under any user or umask (given the same zstd library version; see publish() for
why correctness does not depend on it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import zstandard
from botocore.exceptions import ClientError

from gearfarm.s3.store import ArtifactStore, StoreError, sha256_file

# Inside the tree's own namespace: the artifact is unpacked into a job's tree (over the source
# snapshot, for suites that read it), where a project may well have a manifest.json of its own.
MANIFEST = ".gearfarm/manifest.json"
# Any constant would do: an archive must not record when it was packed.
FIXED_MTIME = 0
# The archive codec, for artifacts and source snapshots alike: zstd at level 3. Measured on the
# engine's build outputs (2.8 MB of tar for linux-aarch64): gzip -6 packed it in 126 ms to 1.29 MB
# and unpacked it in 11 ms, zstd -3 in 7 ms to 0.60 MB and 1.8 ms; both on every build's path to
# its tests, and the smaller archive moves through S3 twice. zstd's output is the same for the same
# bytes whatever the write sizes, so archives stay byte-reproducible. Reading also accepts gzip,
# the codec of archives stored before (their keys end in .tar.gz).
ARCHIVE_LEVEL = 3
ARCHIVE_SUFFIX = ".tar.zst"
ARCHIVE_TYPE = "application/zstd"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_GZIP_MAGIC = b"\x1f\x8b"


class ArtifactError(RuntimeError):
    """An artifact is incomplete, tampered with, or unsafe to unpack."""


def canonical_json(obj: Any) -> bytes:
    """The one serialisation of a manifest, so equal manifests are equal bytes."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode()


@contextmanager
def compressed(dest: Path) -> Iterator[IO[bytes]]:
    """A file whose bytes are written to ``dest`` compressed with the archive codec."""
    with dest.open("wb") as raw, \
            zstandard.ZstdCompressor(level=ARCHIVE_LEVEL, write_checksum=True).stream_writer(raw) as out:
        yield out  # type: ignore[misc]


@contextmanager
def open_tar(archive: Path) -> Iterator[tarfile.TarFile]:
    """``archive`` (zstd, or gzip from before) opened as a tar file for random access."""
    with archive.open("rb") as f:
        magic = f.read(4)
        f.seek(0)
        if magic.startswith(_GZIP_MAGIC):
            with tarfile.open(fileobj=f, mode="r:gz") as tar:
                yield tar
            return
        if magic != _ZSTD_MAGIC:
            raise tarfile.ReadError(f"{archive.name} is neither zstd nor gzip (starts with {magic!r})")
        # tarfile reads members out of order (getmembers, then extract), so the tar is
        # decompressed first: in memory up to 64 MiB, in a temporary file beyond.
        with tempfile.SpooledTemporaryFile(64 << 20) as tar_bytes:
            try:
                zstandard.ZstdDecompressor().copy_stream(f, tar_bytes, write_size=1 << 20)
            except zstandard.ZstdError as e:
                raise tarfile.ReadError(f"{archive.name}: {e}") from e
            tar_bytes.seek(0)
            with tarfile.open(fileobj=tar_bytes, mode="r:") as tar:  # type: ignore[call-overload]
                yield tar


def _member(name: str, size: int, mode: int) -> tarfile.TarInfo:
    # Built from scratch rather than gettarinfo(): nothing of the packing host (owner, times,
    # umask-dependent group/other bits, device numbers) may reach the archive.
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = mode
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack(out_dir: Path, files: list[str], meta: dict[str, Any], dest: Path) -> dict[str, Any]:
    """Write ``dest`` (tar.zst) with ``files`` from ``out_dir`` plus manifest.json; return the
    manifest (with the archive's sha256 added, for the separate manifest object).

    Byte-reproducible: members in sorted order with manifest.json last, mtime 0, owner 0:0 with
    empty names, mode 0o755 when the file's owner-execute bit is set else 0o644, plain ustar
    headers (no pax records), compressed with the archive codec (no time, no name). Anything that
    varies between builds (a timestamp, the builder's name) in ``meta`` varies the archive too.
    """
    names = sorted(set(files))
    if MANIFEST in names:
        raise ArtifactError(f"build output {MANIFEST} would collide with the artifact's own manifest")
    manifest = dict(meta)
    manifest["files"] = {}
    modes: dict[str, int] = {}
    for name in names:
        p = out_dir / name
        if not p.is_file():
            raise ArtifactError(f"build output {name} is missing from {out_dir}")
        st = p.stat()
        modes[name] = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
        manifest["files"][name] = {"sha256": sha256_file(p), "size": st.st_size, "mode": f"{modes[name]:o}"}
    body = canonical_json(manifest)
    try:
        with compressed(dest) as out, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name in names:
                with (out_dir / name).open("rb") as f:
                    tar.addfile(_member(name, manifest["files"][name]["size"], modes[name]), f)
            tar.addfile(_member(MANIFEST, len(body), 0o644), io.BytesIO(body))
    except (ValueError, OSError, tarfile.TarError) as e:
        raise ArtifactError(f"cannot pack {dest} from {out_dir}: {e}") from e
    manifest["archive_sha256"] = sha256_file(dest)
    manifest["archive_size"] = dest.stat().st_size
    return manifest


def read_manifest(archive: Path) -> dict[str, Any]:
    """The manifest.json inside ``archive``, read without extracting anything."""
    try:
        with open_tar(archive) as tar:
            f = tar.extractfile(MANIFEST)
            if f is None:
                raise ArtifactError(f"{MANIFEST} in {archive} is not a regular file")
            manifest = json.loads(f.read())
    except (tarfile.TarError, OSError, KeyError, ValueError) as e:
        raise ArtifactError(f"artifact {archive} has no readable {MANIFEST}: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ArtifactError(f"artifact {archive} has no valid {MANIFEST}")
    return manifest


def publish(store: ArtifactStore, archive_key: str, manifest_key: str, archive_path: Path,
            manifest: dict[str, Any]) -> dict[str, Any]:
    """Upload a packed artifact so that concurrent builds of the same key agree, and return the
    manifest that describes what is now stored.

    The archive is written only if ``archive_key`` is absent. If another build got there first,
    the stored archive wins even when it is not byte-identical to ours (another host's zstd,
    another ``meta``): it is downloaded, and the returned manifest is the manifest.json inside
    it with ``archive_sha256``/``archive_size`` of the stored object, so the sha256 handed to
    test jobs always verifies against what they will download. The manifest object is then
    written if absent; one that already exists must name the same archive sha256, or this
    raises ArtifactError (an existing object is never overwritten).

    ``manifest`` is what pack() returned for ``archive_path``. The returned dict is the
    manifest plus two keys that are not part of it (strip them before storing it anywhere):
    ``uploaded_bytes`` (archive and manifest bytes this call wrote, 0 when both existed) and
    ``raced`` (True when the archive key already existed, i.e. the stored archive is used).
    """
    local_sha = sha256_file(archive_path)
    if manifest.get("archive_sha256") != local_sha:
        raise ArtifactError(f"manifest for {archive_path} names archive sha256 {manifest.get('archive_sha256')}, "
                            f"but the file has {local_sha}: pass the manifest pack() returned for it")
    uploaded = 0
    raced = not store.put_file_if_absent(archive_key, archive_path, ARCHIVE_TYPE)
    if raced:
        final = _stored_manifest(store, archive_key, archive_path.parent)
    else:
        uploaded += archive_path.stat().st_size
        final = dict(manifest)

    body = canonical_json(final)
    if store.put_bytes_if_absent(manifest_key, body, "application/json"):
        uploaded += len(body)
    else:
        try:
            existing = json.loads(store.get_bytes(manifest_key))
            existing_sha = existing["archive_sha256"]
        except (ValueError, KeyError, TypeError) as e:
            raise ArtifactError(f"manifest object {manifest_key} exists but is not a valid manifest ({e}); "
                                "it is never overwritten: delete it by hand if it is garbage") from e
        if existing_sha != final["archive_sha256"]:
            raise ArtifactError(
                f"manifest object {manifest_key} names archive sha256 {existing_sha}, but the stored archive "
                f"{archive_key} has sha256 {final['archive_sha256']}: the manifest was tampered with or "
                "written for another archive; refusing to overwrite it")
    return {**final, "uploaded_bytes": uploaded, "raced": raced}


def _stored_manifest(store: ArtifactStore, archive_key: str, tmp_dir: Path) -> dict[str, Any]:
    """The manifest of the archive already at ``archive_key``, with that object's sha256/size."""
    fd, name = tempfile.mkstemp(prefix=".stored-", suffix=ARCHIVE_SUFFIX, dir=tmp_dir)
    os.close(fd)
    stored = Path(name)
    try:
        try:
            size = store.get_file(archive_key, stored)
        except (ClientError, StoreError) as e:
            raise ArtifactError(f"archive {archive_key} exists in the store but cannot be downloaded: {e}") from e
        manifest = read_manifest(stored)
        manifest["archive_sha256"] = sha256_file(stored)
        manifest["archive_size"] = size
        return manifest
    finally:
        stored.unlink(missing_ok=True)


def unpack(archive: Path, dest: Path, expected_sha256: str) -> dict[str, Any]:
    """Verify and unpack; raise ArtifactError before anything unverified is left runnable."""
    safe_extract(archive, dest, expected_sha256, "artifact")
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
        files: dict[str, dict[str, Any]] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"artifact has no valid {MANIFEST}: {e}") from e
    for name, info in files.items():
        p = dest / name
        if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != info.get("sha256"):
            raise ArtifactError(f"artifact file {name} does not match its manifest sha256")
        p.chmod(int(str(info.get("mode", "644")), 8) & 0o755)
    return manifest


def safe_extract(archive: Path, dest: Path, expected_sha256: str, what: str) -> None:
    """Check ``archive``'s sha256, then extract it (tar.zst, or tar.gz) under ``dest`` and nowhere else."""
    actual = sha256_file(archive)
    if actual != expected_sha256:
        raise ArtifactError(f"{what} sha256 is {actual}, expected {expected_sha256}: corrupt or tampered")
    dest.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(dest)
    try:
        with open_tar(archive) as tar:
            for m in tar:
                # Owners and times are not restored (the job's user owns its tree); modes are
                # set as the data filter sets them (tarfile makes directories 0700 until then).
                tar.extract(_checked(m, root, what), root, set_attrs=False)
                if m.isfile() or m.isdir():
                    os.chmod(os.path.join(root, m.name), _mode(m))
    except (tarfile.TarError, OSError) as e:
        raise ArtifactError(f"{what} cannot be unpacked safely: {e}") from e


# Why by hand: tarfile's "data" extraction filter (PEP 706) applies exactly these rules, but it
# came in Python 3.11.4, and Debian 12's own Python, which lab hosts and the farm's images run,
# is 3.11.2 (extractall(filter=...) is a TypeError there). Where the filter would quietly make an
# absolute name relative, this refuses it: an archive the farm made never has one, so its
# presence means tampering. Each member is checked against the tree as extracted so far, so a
# link made by one member cannot carry a later one outside.
def _checked(m: tarfile.TarInfo, root: str, what: str) -> tarfile.TarInfo:
    def inside(path: str) -> bool:
        return os.path.commonpath([root, os.path.realpath(path)]) == root

    def refuse(why: str) -> ArtifactError:
        return ArtifactError(f"{what} cannot be unpacked safely: member {m.name!r} {why}; "
                             "the archive is not one the farm made")

    if os.path.isabs(m.name) or ".." in Path(m.name).parts or not inside(os.path.join(root, m.name)):
        raise refuse("would be written outside the destination")
    if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
        raise refuse("is a device, fifo or other special file")
    if m.issym() or m.islnk():
        base = os.path.dirname(m.name) if m.issym() else ""
        if os.path.isabs(m.linkname) or not inside(os.path.join(root, base, m.linkname)):
            raise refuse(f"links outside the destination ({m.linkname!r})")
    return m


def _mode(m: tarfile.TarInfo) -> int:
    """The data filter's modes: a file keeps no setuid, setgid or sticky bit and nothing writable
    by group or others, and its owner (the job's own user) can always read and write it; a
    directory is 0755, as the filter leaves it to the umask."""
    return (m.mode & 0o755) | 0o600 if m.isfile() else 0o755
