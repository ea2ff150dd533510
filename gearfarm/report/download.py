"""A build fetched by a person (`gearfarm artifact get`, `gearfarm artifact verify`): found by the
build record the ledger applied (signed by a registered build host), downloaded, and believed
only once the archive has the sha256 that record and the build's signed provenance name, the
provenance is signed by a host registered to build that target, and every unpacked file matches
the manifest and the provenance. Each check that fails says which one it was."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gearfarm.db.registry import Registry
from gearfarm.db.results import ResultsDB
from gearfarm.formats import provenance
from gearfarm.formats.job import JobId
from gearfarm.formats.result import ResultRecord
from gearfarm.formats.words import counted
from gearfarm.s3 import artifact, keys
from gearfarm.s3.store import ArtifactStore, sha256_file

PROVENANCE_FILE = "provenance.intoto.json"


class NotFound(LookupError):
    """No build answers the question (exit 2: nothing was checked)."""


class VerifyError(ValueError):
    """A check failed (exit 1): the message names the check."""


@dataclass
class Checked:
    """What was verified, one line each, for the person to read."""

    lines: list[str] = field(default_factory=list)

    def ok(self, line: str) -> None:
        self.lines.append(line)


def find_build(db: ResultsDB, project: str, target: str, rev: str | None = None, run: str | None = None,
               ) -> ResultRecord:
    """The passed build record asked for: of run ``run``, else the newest of a revision starting
    with ``rev``, else the project's last good build of ``target`` (every test of its night
    passed)."""
    if run is not None:
        rec = db.job(str(JobId(run, target, "build")))
        if rec is None:
            raise NotFound(f"run {run} has no {target} build on record")
        if rec.status != "passed" or not rec.artifact_key or not rec.artifact_sha256:
            raise NotFound(f"the {target} build of run {run} ended {rec.status}: it left no artifact")
        return rec
    if rev is not None:
        for r in db.runs_before(float("inf"), project, target, limit=400):
            if r.rev.startswith(rev):
                got = db.signed_builds(project, r.rev, target, limit=1)
                if got:
                    return got[0]
        raise NotFound(f"no passed {target} build of project {project} at a revision {rev}...")
    rec = db.last_good_build(project, target, exclude_rev="")
    if rec is None:
        raise NotFound(f"project {project} has no good {target} build yet (one whose tests all passed)")
    return rec


def get(db: ResultsDB, store: ArtifactStore, rec: ResultRecord, out: Path) -> Checked:
    """Download ``rec``'s archive and provenance into ``out``, check them against the record
    and the registry, and unpack the files into ``out``/<project>-<target>-<rev>/."""
    assert rec.artifact_key and rec.artifact_sha256
    out.mkdir(parents=True, exist_ok=True)
    archive, prov = out / provenance.ARCHIVE, out / PROVENANCE_FILE
    checked = Checked()
    store.get_file(rec.artifact_key, archive)
    got = sha256_file(archive)
    if got != rec.artifact_sha256:
        raise VerifyError(f"archive check failed: {rec.artifact_key} has sha256 {got}, but the signed build record "
                          f"of {rec.job_id} names {rec.artifact_sha256}: it was replaced in S3 or damaged")
    checked.ok(f"archive sha256 {got} = the signed build record of {rec.job_id} (built on "
               f"{rec.host.get('hostname', '?')})")
    try:
        prov.write_bytes(store.get_bytes(keys.provenance_of(rec.artifact_key)))
    except Exception as e:  # noqa: BLE001 - any failure to read it means there is none to check
        raise VerifyError(f"provenance check failed: {keys.provenance_of(rec.artifact_key)} cannot be read ({e})"
                          ) from e
    checked.lines += verify(Registry(db), archive, prov, f"{rec.rev[:12]}").lines
    return checked


def verify(registry: Registry, archive: Path, prov: Path | None = None, name: str | None = None) -> Checked:
    """Check a downloaded archive against its provenance (default: provenance.intoto.json
    beside it) and the registry; with ``name``, leave the checked files unpacked in
    <archive's folder>/<project>-<target>-<name>/."""
    prov = prov or archive.parent / PROVENANCE_FILE
    checked = Checked()
    try:
        data = prov.read_bytes()
    except OSError as e:
        raise VerifyError(f"provenance check failed: cannot read {prov}: {e.strerror or e}") from e
    try:
        stmt, kid = provenance.open_envelope(data, registry.public_key)
    except provenance.ProvenanceError as e:
        raise VerifyError(f"provenance check failed: {e}") from e
    params = provenance.parameters(stmt)
    target, rev, project = params.get("target", ""), params.get("revision", ""), params.get("project", "")
    builder = provenance.builder_host(stmt)
    why = registry.authorize(kid, "build", target, builder)
    if why:
        raise VerifyError(f"provenance check failed: {why}")
    checked.ok(f"provenance signed by host {builder} (key {kid}), registered to build {target}")
    want = provenance.subject(stmt, provenance.ARCHIVE)
    got = sha256_file(archive)
    if got != want:
        raise VerifyError(f"archive check failed: {archive.name} has sha256 {got}, its provenance names {want}")
    checked.ok(f"archive sha256 {got} = the provenance's subject {provenance.ARCHIVE}")
    with tempfile.TemporaryDirectory(dir=archive.parent, prefix=".verify-") as tmp:
        dest = Path(tmp) / "files"
        try:
            manifest = artifact.unpack(archive, dest, got)
        except artifact.ArtifactError as e:
            raise VerifyError(f"files check failed: {e}") from e
        if (manifest.get("rev"), manifest.get("target")) != (rev, target):
            raise VerifyError(f"files check failed: the manifest is of {manifest.get('target')}@{manifest.get('rev')}, "
                              f"the provenance of {target}@{rev}")
        files = {n: i for n, i in manifest["files"].items() if isinstance(i, dict) and "sha256" in i}
        for n, info in files.items():
            if provenance.subject(stmt, f"files/{n}") != info["sha256"]:
                raise VerifyError(f"files check failed: {n} has sha256 {info['sha256']}, not what the provenance "
                                  "names")
        checked.ok(f"{counted(len(files), 'file')} unpacked, each matching the manifest and the provenance "
                   f"({project} {target} at {rev[:12]})")
        if name is not None:
            final = archive.parent / f"{project}-{target}-{name}"
            if final.exists():
                raise VerifyError(f"{final} exists: remove it, or give another -o")
            dest.rename(final)
            checked.ok(f"unpacked into {final}")
    return checked
