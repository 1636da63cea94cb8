"""Content hashes for full KV blocks, chained so that a block's hash names its whole prefix.

Two blocks share a hash only when every token before and in them matches (and the salt), which is
what makes a cached block reusable by another request. sha256 keeps collisions out of the picture.
A block's hash is sha256(parent hash, or b"root" for the first block; the block's ids as 8-byte
integers; the salt).
"""

from __future__ import annotations

from array import array
from hashlib import sha256

BlockHash = bytes

ROOT = b"root"  # the first block's parent


def hash_block_tokens(parent: BlockHash | None, token_ids: list[int], salt: bytes = b"") -> BlockHash:
    return sha256((parent or ROOT) + array("q", token_ids).tobytes() + salt).digest()


def hash_full_blocks(parent: BlockHash | None, token_ids: list[int], block_size: int, salt: bytes = b""
                     ) -> list[BlockHash]:
    """The chained hashes of consecutive full blocks of token_ids (whose length is a multiple of
    block_size), the first one's parent being `parent`: the same digests as hash_block_tokens
    block by block, with the ids converted once and one sha256 call per block (a 1k-token prompt
    has 64 blocks, and every request's prompt is hashed on arrival)."""
    data = array("q", token_ids).tobytes()
    step = block_size * 8
    out = []
    h = parent or ROOT
    for i in range(0, len(data), step):
        h = sha256(h + data[i : i + step] + salt).digest()
        out.append(h)
    return out
