"""Packing build outputs into an artifact with a manifest, and unpacking one safely.

The manifest lists the sha256 of every file; unpack() checks the archive's own sha256 and then
every file before a caller may run anything from it, and refuses absolute paths, `..` and
links that point outside (tarfile's "data" filter, which does exactly this).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from gearfarm.s3.store import sha256_file

MANIFEST = "manifest.json"


class ArtifactError(RuntimeError):
    """An artifact is incomplete, tampered with, or unsafe to unpack."""


def pack(out_dir: Path, files: list[str], meta: dict[str, Any], dest: Path) -> dict[str, Any]:
    """Write ``dest`` (tar.gz) with ``files`` from ``out_dir`` plus manifest.json; return the
    manifest (with the archive's sha256 added, for the separate manifest object)."""
    manifest = dict(meta)
    manifest["files"] = {}
    for name in files:
        p = out_dir / name
        if not p.is_file():
            raise ArtifactError(f"build output {name} is missing from {out_dir}")
        manifest["files"][name] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    body = json.dumps(manifest, indent=2, sort_keys=True).encode()
    with tarfile.open(dest, "w:gz") as tar:
        for name in files:
            tar.add(out_dir / name, arcname=name, recursive=False)
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(body)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(body))
    manifest["archive_sha256"] = sha256_file(dest)
    manifest["archive_size"] = dest.stat().st_size
    return manifest


def unpack(archive: Path, dest: Path, expected_sha256: str) -> dict[str, Any]:
    """Verify and unpack; raise ArtifactError before anything unverified is left runnable."""
    actual = sha256_file(archive)
    if actual != expected_sha256:
        raise ArtifactError(f"artifact sha256 is {actual}, expected {expected_sha256}: corrupt or tampered")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for m in tar.getmembers():
                # The "data" filter would quietly make an absolute name relative; an artifact
                # we packed never has one, so its presence means tampering: refuse it.
                if m.name.startswith("/") or ".." in Path(m.name).parts:
                    raise tarfile.OutsideDestinationError(m, m.name)
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise ArtifactError(f"artifact cannot be unpacked safely: {e}") from e
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
        files: dict[str, dict[str, Any]] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"artifact has no valid {MANIFEST}: {e}") from e
    for name, info in files.items():
        p = dest / name
        if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != info.get("sha256"):
            raise ArtifactError(f"artifact file {name} does not match its manifest sha256")
        p.chmod(0o755 if name.endswith(".exe") or "." not in name else 0o644)
    return manifest
