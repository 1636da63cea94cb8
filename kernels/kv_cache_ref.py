"""Reference for the KV-cache write: scatter each new token's key and value into its slot.

An FP8 (e4m3) cache holds k / k_scale and v / v_scale, clamped to +-448 and rounded to nearest: a
per-tensor scale for each of the layer's caches, as vLLM's fp8 KV cache. Readers multiply back.
"""

import torch

FP8_MAX = 448.0


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    if cache_dtype == torch.float8_e4m3fn:
        return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(cache_dtype)
    return x.to(cache_dtype)


def write_kv_cache_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # same shape as k_cache
    slot_mapping: torch.Tensor,  # [num_tokens] int64; slot = block * block_size + offset; -1 skips
    k_scale: float = 1.0,  # FP8 caches only
    v_scale: float = 1.0,
) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    num_blocks, block_size = k_cache.shape[:2]
    k_flat = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    v_flat = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    k_flat[slots] = to_cache(key[keep], k_cache.dtype, k_scale)
    v_flat[slots] = to_cache(value[keep], v_cache.dtype, v_scale)
