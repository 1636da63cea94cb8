"""The global state of a forward pass: the current batch's attention metadata, and a graph splitter.

The model runner sets the context around each forward pass; attention layers read it. Model code
therefore keeps the plain signatures of the paper (hidden states in, hidden states out). While
mixed-step graphs are captured (worker/piecewise_graphs.py), a splitter is set as well: each
attention layer hands its inputs to it instead of attending, so the dense code between two
attention layers becomes one graph.
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
    # Set when the batch carries padding rows after the last sequence (a mixed step padded to a
    # graph bucket): the rows attention reads and writes. None: every row belongs to a sequence.
    num_tokens: int | None = None


_context: AttentionContext | None = None
_splitter = None  # a piecewise_graphs.GraphSplitter while mixed-step graphs are captured


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


def get_splitter():
    return _splitter


@contextmanager
def graph_splitter(splitter):
    global _splitter
    previous, _splitter = _splitter, splitter
    try:
        yield splitter
    finally:
        _splitter = previous
