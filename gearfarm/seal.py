"""The farm's one signed envelope: HMAC-SHA256 over canonical JSON, for job payloads and result
records alike. The envelope names its purpose and the MAC covers it, so a signed payload can
never be replayed as a result record or the other way round. The first key of the ring signs,
every key verifies (rotation); keys never appear in an envelope, an error or a log line."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Literal

Purpose = Literal["payload", "result"]
MAX_ENVELOPE = 256 * 1024


class SealError(ValueError):
    """An envelope was malformed, unsigned, forged, or sealed for another purpose."""


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def key_id(key: str) -> str:
    """A short, non-secret name for a key, so logs can say which key signed."""
    return hashlib.sha256(b"gearfarm-kid:" + key.encode()).hexdigest()[:8]


def _mac(key: str, purpose: str, body: dict[str, Any]) -> str:
    return hmac.new(key.encode(), canonical({"purpose": purpose, "body": body}), hashlib.sha256).hexdigest()


def seal(purpose: Purpose, body: dict[str, Any], keys: list[str]) -> bytes:
    if not keys:
        raise SealError("no signing key configured ([farm] secrets)")
    return canonical({"purpose": purpose, "body": body, "kid": key_id(keys[0]),
                      "sig": _mac(keys[0], purpose, body)})


def unseal(data: bytes, purpose: Purpose, keys: list[str], limit: int = MAX_ENVELOPE) -> dict[str, Any]:
    """The body of a genuine envelope of this purpose; SealError saying exactly what is wrong."""
    if len(data) > limit:
        raise SealError(f"{purpose} too large ({len(data)} bytes, limit {limit})")
    try:
        env = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SealError(f"{purpose} is not JSON: {e}") from e
    if not isinstance(env, dict) or set(env) != {"purpose", "body", "kid", "sig"}:
        raise SealError(f"{purpose} is not a signed envelope {{purpose, body, kid, sig}}")
    body, sig = env["body"], env["sig"]
    if not isinstance(body, dict) or not isinstance(sig, str):
        raise SealError(f"{purpose} envelope has the wrong shape")
    if env["purpose"] != purpose:
        raise SealError(f"envelope sealed as a {str(env['purpose'])[:16]!r}, not a {purpose}")
    if not any(hmac.compare_digest(_mac(k, purpose, body), sig) for k in keys):
        raise SealError(f"bad signature (kid {str(env['kid'])[:16]!r}): forged, or signed with an unknown key")
    return body
