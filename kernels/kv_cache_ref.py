"""Reference for the KV-cache write: scatter each new token's key and value into its slot."""

import torch


def write_kv_cache_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # same shape as k_cache
    slot_mapping: torch.Tensor,  # [num_tokens] int64; slot = block * block_size + offset; -1 skips
) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    num_blocks, block_size = k_cache.shape[:2]
    k_flat = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    v_flat = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    k_flat[slots] = key[keep].to(k_cache.dtype)
    v_flat[slots] = value[keep].to(v_cache.dtype)
