"""The farm's one signed envelope and its keys: Ed25519 signatures over canonical JSON, for job
payloads (signed by the nightly's key, which only the nightly host holds), result records and
leases (signed by the key of the worker host that runs the job) and the markers the nightly
writes.

An envelope is ``{purpose, body, kid, sig}``: the signature covers the purpose and the body, so a
signed payload can never be replayed as a result record or the other way round; ``kid`` names
the public key that verifies it, so a verifier looks the signer up (workers: the nightly's keys
in their config; the ledger: the registry of host keys, gearfarm.db.registry) and knows *who*
signed, not only that some holder of a shared secret did. Asymmetric keys are the point: a
worker host holds only public keys of others and its own private key, so it can sign exactly
what it does itself.

Keys are written as text ``ed25519:<base64 of the 32 raw bytes>`` (configs, the registry) and
kept as PKCS#8 PEM files readable by their owner only. No key or signature material ever
appears in an error or a log line besides the key id."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

Purpose = Literal["payload", "result", "lease", "marker"]
MAX_ENVELOPE = 256 * 1024
PUBLIC_PREFIX = "ed25519:"


class SealError(ValueError):
    """An envelope was malformed, unsigned, forged, or sealed for another purpose; or a key
    could not be read."""


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


# -- keys ------------------------------------------------------------------------------------

def public_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_PREFIX + base64.b64encode(raw).decode()


def parse_public(text: str) -> Ed25519PublicKey:
    """A public key from its text form; SealError saying what the text should look like."""
    if not isinstance(text, str) or not text.startswith(PUBLIC_PREFIX):
        raise SealError(f"a public key is written {PUBLIC_PREFIX}<base64 of 32 bytes> "
                        "(as `gearfarm keys new` prints it)")
    try:
        raw = base64.b64decode(text[len(PUBLIC_PREFIX):], validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError) as e:
        raise SealError(f"not an Ed25519 public key ({PUBLIC_PREFIX}<base64 of 32 bytes>): {e}") from e


def key_id(public: Ed25519PublicKey | str) -> str:
    """A short, non-secret name of a public key: what envelopes, the registry and logs say."""
    key = parse_public(public) if isinstance(public, str) else public
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class Signer:
    """A private key and the id of its public half."""

    private: Ed25519PrivateKey

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def public_text(self) -> str:
        return public_text(self.public)

    @property
    def kid(self) -> str:
        return key_id(self.public)

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)

    @classmethod
    def generate(cls) -> Signer:
        return cls(Ed25519PrivateKey.generate())

    def pem(self) -> bytes:
        return self.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())

    @classmethod
    def load(cls, path: Path) -> Signer:
        """The key in a PEM file; SealError naming the file (never its content) otherwise."""
        try:
            data = path.read_bytes()
        except OSError as e:
            raise SealError(f"cannot read the signing key {path}: {e.strerror or e}") from e
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise SealError(f"{path} is not an unencrypted PEM private key (make one with `gearfarm keys new`)") from e
        if not isinstance(key, Ed25519PrivateKey):
            raise SealError(f"{path} holds a {type(key).__name__}, not an Ed25519 key (make one with "
                            "`gearfarm keys new`)")
        return cls(key)


Lookup = Callable[[str], "Ed25519PublicKey | None"]


def keyring(public_keys: Iterable[str]) -> Lookup:
    """A lookup of the given public keys (text form) by key id: what verifies the nightly's
    payloads on a worker, the first key of the list or any other during a rotation."""
    ring = {}
    for text in public_keys:
        key = parse_public(text)
        ring[key_id(key)] = key
    return ring.get


# -- the envelope ------------------------------------------------------------------------------

def _signed(purpose: str, body: dict[str, Any]) -> bytes:
    return canonical({"purpose": purpose, "body": body})


def seal(purpose: Purpose, body: dict[str, Any], signer: Signer | None) -> bytes:
    if signer is None:
        raise SealError("no signing key configured: a nightly host needs [farm] signing_key, a worker host "
                        "[farm] host_key (docs/security.md, 'Keys')")
    sig = base64.b64encode(signer.sign(_signed(purpose, body))).decode()
    return canonical({"purpose": purpose, "body": body, "kid": signer.kid, "sig": sig})


def unseal(data: bytes, purpose: Purpose, lookup: Lookup, limit: int = MAX_ENVELOPE) -> tuple[dict[str, Any], str]:
    """(the body, the signer's key id) of a genuine envelope of this purpose, whose key
    ``lookup`` knows; SealError saying exactly what is wrong otherwise."""
    if len(data) > limit:
        raise SealError(f"{purpose} too large ({len(data)} bytes, limit {limit})")
    try:
        env = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SealError(f"{purpose} is not JSON: {e}") from e
    if not isinstance(env, dict) or set(env) != {"purpose", "body", "kid", "sig"}:
        raise SealError(f"{purpose} is not a signed envelope {{purpose, body, kid, sig}}")
    body, sig, kid = env["body"], env["sig"], env["kid"]
    if not isinstance(body, dict) or not isinstance(sig, str) or not isinstance(kid, str):
        raise SealError(f"{purpose} envelope has the wrong shape")
    if env["purpose"] != purpose:
        raise SealError(f"envelope sealed as a {str(env['purpose'])[:16]!r}, not a {purpose}")
    key = lookup(kid)
    if key is None:
        who = "[farm] nightly_keys" if purpose in ("payload", "marker") else \
            "the registry of host keys (gearfarm keys list)"
        raise SealError(f"{purpose} signed by key {kid[:16]!r}, which is not one this verifier trusts for it: "
                        f"not in {who}")
    try:
        key.verify(base64.b64decode(sig, validate=True), _signed(purpose, body))
    except (InvalidSignature, binascii.Error, ValueError) as e:
        raise SealError(f"bad signature (kid {kid[:16]!r}): forged or altered") from e
    return body, kid
