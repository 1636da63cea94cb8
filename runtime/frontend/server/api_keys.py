"""API keys: checked once at start-up, then compared as bytes in constant time on every request.

Keys are compared as their UTF-8 bytes with the raw header bytes, never as decoded text: ASGI hands
headers over as bytes, and decoding them as latin-1 (as starlette's Headers does) while encoding the
key as UTF-8 would make every non-ASCII key unmatchable.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable


class APIKeyError(ValueError):
    pass


def load_api_keys(keys: str | Iterable[str] | None) -> list[bytes] | None:
    """The keys as bytes, or None for an open server. An empty or blank key is refused: `--api-key ''`
    (an unset variable in a manifest, say) must not quietly switch authentication off."""
    if keys is None:
        return None
    keys = [keys] if isinstance(keys, str) else list(keys)
    if not keys:
        return None
    for key in keys:
        if not key.strip():
            raise APIKeyError("an API key must not be empty or blank; leave --api-key out to serve "
                              "without authentication")
        if key != key.strip():
            raise APIKeyError("an API key must not start or end with whitespace: HTTP drops it from headers")
    return [key.encode("utf-8") for key in keys]


def bearer_token(authorization: bytes) -> bytes:
    """The token of an 'Authorization: Bearer TOKEN' header value, or b"" for anything else."""
    scheme, _, token = authorization.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


def key_matches(token: bytes, keys: list[bytes]) -> bool:
    """Constant time in where the bytes differ, and every key is compared, so the time does not
    tell which key came closest."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(token, key)
    return matched
