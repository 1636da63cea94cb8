"""Group a batch's (token, expert) pairs by expert in three small Triton kernels.

The torch version (fused_moe_ref.align_by_expert_ref: a stable argsort and ~20 elementwise and
scan ops) costs about as much GPU time per MoE layer in a 256-token decode step as a fifth of the
layer's expert GEMMs, because each op is its own kernel even inside a CUDA graph. Here:
1. count: each pair adds one to its expert's counter (global atomics);
2. plan: one program turns the counts into each expert's padded run (a cumsum over experts),
   each BLOCK_M tile's expert, each expert's first free slot, and fills the list with the sentinel;
3. scatter: each pair takes the next free slot of its expert's run (an atomic fetch-and-add).

The order of pairs within one expert's run depends on the atomics' order, so it may differ from
run to run; nothing downstream depends on it: each row of a tile is computed on its own and
written back by pair index. The buffers have the same fixed sizes as the reference's, so a decode
step stays capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, num_pairs, CHUNK: tl.constexpr):
    i = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    valid = i < num_pairs
    expert = tl.load(ids_ptr + i, mask=valid, other=0).to(tl.int32)
    tl.atomic_add(counts_ptr + expert, 1, mask=valid)


@triton.jit
def _plan_kernel(counts_ptr, cursor_ptr, sorted_ptr, block_expert_ptr, num_pairs, num_experts, capacity,
                 BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, TILES: tl.constexpr):
    experts = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + experts, mask=experts < num_experts, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, axis=0)
    total = tl.sum(padded, axis=0)
    tl.store(cursor_ptr + experts, padded_end - padded, mask=experts < num_experts)
    num_tiles = capacity // BLOCK_M
    for t0 in range(0, num_tiles, TILES):
        tile = t0 + tl.arange(0, TILES)
        first = tile * BLOCK_M
        # the expert whose padded run holds slot `first`: how many runs end at or before it
        # (empty experts' runs end where the previous one does, so they are never picked)
        owner = tl.sum((padded_end[None, :] <= first[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + tile, tl.where(first < total, owner, -1), mask=tile < num_tiles)
        # the sentinel everywhere; the scatter kernel overwrites the real slots
        slots = first[:, None] + tl.arange(0, BLOCK_M)[None, :]
        tl.store(sorted_ptr + slots, tl.full([TILES, BLOCK_M], 0, tl.int32) + num_pairs,
                 mask=(tile < num_tiles)[:, None])


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, num_pairs, CHUNK: tl.constexpr):
    i = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    valid = i < num_pairs
    expert = tl.load(ids_ptr + i, mask=valid, other=0).to(tl.int32)
    slot = tl.atomic_add(cursor_ptr + expert, 1, mask=valid)
    tl.store(sorted_ptr + slot, i, mask=valid)


def capacity_of(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The worst-case padded length: every used expert's run rounded up to block_m."""
    return triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m) * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """As fused_moe_ref.align_by_expert_ref: (sorted_pairs [capacity] int32 with the sentinel
    num_pairs in padding, block_expert [capacity // block_m] int32, -1 past the end), except that
    pairs within one expert's run may come in any order."""
    flat = topk_ids.reshape(-1)
    num_pairs, dev = flat.numel(), flat.device
    capacity = capacity_of(num_pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=dev)
    cursor = torch.empty(num_experts, dtype=torch.int32, device=dev)
    sorted_pairs = torch.empty(capacity, dtype=torch.int32, device=dev)
    block_expert = torch.empty(capacity // block_m, dtype=torch.int32, device=dev)
    chunk = 256
    grid = (triton.cdiv(num_pairs, chunk),)
    _count_kernel[grid](flat, counts, num_pairs, CHUNK=chunk)
    _plan_kernel[(1,)](counts, cursor, sorted_pairs, block_expert, num_pairs, num_experts, capacity,
                       BLOCK_M=block_m, E_PAD=triton.next_power_of_2(num_experts), TILES=32)
    _scatter_kernel[grid](flat, cursor, sorted_pairs, num_pairs, CHUNK=chunk)
    return sorted_pairs, block_expert
