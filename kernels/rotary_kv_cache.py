"""Triton rotary embedding fused with the KV-cache write, for the attention layer's hot path.

One program per token: it rotates the token's query heads in place, then rotates its key heads
straight into their cache slot and copies its value heads beside them. The rotated key never goes
back to the projection's buffer (attention reads keys from the cache only), and a step launches one
kernel where it launched two: at one decode row, where each launch is a few microseconds of a
~140 us layer, that matters. The reference is rotary_embedding_ref then write_kv_cache_ref.
"""

import torch
import triton
import triton.language as tl

from pagoda.kernels import pdl
from pagoda.kernels.fp8_cast import round_first, to_cache
from pagoda.kernels.rotary import _cos_sin, _rotate_heads


@triton.jit
def _rotary_kv_cache_kernel(
    positions_ptr, q_ptr, k_ptr, v_ptr, cos_sin_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cs,
    stride_cb, stride_co, stride_ch, block_size, k_scale, v_scale,
    num_heads, num_kv_heads, head_dim,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_PASS: tl.constexpr, HAS_PASS: tl.constexpr,
    FP8: tl.constexpr, ROUND_FIRST: tl.constexpr, PDL: tl.constexpr,
):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(positions_ptr, cos_sin_ptr, token, stride_cs, HALF, BLOCK_HALF)
    # the query in place: its unrotated tail (partial rotary) is already where it belongs
    _rotate_heads(q_ptr, q_ptr, stride_qt, stride_qh, stride_qt, stride_qh, token, num_heads,
                  head_dim, cos, sin, HALF, BLOCK_H, BLOCK_HALF, BLOCK_PASS, False)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:  # -1 marks a padding token, whose key and value must not land anywhere
        row = (slot // block_size) * stride_cb + (slot % block_size) * stride_co
        # the cache row is the key's destination: token stride 0, the row offset folded in
        _rotate_heads(k_ptr, k_cache_ptr + row, stride_kt, stride_kh, 0, stride_ch, token, num_kv_heads,
                      head_dim, cos, sin, HALF, BLOCK_KH, BLOCK_HALF, BLOCK_PASS, HAS_PASS,
                      k_scale, FP8, ROUND_FIRST)
        h = tl.arange(0, BLOCK_KH)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < num_kv_heads) & (d < head_dim)
        v = tl.load(v_ptr + token * stride_vt + h * stride_vh + d, mask=mask)
        tl.store(v_cache_ptr + row + h * stride_ch + d,
                 to_cache(v, v_scale, v_cache_ptr.dtype.element_ty, FP8, ROUND_FIRST), mask=mask)


def rotary_kv_cache(
    positions: torch.Tensor,  # [num_tokens] int64
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]; head_dim contiguous; rotated in place
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]; read only
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, rotary_dim] float32
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 skips
    k_scale: float = 1.0,  # FP8 caches only: the cache holds k / k_scale, v / v_scale
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Returns the query, rotated in place; the rotated key and the value land in their slots."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    rotary_dim = cos_sin_cache.shape[-1]
    assert query.stride(-1) == 1 and key.stride(-1) == 1 and value.stride(-1) == 1
    assert cos_sin_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    if num_tokens == 0:
        return query
    half = rotary_dim // 2
    pass_dim = head_dim - rotary_dim
    _rotary_kv_cache_kernel[(num_tokens,)](
        positions, query, key, value, cos_sin_cache, k_cache, v_cache, slot_mapping,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cos_sin_cache.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.shape[1],
        float(k_scale), float(v_scale), num_heads, num_kv_heads, head_dim,
        HALF=half, BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_KH=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half), BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_PASS=triton.next_power_of_2(max(pass_dim, 1)), HAS_PASS=pass_dim > 0,
        FP8=k_cache.dtype == torch.float8_e4m3fn, ROUND_FIRST=round_first(k_cache),
        PDL=(on := pdl.flag(query, num_tokens)), num_warps=4 if num_heads * head_dim >= 2048 else 1,
        **pdl.options(on),
    )
    return query
