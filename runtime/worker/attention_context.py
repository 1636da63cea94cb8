"""The one piece of global state in the model: the current batch's attention metadata.

The model runner sets it around each forward pass; attention layers read it. Model code therefore
keeps the plain signatures of the paper (hidden states in, hidden states out).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionContext:
    slot_mapping: torch.Tensor  # int64 [num_tokens]; -1 = padding, not written
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    seq_lens: torch.Tensor  # int32 [num_seqs], context length including this step's tokens
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    max_query_len: int
    max_seq_len: int
    # The first num_decode_seqs sequences have one query row each (mixed steps put them first).
    num_decode_seqs: int = 0


_context: AttentionContext | None = None


def get_context() -> AttentionContext:
    if _context is None:
        raise RuntimeError("attention called outside a forward pass: no AttentionContext is set")
    return _context


@contextmanager
def attention_context(ctx: AttentionContext):
    global _context
    previous, _context = _context, ctx
    try:
        yield ctx
    finally:
        _context = previous
