"""Attention over the paged KV cache: rotate, write this step's keys and values, then attend.

The layer owns no batching logic. Where each token goes (slot_mapping) and what each sequence
sees (block_tables, seq_lens, query_start_loc) come from the AttentionContext, so decode, chunked
prefill and prefix-cache extension are the same call.
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.runtime.worker.attention_context import get_context, get_splitter


class Attention(nn.Module):
    """One layer's attention, with its own parameters: scale, sliding window (tokens a query sees,
    itself included; None = all before it) and score soft-cap (Gemma 2), so local and global
    layers of one model differ here and nowhere else."""

    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int, scale: float,
                 sliding_window: int | None = None, softcap: float | None = None):
        super().__init__()
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale
        self.sliding_window, self.softcap = sliding_window, softcap
        # Bound by the model runner once the pool is sized: [num_blocks, block_size, kv_heads, dim].
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        # Per-tensor scales of an FP8 cache (cache = k / k_scale): the checkpoint's k_scale and
        # v_scale when it ships them, else 1.0, as in vLLM. Unused by a bf16/fp32 cache.
        self.k_scale = 1.0
        self.v_scale = 1.0

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> torch.Tensor:
        """q and k arrive unrotated: one kernel rotates them and writes the cache (on the GPU)."""
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        splitter = get_splitter()
        if splitter is not None:  # capturing mixed-step graphs: attention runs between them
            return splitter.split(self, q, k, v, positions, cos_sin_cache)
        return self.attend(q, k, v, positions, cos_sin_cache)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate, write the cache and attend over the context's sequences. q, k, v: [rows, heads,
        head_dim]. out ([rows, heads * head_dim]) receives the result when given. Rows past
        ctx.num_tokens are padding outside every sequence: they are neither written nor attended,
        and their output rows are zeros (or what `out` held)."""
        ctx = get_context()
        rows = q.shape[0]
        n = rows if ctx.num_tokens is None else ctx.num_tokens
        if n < rows:
            q, k, v, positions = q[:n], k[:n], v[:n], positions[:n]
        k_scale, v_scale = self._cache_scales()
        q = ops.rotary_kv_cache(positions, q, k, v, cos_sin_cache, self.k_cache, self.v_cache,
                                ctx.slot_mapping[:n], k_scale, v_scale)
        return self.attend_rotated(q, rows, out)

    def attend_rotated(self, q: torch.Tensor, rows: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of the rotated query q [n, heads, head_dim] over the cache, which holds this
        step's keys and values already; the result in out [rows, heads * head_dim] (rows >= n;
        rows past n are zeros, or what out held)."""
        ctx = get_context()
        n = q.shape[0]
        rows = n if rows is None else rows
        if out is None:
            out = (torch.empty if n == rows else torch.zeros)(rows, self.num_heads * self.head_dim, dtype=q.dtype,
                                                              device=q.device)
        k_scale, v_scale = self._cache_scales()
        result = ops.paged_attention(
            q,
            self.k_cache,
            self.v_cache,
            ctx.block_tables,
            ctx.seq_lens,
            ctx.query_start_loc,
            self.scale,
            sliding_window=self.sliding_window,
            softcap=self.softcap,
            k_scale=k_scale,
            v_scale=v_scale,
            max_query_len=ctx.max_query_len,
            max_seq_len=ctx.max_seq_len,
            num_decode_seqs=ctx.num_decode_seqs,
            out=out[:n].view(n, self.num_heads, self.head_dim),
        )
        if result.data_ptr() != out.data_ptr():  # the CPU reference returns a tensor of its own
            out[:n] = result.reshape(n, -1)
        return out

    def project_rotated(self, qkv_proj, hidden: torch.Tensor, positions: torch.Tensor,
                        cos_sin_cache: torch.Tensor) -> torch.Tensor | None:
        """The rotated query [1, heads, head_dim] of one decode row straight from qkv_proj's kernel,
        which has written this row's key and value to the cache too (ops.gemv_rope_kv); None where
        that fold does not apply, and the caller projects, then attends. Not while mixed-step
        graphs are captured (attention runs between their pieces), nor before the cache is bound."""
        if not ops.FOLD_ROPE_KV or get_splitter() is not None or self.k_cache.numel() == 0:
            return None
        ctx = get_context()
        if ctx.num_tokens not in (None, 1):
            return None
        k_scale, v_scale = self._cache_scales()
        q = qkv_proj.forward_rope_kv(hidden, positions=positions, cos_sin_cache=cos_sin_cache, k_cache=self.k_cache,
                                     v_cache=self.v_cache, slot_mapping=ctx.slot_mapping, k_scale=k_scale,
                                     v_scale=v_scale)
        return None if q is None else q.view(1, self.num_heads, self.head_dim)

    def _cache_scales(self) -> tuple[float, float]:
        # the scales belong to an FP8 cache only; a bf16/fp32 cache holds k and v as they are
        return (self.k_scale, self.v_scale) if self.k_cache.dtype == torch.float8_e4m3fn else (1.0, 1.0)
