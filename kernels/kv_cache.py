"""Triton KV-cache write: scatter each new token's key and value rows into their cache slots.

One program per token moves every KV head of that token, so a program writes num_kv_heads *
head_dim contiguous elements of one cache row, which is one coalesced store per tensor. An FP8
cache gets k / k_scale and v / v_scale, clamped and rounded to e4m3 (kv_cache_ref.to_cache).
"""

import torch
import triton
import triton.language as tl

from pagoda.kernels.fp8_cast import round_first, to_cache


@triton.jit
def _write_kv_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    block_size, k_scale, v_scale,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, FP8: tl.constexpr, ROUND_FIRST: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:  # -1 marks a padding token, whose row must not land anywhere
        block = slot // block_size
        offset = slot % block_size
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
        dst = block * stride_cb + offset * stride_cs + h * stride_ch + d
        k = tl.load(key_ptr + token * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(value_ptr + token * stride_vt + h * stride_vh + d, mask=mask)
        tl.store(k_cache_ptr + dst, to_cache(k, k_scale, k_cache_ptr.dtype.element_ty, FP8, ROUND_FIRST), mask=mask)
        tl.store(v_cache_ptr + dst, to_cache(v, v_scale, v_cache_ptr.dtype.element_ty, FP8, ROUND_FIRST), mask=mask)


def write_kv_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]; last dim contiguous
    value: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 skips
    k_scale: float = 1.0,  # FP8 caches only
    v_scale: float = 1.0,
) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert key.stride(-1) == 1 and value.stride(-1) == 1, "head_dim must be contiguous"
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    _write_kv_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[1], float(k_scale), float(v_scale),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        FP8=k_cache.dtype == torch.float8_e4m3fn, ROUND_FIRST=round_first(k_cache),
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )
