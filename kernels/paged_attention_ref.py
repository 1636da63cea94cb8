"""Reference attention over the paged KV cache, for decode, prefill and prefix extension alike.

Queries are packed back to back (variable length). Sequence s owns query rows
query_start_loc[s]:query_start_loc[s+1], and has seq_lens[s] tokens of context in the cache,
including its new tokens, which the caller has already written there. Its query row i sits at
position seq_lens[s] - q_len + i and attends causally to every cached position up to its own, or,
with a sliding window of w, to the w positions ending at its own (as transformers' sliding mask).
Soft-capping (Gemma 2) squashes each score: cap * tanh(score / cap). An FP8 cache holds k / k_scale
and v / v_scale (kv_cache_ref): read back, each is multiplied by its scale.
"""

import torch


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, first_block: int = 0) -> torch.Tensor:
    """Tokens first_block * block_size .. seq_len - 1 of one sequence, [n, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[first_block:num_blocks].long()]  # [n, block_size, kv_heads, head_dim]
    return blocks.reshape(-1, *cache.shape[2:])[: seq_len - first_block * block_size]


def paged_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the new tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    num_heads = query.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_size = k_cache.shape[1]
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for s, seq_len in enumerate(seq_lens.tolist()):
        q = query[starts[s] : starts[s + 1]].float()  # [q_len, H, D]
        q_len = q.shape[0]
        if q_len == 0:
            continue
        # Blocks wholly before the first row's window are not read: they may be freed already.
        first = max(0, seq_len - q_len - sliding_window + 1) // block_size if sliding_window else 0
        k = gather_kv(k_cache, block_tables[s], seq_len, first).float().repeat_interleave(group, dim=1) * k_scale
        v = gather_kv(v_cache, block_tables[s], seq_len, first).float().repeat_interleave(group, dim=1) * v_scale
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        k_pos = torch.arange(first * block_size, seq_len, device=query.device)
        hidden = k_pos[None, :] > q_pos[:, None]
        if sliding_window:
            hidden |= k_pos[None, :] <= q_pos[:, None] - sliding_window
        scores.masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[starts[s] : starts[s + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out
