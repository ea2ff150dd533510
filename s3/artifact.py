"""Packing build outputs into a reproducible artifact with a manifest, publishing it to the store
without races, and unpacking one safely.

The manifest lists the sha256 of every file (and the target of every link); unpack() checks the
archive's own sha256 and then every file and link before a caller may run anything from it, and
refuses absolute paths, `..` and links that point outside: each member against the tree as
extracted so far (the rules of tarfile's "data" filter; see _checked), every link again against
the final tree, so that no chain of links made by later members reaches out. A refused archive
leaves nothing extracted behind.

pack() reads the build's tree following no link: a symlink among the outputs is packed as a link
to the path inside the tree it leads to, or refused when it leads out (link_target).

pack() is byte-reproducible: the same file contents and meta give the same archive on any host,
at any time, under any user or umask (given the same zstd library version; see publish() for
why correctness does not depend on it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import zstandard
from botocore.exceptions import ClientError

from gearfarm.s3 import keys
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


class Replaced(ArtifactError):
    """An object at a build's keys that no build the farm signed made: replaced or planted
    outside the farm (a role's keys can write any object of their target)."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


def quarantine(store: ArtifactStore, prefix: str, at: float) -> dict[str, str]:
    """Move every object under the artifact ``prefix`` (keys.artifact_prefix: its archive,
    manifest and provenance, which describe one another) aside, under keys.quarantine, where it
    is kept for a look; the keys moved and where to. Copied first, deleted after: an object is
    never only in flight."""
    moved = {key: keys.quarantine(key, at) for key in store.list(prefix.rstrip("/") + "/")}
    for key, aside in moved.items():
        store.copy(key, aside)
    store.delete(list(moved))
    return moved


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


def link_target(root: Path, name: str) -> str:
    """What the symlink ``name`` (relative to ``root``, with no link above it) is packed as: the
    path from its directory to the file or directory it leads to, relative. ArtifactError when
    it leads out of ``root`` (an absolute path elsewhere, `..` past the root, a link to such a
    link) or nowhere: the worker, outside the sandbox, must never carry a host file out, and a
    dangling link would be resolved against whatever tree it is unpacked into.

    The target is stored resolved rather than as written: it then means the same in any tree
    it is unpacked into (an absolute link into the build's tree becomes relative, a chain
    through other links no longer depends on them), and the archive stays byte-reproducible
    whatever directory the build ran in."""
    real_root = os.path.realpath(root)
    path = os.path.join(real_root, name)
    written = os.readlink(path)
    real = os.path.realpath(path)
    if not _inside(real_root, real):
        raise ArtifactError(f"build output {name} is a link to {written!r}, which leads to {real}, outside the "
                            "build's tree")
    if not os.path.exists(path):
        raise ArtifactError(f"build output {name} is a link to {written!r}, which leads nowhere (no such file "
                            "in the build's tree)")
    return os.path.relpath(real, os.path.dirname(path))


def _open_beneath(root_fd: int, path: str, output: str) -> int:
    """An fd of ``path`` under the directory ``root_fd``, opened one component at a time with
    O_NOFOLLOW: a link anywhere on the way (a directory swapped for a link to /etc, the file
    itself a link) is an error naming build output ``output``, never followed. O_NONBLOCK so
    that a fifo cannot hang the worker."""
    parts = path.split("/") if path else []
    if any(p in ("", ".", "..") for p in parts) or os.path.isabs(output):
        raise ArtifactError(f"build output {output!r} is not a plain path relative to the build's tree")
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1 and path == output
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                raise ArtifactError(f"build output {output} is missing from the build's tree") from None
            except OSError as e:
                raise ArtifactError(f"build output {output} is reached through a link ({part!r}: {e.strerror}): "
                                    "outputs are never read through a link") from e
            os.close(fd)
            fd = nxt
        return os.dup(fd)
    finally:
        os.close(fd)


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def pack(out_dir: Path, files: list[str], meta: dict[str, Any], dest: Path) -> dict[str, Any]:
    """Write ``dest`` (tar.zst) with ``files`` from ``out_dir`` plus manifest.json; return the
    manifest (with the archive's sha256 added, for the separate manifest object).

    A name that is a symlink is packed as one, to the path inside ``out_dir`` it leads to
    (link_target; one leading out or nowhere is refused), and listed as {"link": target};
    every other name must be a regular file reached through no link (read with O_NOFOLLOW).

    Byte-reproducible: members in sorted order with manifest.json last, mtime 0, owner 0:0 with
    empty names, mode 0o755 when the file's owner-execute bit is set else 0o644 (links 0o777),
    plain ustar headers (no pax records), compressed with the archive codec (no time, no name).
    Anything that varies between builds (a timestamp, the builder's name) in ``meta`` varies the
    archive too.
    """
    names = sorted(set(files))
    if MANIFEST in names:
        raise ArtifactError(f"build output {MANIFEST} would collide with the artifact's own manifest")
    manifest = dict(meta)
    manifest["files"] = {}
    modes: dict[str, int] = {}
    try:
        root_fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise ArtifactError(f"cannot pack from {out_dir}: {e}") from e
    try:
        for name in names:
            parent, base = os.path.split(name)
            parent_fd = _open_beneath(root_fd, parent, name)
            try:
                st = os.lstat(base, dir_fd=parent_fd)
            except FileNotFoundError:
                raise ArtifactError(f"build output {name} is missing from {out_dir}") from None
            finally:
                os.close(parent_fd)
            if stat.S_ISLNK(st.st_mode):
                manifest["files"][name] = {"link": link_target(out_dir, name)}
                continue
            fd = _open_beneath(root_fd, name, name)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise ArtifactError(f"build output {name} in {out_dir} is not a regular file")
                modes[name] = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                manifest["files"][name] = {"sha256": _sha256_fd(fd), "size": st.st_size, "mode": f"{modes[name]:o}"}
            finally:
                os.close(fd)
        body = canonical_json(manifest)
        try:
            with compressed(dest) as out, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                for name in names:
                    entry = manifest["files"][name]
                    if "link" in entry:
                        info = _member(name, 0, 0o777)
                        info.type, info.linkname = tarfile.SYMTYPE, entry["link"]
                        tar.addfile(info)
                        continue
                    # Opened again the same way: what is read is what was hashed, or unpack()
                    # refuses it by the manifest's sha256.
                    with os.fdopen(_open_beneath(root_fd, name, name), "rb") as f:
                        tar.addfile(_member(name, entry["size"], modes[name]), f)
                tar.addfile(_member(MANIFEST, len(body), 0o644), io.BytesIO(body))
        except (ValueError, OSError, tarfile.TarError) as e:
            raise ArtifactError(f"cannot pack {dest} from {out_dir}: {e}") from e
    except ArtifactError:
        dest.unlink(missing_ok=True)
        raise
    finally:
        os.close(root_fd)
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
            manifest: dict[str, Any], signed: list[str] | None = None) -> dict[str, Any]:
    """Upload a packed artifact so that concurrent builds of the same key agree, and return the
    manifest that describes what is now stored.

    The archive is written only if ``archive_key`` is absent. If an archive is there already,
    the stored one wins (another build got there first): the returned manifest is the
    manifest.json inside it with its ``archive_sha256``/``archive_size``, so the sha256 handed to
    test jobs always verifies against what they will download. Given ``signed`` (the sha256s of
    the builds the farm's records name, as the build worker always gives it), the stored one is
    used only when it is byte for byte this build's (builds pack reproducibly) or one of those:
    anything else was put there outside the farm (a role key can write any object) and raises
    Replaced naming both digests, before anything is written. The manifest object is written if
    absent; one that already exists must name the same archive sha256, or this raises Replaced.
    An existing object is never overwritten: the caller moves a replaced one aside (quarantine)
    and publishes again.

    ``manifest`` is what pack() returned for ``archive_path``. The returned dict is the
    manifest plus keys that are not part of it (strip them before storing it anywhere):
    ``uploaded_bytes`` (archive and manifest bytes this call wrote, 0 when both existed),
    ``raced`` (True when the archive key already existed, i.e. the stored archive is used) and
    ``manifest_sha256`` (of the manifest object as S3 now holds it: what the build's record says).
    """
    local_sha = sha256_file(archive_path)
    if manifest.get("archive_sha256") != local_sha:
        raise ArtifactError(f"manifest for {archive_path} names archive sha256 {manifest.get('archive_sha256')}, "
                            f"but the file has {local_sha}: pass the manifest pack() returned for it")
    uploaded = 0
    raced = not store.put_file_if_absent(archive_key, archive_path, ARCHIVE_TYPE)
    if raced:
        final = _stored_manifest(store, archive_key, archive_path.parent)
        if signed is not None and final["archive_sha256"] not in (local_sha, *signed):
            raise Replaced(
                f"artifact {archive_key} in S3 has sha256 {final['archive_sha256']}, which no build the farm signed "
                f"has, and this build made {local_sha}: it was replaced or planted outside the farm", archive_key)
    else:
        uploaded += archive_path.stat().st_size
        final = dict(manifest)

    body = canonical_json(final)
    if store.put_bytes_if_absent(manifest_key, body, "application/json"):
        uploaded += len(body)
    else:
        try:
            body = store.get_bytes(manifest_key)
            existing = json.loads(body)
            existing_sha = existing["archive_sha256"]
        except (ValueError, KeyError, TypeError) as e:
            raise Replaced(f"manifest object {manifest_key} exists but is not a valid manifest ({e}): it was "
                           "replaced or planted outside the farm", manifest_key) from e
        if existing_sha != final["archive_sha256"]:
            raise Replaced(
                f"manifest object {manifest_key} names archive sha256 {existing_sha}, but the stored archive "
                f"{archive_key} has sha256 {final['archive_sha256']}: the manifest was replaced or planted outside "
                "the farm, or written for another archive", manifest_key)
    return {**final, "uploaded_bytes": uploaded, "raced": raced, "manifest_sha256": hashlib.sha256(body).hexdigest()}


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
    """Verify and unpack; raise ArtifactError before anything unverified is left runnable (what
    was extracted is removed again)."""
    got: dict[str, Any] = {}

    def verify(root: Path) -> None:
        try:
            manifest = json.loads((root / MANIFEST).read_text())
            files: dict[str, dict[str, Any]] = manifest["files"]
            items = list(files.items())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ArtifactError(f"artifact has no valid {MANIFEST}: {e}") from e
        for name, info in items:
            if os.path.isabs(name) or ".." in Path(name).parts:
                raise ArtifactError(f"artifact manifest names {name!r}, outside the artifact: not one the farm made")
            p = root / name
            if isinstance(info, dict) and "link" in info:
                # Where it leads was checked by safe_extract (inside, in the final tree).
                if not p.is_symlink() or os.readlink(p) != info["link"]:
                    raise ArtifactError(f"artifact link {name} does not match its manifest (-> {info['link']!r})")
                continue
            if p.is_symlink() or not p.is_file() or sha256_file(p) != info.get("sha256"):
                raise ArtifactError(f"artifact file {name} does not match its manifest sha256")
            p.chmod(int(str(info.get("mode", "644")), 8) & 0o755)
        got.update(manifest)

    safe_extract(archive, dest, expected_sha256, "artifact", verify)
    return got


def safe_extract(archive: Path, dest: Path, expected_sha256: str, what: str,
                 verify: Callable[[Path], None] | None = None) -> None:
    """Check ``archive``'s sha256, then extract it (tar.zst, or tar.gz) under ``dest`` and nowhere
    else, with no link of the final tree (``dest`` as it was plus the archive) leading out of it;
    then ``verify(dest)``, if given. Any refusal (ArtifactError) removes what was extracted, so
    nothing half-unpacked or unverified is left to run."""
    actual = sha256_file(archive)
    if actual != expected_sha256:
        raise ArtifactError(f"{what} sha256 is {actual}, expected {expected_sha256}: corrupt or tampered")
    fresh = not os.path.lexists(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(dest)
    written: list[str] = []
    try:
        try:
            with open_tar(archive) as tar:
                for m in tar:
                    _checked(m, root, what)
                    written.append(_first_new(root, m.name))
                    # Owners and times are not restored (the job's user owns its tree); modes are
                    # set as the data filter sets them (tarfile makes directories 0700 until then).
                    tar.extract(m, root, set_attrs=False)
                    if m.isfile() or m.isdir():
                        os.chmod(os.path.join(root, m.name), _mode(m))
            _links_stay_inside(root, what)
        except (tarfile.TarError, OSError) as e:
            raise ArtifactError(f"{what} cannot be unpacked safely: {e}") from e
        if verify is not None:
            verify(Path(root))
    except ArtifactError:
        _remove(root, written, fresh)
        raise


# Two checks, because a link is followed twice. While extracting, tarfile follows links that
# exist at that moment (the directories above a member, the file a hard link names, a regular
# member whose name is a link): _checked resolves each member against the tree as extracted
# so far, so nothing is written or linked outside. A symlink's target, though, is resolved only
# when something uses it, against the tree as it is then: `p -> a/a/../../../etc/passwd`
# checked while `a` does not exist is inside, and `a -> .` (inside too) carries it out later.
# No finer member-time rule can see that (a link may name a path made by a later member, or by
# the tree it is unpacked over), so _links_stay_inside resolves every link against the final
# tree, before anything from it runs.
#
# Why by hand: tarfile's "data" extraction filter (PEP 706) applies the member rules, but it
# came in Python 3.11.4, and Debian 12's own Python, which lab hosts and the farm's images run,
# is 3.11.2 (extractall(filter=...) is a TypeError there); nor does it see link chains. Where
# the filter would quietly make an absolute name relative, this refuses it: an archive the farm
# made never has one, so its presence means tampering.
def _checked(m: tarfile.TarInfo, root: str, what: str) -> tarfile.TarInfo:
    def inside(path: str) -> bool:
        return _inside(root, os.path.realpath(path))

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


def _inside(root: str, real: str) -> bool:
    return os.path.commonpath([root, real]) == root


def _links_stay_inside(root: str, what: str) -> None:
    """Every symlink under ``root`` (the unpacked tree, whatever was there before included),
    resolved as the kernel will, leads to ``root`` or below; links to directories are checked,
    never descended."""
    for d, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            p = os.path.join(d, name)
            if os.path.islink(p) and not _inside(root, real := os.path.realpath(p)):
                rel = os.path.relpath(p, root)
                raise ArtifactError(
                    f"{what} cannot be unpacked safely: link {rel!r} -> {os.readlink(p)!r} leads to {real}, outside "
                    "the destination, once the whole archive is unpacked (through links made after it); "
                    "the archive is not one the farm made")


def _first_new(root: str, name: str) -> str:
    """The path that removes what extracting member ``name`` makes: its topmost directory that
    does not exist yet (tarfile makes the missing ones), or the member itself unless it is a
    directory that was already there ("" then: the tree's own directories stay). Recorded with
    the directories above it resolved now (they are checked to be inside), so removing it later
    can follow no link a later member made."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    at = root
    for i, part in enumerate(parts):
        path = os.path.join(at, part)
        if not os.path.lexists(path):
            return path
        if i == len(parts) - 1:
            return "" if os.path.isdir(path) and not os.path.islink(path) else path
        at = os.path.realpath(path)
    return ""


def _remove(root: str, written: list[str], fresh: bool) -> None:
    """Undo an extraction: everything in the destination if this extraction made it (the empty
    directory stays, as the caller asked for it), else each path ``written`` (newest first),
    never through a link: a path whose directory no longer resolves to itself is left alone,
    since what a link there points at is not ours. (shutil.rmtree follows no link either.)"""
    if fresh:
        written = [os.path.join(root, name) for name in os.listdir(root)]
    for path in reversed(written):
        if not path or path == root or not _inside(root, path) or \
                os.path.realpath(os.path.dirname(path)) != os.path.dirname(path):
            continue
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass


def _mode(m: tarfile.TarInfo) -> int:
    """The data filter's modes: a file keeps no setuid, setgid or sticky bit and nothing writable
    by group or others, and its owner (the job's own user) can always read and write it; a
    directory is 0755, as the filter leaves it to the umask."""
    return (m.mode & 0o755) | 0o600 if m.isfile() else 0o755
