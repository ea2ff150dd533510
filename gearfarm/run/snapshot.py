"""What a run is made of, moved through S3: a project's tree at one commit (the source snapshot)
and the catalog the nightly validated. The nightly is the only part of the farm that runs git:
it fetches the project, resolves the revision, and uploads each object once, content-addressed
(a second nightly at the same revision moves 0 bytes). Workers download both by the sha256 in
their signed payload, check it, and need no clone, no git and no network but gearmand and S3.
A snapshot holds the revision's submodules too (run/submodules.py): their commits are pinned
by the revision's tree, so the snapshot is still a function of the revision alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from botocore.exceptions import ClientError

from gearfarm.config import Config, ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import Catalog, CatalogError
from gearfarm.run import submodules
from gearfarm.run.gitrun import SourceError
from gearfarm.run.gitrun import git as _git
from gearfarm.run.gitrun import stderr_text as _err
from gearfarm.run.submodules import Module
from gearfarm.s3 import keys
from gearfarm.s3.artifact import ARCHIVE_SUFFIX, ARCHIVE_TYPE, ArtifactError, compressed, safe_extract
from gearfarm.s3.store import ArtifactStore, StoreError, sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """A revision's tree in S3 and what moving it cost."""

    rev: str
    sha256: str
    size: int
    uploaded_bytes: int


def module_mirrors(cfg: Config, project: ProjectConfig) -> Path:
    """Where the nightly keeps the mirrors of ``project``'s submodules (never in the project's own
    clone, which belongs to its team): kept, so a later night fetches only what is new."""
    return cfg.path(cfg.farm.state_dir) / "repos" / project.name / "modules"


def repository(cfg: Config, project: ProjectConfig) -> Path:
    """A git repository holding the project's commits. A path is used in place (it is the
    project's own clone); anything else is a URL, mirrored under the state directory and
    fetched now, so tonight's commits are there however recently they were pushed."""
    local = project.local_repo(cfg.path("."))
    if local is not None:
        return local
    if "://" not in project.repo and ":" not in project.repo:
        raise SourceError(f"project {project.name}: repository {project.repo!r} is neither a directory "
                          f"({cfg.path(project.repo)} does not exist) nor a URL; fix [[projects]] repo")
    mirror = cfg.path(cfg.farm.state_dir) / "repos" / f"{project.name}.git"
    if not (mirror / "HEAD").exists():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(mirror, ignore_errors=True)
        proc = _git(["clone", "--mirror", "--quiet", project.repo, str(mirror)])
        if proc.returncode != 0:
            shutil.rmtree(mirror, ignore_errors=True)
            raise SourceError(f"project {project.name}: cannot clone {project.repo}: {_err(proc)}")
        return mirror
    for args in (["remote", "set-url", "origin", project.repo], ["fetch", "--prune", "--quiet", "origin"]):
        proc = _git(args, cwd=mirror)
        if proc.returncode != 0:
            raise SourceError(f"project {project.name}: cannot fetch {project.repo}: {_err(proc)}")
    return mirror


def resolve(repo: Path, rev: str) -> str:
    proc = _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=repo)
    if proc.returncode != 0:
        raise SourceError(f"revision {rev!r} not found in {repo}{': ' + _err(proc) if _err(proc) else ''}; "
                          "name a branch, tag or commit the repository has")
    return proc.stdout.decode().strip()


def catalog_text(cfg: Config, project: ProjectConfig, repo: Path, rev: str) -> tuple[str, str]:
    """(text, origin) of the project's catalog for ``rev``: the file beside the config when the
    project names one, else the path in the repository at that revision (never the work tree).
    A file larger than a catalog may be (catalog.MAX_BYTES) is refused before it is read."""
    if project.catalog_file:
        path = cfg.path(project.catalog_file)
        try:
            with path.open("rb") as f:
                catalog_mod.check_size(os.fstat(f.fileno()).st_size, str(path))
                return catalog_mod.text_of(f.read(catalog_mod.MAX_BYTES + 1), str(path)), str(path)
        except OSError as e:
            raise CatalogError(f"project {project.name}: catalog_file {path} cannot be read: {e}") from e
    origin, spec = f"{project.name}@{rev[:12]}:{project.catalog_path}", f"{rev}:{project.catalog_path}"
    size = _git(["cat-file", "-s", spec], cwd=repo)
    if size.returncode == 0:
        catalog_mod.check_size(int(size.stdout), origin)
    proc = _git(["show", spec], cwd=repo)
    if proc.returncode != 0:
        raise CatalogError(f"project {project.name}: no catalog at {project.catalog_path} in {repo} at {rev[:12]} "
                           f"({_err(proc)}); commit one there, or set catalog / catalog_file in [[projects]]")
    return catalog_mod.text_of(proc.stdout, origin), origin


def modules(repo: Path, rev: str, mirrors: Path) -> list[Module]:
    """The submodules of ``rev``, recursively, each fetched into a mirror under ``mirrors``
    (SourceError saying which cannot be)."""
    return submodules.find(repo, rev, mirrors)


def pack(repo: Path, rev: str, dest: Path, mirrors: Path | None = None) -> list[Module]:
    """The tree at ``rev`` as tar.zst, byte-reproducible, with its submodules (returned) at their
    paths: git archive is deterministic for a commit, the submodules are archived at the commits
    the tree pins, in tree order, and the archive codec adds no time and no name. The submodules'
    mirrors are kept under ``mirrors`` (module_mirrors), else made for this call only."""
    with tempfile.TemporaryDirectory(prefix="gearfarm-modules-") as tmp:
        mods = modules(repo, rev, mirrors or Path(tmp))
        with compressed(dest) as out:
            if not mods:  # the stream as git writes it: snapshots made before submodules stay byte-equal
                _archive(repo, rev, "", lambda stream: shutil.copyfileobj(stream, out, 1 << 20))
                return mods
            # One tar of all the trees. git's global header (the commit id) is the superproject's.
            with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, pax_headers={"comment": rev}) as tar:
                seen: set[str] = set()
                _archive(repo, rev, "", lambda stream: _copy_members(stream, tar, seen))
                for m in mods:
                    _archive(m.mirror, m.commit, m.path + "/", lambda stream: _copy_members(stream, tar, seen))
    return mods


def _archive(repo: Path, rev: str, prefix: str, consume: Callable[[IO[bytes]], None]) -> None:
    proc = subprocess.Popen(["git", "archive", "--format=tar", f"--prefix={prefix}", rev], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    consume(proc.stdout)
    err = proc.stderr.read().decode(errors="replace").strip()
    if proc.wait() != 0:
        raise SourceError(f"git archive {rev} failed in {repo}: {err}")


def _copy_members(stream: IO[bytes], tar: tarfile.TarFile, seen: set[str]) -> None:
    with tarfile.open(fileobj=stream, mode="r|") as src:
        for m in src:
            if m.isdir() and m.name in seen:
                continue  # a gitlink's directory, written before as its superproject's entry
            seen.add(m.name)
            # tarfile copies a global header into every member it reads: written once, above.
            m.pax_headers = {}
            tar.addfile(m, src.extractfile(m) if m.isreg() else None)


def publish_source(store: ArtifactStore, repo: Path, rev: str, mirrors: Path | None = None) -> Snapshot:
    """Upload the snapshot of ``rev`` unless it is there. The manifest is written after the
    archive, so its presence means both are complete; a racing nightly's archive wins and its
    sha256 is the one recorded. ``mirrors``: see pack."""
    man_key, key = keys.source_manifest(rev), keys.source(rev)
    try:
        if store.exists(man_key):
            man = json.loads(store.get_bytes(man_key))
            snap = Snapshot(rev, man["sha256"], int(man["size"]), 0)
            if "submodules" not in man and submodules.gitlinks(repo, rev):
                raise SourceError(f"the snapshot of {rev[:12]} in S3 ({key}) was made before the farm packed "
                                  "submodules and lacks them; it is never overwritten: delete "
                                  f"{keys.source(rev)} and {man_key} by hand, then run the nightly again")
            return snap
    except (ValueError, KeyError, TypeError) as e:
        raise SourceError(f"source manifest {man_key} in S3 is not valid ({e}); it is never overwritten: "
                          "delete it by hand") from e
    uploaded = 0
    with tempfile.TemporaryDirectory(prefix="gearfarm-source-") as tmp:
        archive = Path(tmp) / f"source{ARCHIVE_SUFFIX}"
        mods = pack(repo, rev, archive, mirrors)
        if store.put_file_if_absent(key, archive, ARCHIVE_TYPE):
            uploaded += archive.stat().st_size
        else:
            store.get_file(key, archive)  # another nightly's upload: record what is stored
        sha, size = sha256_file(archive), archive.stat().st_size
    # The submodules' paths and commits (no URLs: a project's URL may carry a credential).
    listed = [{"path": m.path, "commit": m.commit} for m in mods]
    body = json.dumps({"rev": rev, "sha256": sha, "size": size, "submodules": listed}, sort_keys=True).encode()
    if store.put_bytes_if_absent(man_key, body, "application/json"):
        uploaded += len(body)
    log.info("source %s: %d bytes uploaded", rev[:12], uploaded)
    return Snapshot(rev, sha, size, uploaded)


def publish_catalog(store: ArtifactStore, text: str) -> tuple[str, int]:
    """(sha256, bytes uploaded) of a validated catalog, stored by its content."""
    sha = catalog_mod.digest(text)
    key = keys.catalog(sha)
    if store.exists(key):
        return sha, 0
    data = text.encode()
    return sha, len(data) if store.put_bytes_if_absent(key, data, "application/toml") else 0


def publish_latest(store: ArtifactStore, project: str, rev: str, catalog_sha256: str) -> None:
    """Where a worker started without --targets learns which targets the project has."""
    store.put_bytes(keys.project_latest(project),
                    json.dumps({"project": project, "rev": rev, "catalog_sha256": catalog_sha256}).encode(),
                    "application/json")


# ------------------------------------------------------------------------------- worker side

_catalogs: dict[tuple[str, float | None], Catalog] = {}


def fetch_catalog(store: ArtifactStore, sha256: str, max_timeout: float | None = None) -> Catalog:
    """The catalog with this sha256, checked (against this worker's ``max_timeout`` too: its
    config may be stricter than the nightly's); cached per process (content-addressed, so a
    cached entry can never be stale). CatalogError saying why it cannot be run."""
    if (sha256, max_timeout) in _catalogs:
        return _catalogs[sha256, max_timeout]
    try:
        data = store.get_bytes(keys.catalog(sha256))
    except (StoreError, ClientError) as e:
        raise CatalogError(f"catalog {sha256[:12]} cannot be read from S3 ({keys.catalog(sha256)}): {e}") from e
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise CatalogError(f"catalog {keys.catalog(sha256)} in S3 has sha256 {actual}, not {sha256}: tampered")
    cat = catalog_mod.parse(data, keys.catalog(sha256), max_timeout)
    _catalogs[sha256, max_timeout] = cat
    return cat


def fetch_source(store: ArtifactStore, rev: str, sha256: str, dest: Path, scratch: Path) -> int:
    """Download the snapshot of ``rev``, check its sha256, extract it into ``dest``; returns
    its size. ArtifactError when it does not verify (nothing of it is extracted)."""
    archive = scratch / f"source{ARCHIVE_SUFFIX}"
    try:
        size = store.get_file(keys.source(rev), archive)
    except (StoreError, ClientError) as e:
        raise ArtifactError(f"source snapshot of {rev[:12]} cannot be downloaded ({keys.source(rev)}): {e}") from e
    try:
        safe_extract(archive, dest, sha256, f"source snapshot of {rev[:12]}")
    finally:
        archive.unlink(missing_ok=True)
    return size


@dataclass(frozen=True)
class Commit:
    rev: str
    author: str
    at: float
    subject: str


def local_repository(cfg: Config, project: ProjectConfig) -> Path | None:
    """The project's commits as they are on this host, without fetching (the dashboard reads
    them on every page view): its own clone, or the mirror the nightly keeps; None if neither."""
    local = project.local_repo(cfg.path("."))
    if local is not None:
        return local
    mirror = cfg.path(cfg.farm.state_dir) / "repos" / f"{project.name}.git"
    return mirror if (mirror / "HEAD").exists() else None


def changes(repo: Path, old: str, new: str, limit: int = 200) -> list[Commit]:
    """The commits in ``new`` that ``old`` lacks, newest first (at most ``limit``)."""
    return _log(repo, [f"--max-count={limit}", f"{old}..{new}"], f"{old[:12]}..{new[:12]}")


def commit(repo: Path, rev: str) -> Commit:
    """One commit: its author, time and subject."""
    (one,) = _log(repo, ["--max-count=1", "--no-walk", rev], rev[:12]) or [None]
    if one is None:
        raise SourceError(f"no commit {rev[:12]} in {repo}")
    return one


def _log(repo: Path, args: list[str], what: str) -> list[Commit]:
    proc = _git(["log", "--format=%H%x1f%an%x1f%at%x1f%s", *args, "--"], cwd=repo, timeout=30)
    if proc.returncode != 0:
        raise SourceError(f"git log {what} in {repo}: {_err(proc)}")
    out = []
    for line in proc.stdout.decode(errors="replace").splitlines():
        rev, author, at, subject = line.split("\x1f", 3)
        out.append(Commit(rev, author, float(at), subject))
    return out


def first_parent_range(repo: Path, good: str, bad: str) -> list[str]:
    """``good`` then every commit after it on ``bad``'s first-parent line up to ``bad``, oldest
    first: what a bisection searches (a merge is judged as one commit, as the nightly built it).
    SourceError unless ``good`` is an ancestor of ``bad``."""
    good, bad = resolve(repo, good), resolve(repo, bad)
    if _git(["merge-base", "--is-ancestor", good, bad], cwd=repo, timeout=30).returncode != 0:
        raise SourceError(f"{good[:12]} is not an ancestor of {bad[:12]}: give the last good revision first "
                          "(GOOD..BAD)")
    proc = _git(["rev-list", "--first-parent", "--reverse", f"{good}..{bad}"], cwd=repo, timeout=60)
    if proc.returncode != 0:
        raise SourceError(f"git rev-list {good[:12]}..{bad[:12]} in {repo}: {_err(proc)}")
    revs = proc.stdout.decode().split()
    if not revs or revs[-1] != bad:
        raise SourceError(f"{bad[:12]} is not on the first-parent line from {good[:12]}")
    return [good, *revs]


def commit_of(repo: Path, rev: str) -> Commit:
    proc = _git(["show", "-s", "--format=%H%x1f%an <%ae>%x1f%at%x1f%s", rev, "--"], cwd=repo, timeout=30)
    if proc.returncode != 0:
        raise SourceError(f"git show {rev[:12]} in {repo}: {_err(proc)}")
    full, author, at, subject = proc.stdout.decode(errors="replace").strip().split("\x1f", 3)
    return Commit(full, author, float(at), subject)


def tags(repo: Path) -> dict[str, list[str]]:
    """Commit -> the names of the tags pointing at it (annotated tags peeled to their commit)."""
    proc = _git(["for-each-ref", "refs/tags", "--format=%(objectname) %(*objectname) %(refname:short)"],
                cwd=repo, timeout=60)
    if proc.returncode != 0:
        raise SourceError(f"git for-each-ref refs/tags in {repo}: {_err(proc)}")
    out: dict[str, list[str]] = {}
    for line in proc.stdout.decode(errors="replace").splitlines():
        parts = line.split(" ")
        obj, peeled, name = parts[0], parts[1], " ".join(parts[2:])
        out.setdefault(peeled or obj, []).append(name)
    return out
