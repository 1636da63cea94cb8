"""Inputs for e2e/kernels_gpu.py: paged-attention batches on the device, correct or bench-sized."""

from __future__ import annotations

import torch


def paged_batch(
    q_lens, seq_lens, num_kv_heads, group, head_dim, block_size, dtype, device, poison: bool = True
):
    """Packed queries over a cache whose blocks are scattered by a random permutation, as after
    hours of serving. With poison, every slot no sequence owns holds NaN, and spare block-table
    columns point at a NaN block, so any read past seq_len shows up in the output."""
    blocks_per_seq = torch.tensor([-(-s // block_size) for s in seq_lens])
    num_blocks = int(blocks_per_seq.sum()) + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    width = int(blocks_per_seq.max())
    order = torch.randperm(num_blocks - 1, device=device).int()
    column = torch.arange(width + 1, device=device)
    starts = torch.cumsum(blocks_per_seq, 0) - blocks_per_seq
    owned = column[None, :] < blocks_per_seq.to(device)[:, None]
    block_tables = torch.where(
        owned, order[(starts.to(device)[:, None] + column).clamp(max=num_blocks - 2)], num_blocks - 1
    ).int()
    if poison:
        used = torch.zeros(num_blocks * block_size, dtype=torch.bool, device=device)
        for s, seq_len in enumerate(seq_lens):
            pos = torch.arange(seq_len, device=device)
            used[block_tables[s, pos // block_size].long() * block_size + pos % block_size] = True
        for cache in (k_cache, v_cache):
            cache.view(-1, num_kv_heads, head_dim)[~used] = float("nan")
    query = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, dtype=dtype, device=device)
    query_start_loc = torch.tensor(
        [0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device
    )
    return (
        query,
        k_cache,
        v_cache,
        block_tables,
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc,
    )


def rope_cache(rotary_dim: int, max_position: int, device, base: float = 500000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32, device=device), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)
