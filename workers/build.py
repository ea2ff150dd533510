"""The build worker: fetch the run's catalog and source snapshot from S3 (both checked by the
sha256 in the signed payload), build the target as the catalog says, pack the declared outputs
and upload the artifact with its provenance signed by this host, or reuse a stored one the farm
signed before (the payload names those builds; the manifest is checked by sha256), and report the
archive's and the manifest's sha256 in its signed record. The nightly then submits the target's
test and perf jobs with that digest: a worker host cannot make payloads. It needs no git and no
clone. A build that does not pass ends its dependents through the ledger's rule."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import time

from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats import provenance
from gearfarm.formats.catalog import Catalog, Target
from gearfarm.formats.job import SignedBuild
from gearfarm.formats.result import ResultRecord
from gearfarm.run import snapshot
from gearfarm.s3 import artifact, keys
from gearfarm.s3.store import StoreError, sha256_file
from gearfarm.step import runner
from gearfarm.workers.base import Attempt

log = logging.getLogger(__name__)


def tool_version(tool: str) -> str:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{tool}: unavailable ({e})"
    return out.splitlines()[0].strip() if out.strip() else tool


def toolchain(cat: Catalog, target: Target) -> tuple[str, str, str]:
    """(toolchain id, tool versions, build definition) for the artifact key and manifest: a new
    compiler or a changed build command is a new artifact, never a reused one."""
    versions = "\n".join(tool_version(t) for t in target.tools)
    definition = catalog_mod.definition(cat, target)
    return keys.toolchain_id(versions, definition), versions, definition


def missing_tools(target: Target) -> list[str]:
    return [t for t in target.tools if shutil.which(t) is None]


def handle(attempt: Attempt) -> ResultRecord:
    """Whatever goes wrong here (catalog or snapshot unreadable, tools missing, upload error)
    becomes the build's record (base.perform_job); the ledger then ends the target's test and perf
    jobs with it, so no run waits for a job that cannot start."""
    ctx, p = attempt.ctx, attempt.p
    lacking = missing_tools(attempt.target)
    if lacking:
        return attempt.refuse(f"host {ctx.name} lacks {', '.join(lacking)} that project {p.project} needs "
                           f"to build {p.target} (catalog targets.{p.target}.tools): install them, or do "
                           f"not run a build worker for {p.target} here")
    try:
        return build(attempt)
    except artifact.ArtifactError as e:  # what S3 holds is not what the farm signed: nothing reused or run
        log.error("build %s refused the stored artifact: %s", p.job_id, e)
        return attempt.refuse(str(e))


def build(attempt: Attempt) -> ResultRecord:
    ctx, p, cat = attempt.ctx, attempt.p, attempt.cat
    target, tmpd, timings = attempt.target, attempt.tmpd, attempt.timings
    tc_id, versions, definition = toolchain(cat, target)
    attempt.note(f"tools:\n{versions}")
    art_key = keys.artifact(p.rev, p.target, tc_id)
    man_key = keys.manifest(p.rev, p.target, tc_id)
    reused = False
    alarms: list[str] = []
    bytes_up = 0
    status = "passed"
    message = ""
    t0 = time.monotonic()
    manifest: dict[str, object] = {}
    man_sha: str | None = None
    signed = next((b for b in p.signed_builds if b.artifact_key == art_key), None)
    try:
        stored = reusable(attempt, signed, man_key)
    except artifact.Replaced as e:
        alarms.append(set_aside(attempt, keys.artifact_prefix(p.rev, p.target, tc_id), e))
        stored = None
    if stored is not None and signed is not None:
        manifest, man_sha = stored, signed.manifest_sha256
        reused = True
        attempt.note(f"artifact {art_key} exists (sha256 {signed.artifact_sha256}, manifest sha256 {man_sha}, "
                  "as the farm signed them; the archive checked): build and upload skipped, 0 bytes uploaded")
        timings["lookup"] = time.monotonic() - t0
    else:
        root, scratch = attempt.disk / "root", attempt.scratch()
        size = snapshot.fetch_source(ctx.store, p.rev, p.source_sha256, root, tmpd)
        timings["source"] = time.monotonic() - t0
        attempt.note(f"source snapshot {keys.source(p.rev)}: {size} bytes, sha256 verified")
        t0 = time.monotonic()
        run = runner.run_build(cat, target, root, scratch, attempt.log_path, ctx.sandbox, attempt.start,
                               p.project)
        timings["build"] = time.monotonic() - t0
        status, message = run.status, run.message(cat.build_for(target).timeout)
        if status == "passed":
            # Nothing about who or when: two builds of the same inputs pack byte-identical
            # archives (the record says who built it and when).
            meta = {"project": p.project, "rev": p.rev, "target": p.target, "toolchain": tc_id,
                    "tools": versions, "definition": definition}
            t0 = time.monotonic()
            archive = tmpd / f"artifact{artifact.ARCHIVE_SUFFIX}"
            packed = artifact.pack(root, run.outputs, meta, archive)
            # Put-if-absent: a concurrent build of the same (rev, target, toolchain) cannot
            # replace the archive under a sha256 another build's tests were given; and an
            # object there that is not this build's nor one the farm signed is refused.
            signed_shas = [b.artifact_sha256 for b in p.signed_builds if b.artifact_key == art_key]
            try:
                manifest = artifact.publish(ctx.store, art_key, man_key, archive, packed, signed_shas)
            except artifact.Replaced as e:
                # Moved aside, kept for a look, and this build stored in its place: one alarm,
                # not every later night of the target refused until someone removes it.
                alarms.append(set_aside(attempt, keys.artifact_prefix(p.rev, p.target, tc_id), e))
                try:
                    manifest = artifact.publish(ctx.store, art_key, man_key, archive, packed, signed_shas)
                except artifact.Replaced as again:
                    raise artifact.ArtifactError(
                        f"{again}, again right after this build moved what it found there aside ({alarms[-1]}): "
                        "something with the build role's S3 keys is writing there now; find it") from again
            man_sha = str(manifest["manifest_sha256"])
            if not manifest["raced"]:
                # What this host built, signed by it: only the host that made the archive says so.
                stmt = provenance.statement(
                    archive_sha256=str(manifest["archive_sha256"]), manifest_sha256=man_sha, manifest=manifest,
                    project=p.project, rev=p.rev, target=p.target, source_sha256=p.source_sha256,
                    catalog_sha256=p.catalog_sha256, host=ctx.host["hostname"], tools=versions,
                    definition=definition, job_id=p.job_id, started=attempt.started, finished=time.time())
                body = provenance.sign(stmt, ctx.signer)
                if ctx.store.put_bytes_if_absent(keys.provenance(p.rev, p.target, tc_id), body,
                                                 "application/json"):
                    bytes_up += len(body)
            bytes_up += int(manifest["uploaded_bytes"])  # type: ignore[call-overload]
            if manifest["raced"]:
                attempt.note(f"another build stored {art_key} first (sha256 {manifest['archive_sha256']}); "
                          "using that one")
            timings["upload"] = time.monotonic() - t0

    ok = status == "passed"
    return attempt.record(status, message, bytes_uploaded=bytes_up, reused_artifact=reused, alarms=alarms,
                       artifact_key=art_key if ok else None,
                       artifact_sha256=str(manifest["archive_sha256"]) if ok else None,
                       manifest_sha256=man_sha if ok else None)


def set_aside(attempt: Attempt, prefix: str, found: artifact.Replaced) -> str:
    """Move the objects at a build's keys aside (artifact.quarantine) after ``found`` one of
    them not made by the farm; the alarm that says what was found and where it is kept."""
    try:
        moved = artifact.quarantine(attempt.ctx.store, prefix, time.time())
    except StoreError as e:
        raise artifact.ArtifactError(
            f"{found}; moving it aside failed ({e}): the build role's S3 user needs DeleteObject on artifacts/ and "
            "PutObject under quarantine/ (make the roles again: gearfarm store roles), or keep the object for a "
            "look, remove it (mc rm) and build again") from e
    where = ", ".join(f"{k} -> {v}" for k, v in sorted(moved.items()))
    alarm = (f"{found.key} was replaced in S3 outside the farm ({found}); moved aside, kept for a look: "
             f"{where}; built again and stored this build's")
    attempt.note(f"ALARM: {alarm}")
    log.error("build %s: %s", attempt.p.job_id, alarm)
    return alarm


def reusable(attempt: Attempt, signed: SignedBuild | None, man_key: str) -> dict[str, object] | None:
    """The stored manifest of a build the farm signed, when S3 still holds it as signed (its
    sha256 and the archive's it names); None when there is nothing to reuse (the build runs).
    A manifest the farm did not sign is never trusted: the bucket is not the truth."""
    if signed is None:
        return None
    try:
        data = attempt.ctx.store.get_bytes(man_key)
    except Exception:  # gone (pruned) or unreadable: build again
        return None
    got = hashlib.sha256(data).hexdigest()
    manifest = json.loads(data) if got == signed.manifest_sha256 else None
    if manifest is None or manifest.get("archive_sha256") != signed.artifact_sha256:
        attempt.note(f"stored manifest {man_key} has sha256 {got}, not the {signed.manifest_sha256} the farm signed: "
                  "it was replaced in S3; not reused")
        log.error("stored manifest %s has sha256 %s, the farm signed %s: replaced in S3", man_key, got,
                  signed.manifest_sha256)
        return None
    return manifest if check_archive(attempt, signed) else None


def check_archive(attempt: Attempt, signed: SignedBuild) -> bool:
    """Whether S3 still holds the archive the farm signed at ``signed``'s key (False: gone or
    unreadable, build again); Replaced when it holds another: a reused build names it to its test
    jobs, which would refuse it night after night. The one download is kept in this host's cache,
    where the host's test jobs of the build take it."""
    ctx, path = attempt.ctx, attempt.tmpd / f"stored{artifact.ARCHIVE_SUFFIX}"
    with ctx.archives.fetching(signed.artifact_sha256):
        try:
            ctx.store.get_file(signed.artifact_key, path)
        except Exception:  # gone (pruned) or unreadable: build again, as for its manifest
            path.unlink(missing_ok=True)
            return False
        got = sha256_file(path)
        if got == signed.artifact_sha256:
            ctx.archives.add(got, path)
    path.unlink(missing_ok=True)
    if got == signed.artifact_sha256:
        return True
    raise artifact.Replaced(f"artifact {signed.artifact_key} in S3 has sha256 {got}, not the "
                            f"{signed.artifact_sha256} the farm signed: it was replaced outside the farm",
                            signed.artifact_key)
