"""Content hashes for full KV blocks, chained so that a block's hash names its whole prefix.

Two blocks share a hash only when every token before and in them matches (and the salt), which is
what makes a cached block reusable by another request. sha256 keeps collisions out of the picture.
"""

from __future__ import annotations

import hashlib
from array import array

BlockHash = bytes


def hash_block_tokens(parent: BlockHash | None, token_ids: list[int], salt: bytes = b"") -> BlockHash:
    h = hashlib.sha256(parent or b"root")
    h.update(array("q", token_ids).tobytes())
    if salt:
        h.update(salt)
    return h.digest()
