"""Signed provenance of a build (SLSA v1.0 Build L3's ask): an in-toto Statement v1 whose
predicate is SLSA Provenance v1, in a DSSE envelope signed with the key of the host that built
it. It names what went in (the source snapshot and the catalog by sha256, the revision, the
target, the build's definition), who built it (the host, its tool versions) and every output
by sha256 (the archive, its manifest, each file), and is stored beside the artifact
(s3/keys.py ``provenance``). Anyone holding the registry can check it: the signer must be a
host registered to build that target, and the archive must have the digest its subject says.

Written by hand: a DSSE envelope is the pre-authentication encoding below, base64 and one
Ed25519 signature, and the packages that implement it (securesystemslib, in-toto) bring key
formats and signers of their own for what ``gearfarm.formats.seal`` already holds."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from cryptography.exceptions import InvalidSignature

from gearfarm.formats.seal import Lookup, Signer, canonical

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://gearfarm.dev/build/v1"
ARCHIVE = "artifact.tar.zst"
MANIFEST = "manifest.json"
MAX_PROVENANCE = 4 * 1024 * 1024


class ProvenanceError(ValueError):
    """A provenance that is malformed, unsigned, forged, or not about what it is checked against."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: what the signature covers (type and payload)."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def statement(*, archive_sha256: str, manifest_sha256: str, manifest: dict[str, Any], project: str, rev: str,
              target: str, source_sha256: str, catalog_sha256: str, host: str, tools: str, definition: str,
              job_id: str, started: float, finished: float) -> dict[str, Any]:
    files = manifest.get("files", {})
    subjects = [{"name": ARCHIVE, "digest": {"sha256": archive_sha256}},
                {"name": MANIFEST, "digest": {"sha256": manifest_sha256}}]
    subjects += [{"name": f"files/{name}", "digest": {"sha256": info["sha256"]}}
                 for name, info in sorted(files.items()) if isinstance(info, dict) and "sha256" in info]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"project": project, "revision": rev, "target": target},
                "internalParameters": {"catalog_sha256": catalog_sha256, "definition": definition},
                "resolvedDependencies": [
                    {"uri": f"gearfarm:sources/{rev}/source.tar.zst", "digest": {"sha256": source_sha256,
                                                                                   "gitCommit": rev}},
                    {"uri": f"gearfarm:catalogs/{catalog_sha256}.toml", "digest": {"sha256": catalog_sha256}},
                ],
            },
            "runDetails": {
                "builder": {"id": f"gearfarm:host/{host}", "version": {"tools": tools}},
                "metadata": {"invocationId": job_id, "startedOn": _iso(started), "finishedOn": _iso(finished)},
            },
        },
    }


def _iso(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sign(stmt: dict[str, Any], signer: Signer) -> bytes:
    payload = canonical(stmt)
    sig = signer.sign(pae(PAYLOAD_TYPE, payload))
    return json.dumps({"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
                       "signatures": [{"keyid": signer.kid, "sig": base64.b64encode(sig).decode()}]},
                      indent=1).encode() + b"\n"


def open_envelope(data: bytes, lookup: Lookup) -> tuple[dict[str, Any], str]:
    """(the statement, the signer's key id) of a DSSE envelope signed by a key ``lookup`` knows;
    ProvenanceError saying which check failed."""
    if len(data) > MAX_PROVENANCE:
        raise ProvenanceError(f"provenance is {len(data)} bytes, more than {MAX_PROVENANCE}")
    try:
        env = json.loads(data)
        payload = base64.b64decode(env["payload"], validate=True)
        sigs = env["signatures"]
        payload_type = env["payloadType"]
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise ProvenanceError(f"provenance is not a DSSE envelope: {str(e)[:200]}") from e
    if payload_type != PAYLOAD_TYPE:
        raise ProvenanceError(f"provenance payload type is {str(payload_type)[:80]!r}, not {PAYLOAD_TYPE}")
    if not isinstance(sigs, list) or not sigs:
        raise ProvenanceError("provenance carries no signature")
    why = "no signature by a key of the registry"
    for s in sigs:
        kid = str(s.get("keyid", "")) if isinstance(s, dict) else ""
        key = lookup(kid)
        if key is None:
            why = f"signed by key {kid[:16]!r}, which no host is registered with"
            continue
        try:
            key.verify(base64.b64decode(str(s.get("sig", "")), validate=True), pae(payload_type, payload))
        except (InvalidSignature, binascii.Error, ValueError):
            why = f"bad signature by key {kid[:16]!r}: the provenance was altered or forged"
            continue
        try:
            stmt = json.loads(payload)
        except ValueError as e:
            raise ProvenanceError(f"the signed provenance is not JSON: {e}") from e
        if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE or \
                stmt.get("predicateType") != PREDICATE_TYPE:
            raise ProvenanceError("the signed provenance is not an in-toto Statement v1 of SLSA Provenance v1")
        return stmt, kid
    raise ProvenanceError(f"provenance signature check failed: {why}")


def subject(stmt: dict[str, Any], name: str) -> str | None:
    """The sha256 the statement gives ``name`` (None: not a subject of it)."""
    for s in stmt.get("subject", []):
        if isinstance(s, dict) and s.get("name") == name:
            return str(s.get("digest", {}).get("sha256"))
    return None


def builder_host(stmt: dict[str, Any]) -> str:
    builder = str(stmt.get("predicate", {}).get("runDetails", {}).get("builder", {}).get("id", ""))
    return builder.removeprefix("gearfarm:host/")


def parameters(stmt: dict[str, Any]) -> dict[str, str]:
    return dict(stmt.get("predicate", {}).get("buildDefinition", {}).get("externalParameters", {}))
