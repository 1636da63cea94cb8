"""Triton rotary embedding in the rotate-half (GPT-NeoX) layout that Llama-family HF models use.

One program per token rotates every query and key head of that token, reading its cos/sin row
from cos_sin_cache once ([max_position, rotary_dim], cos then sin; llama3 scaling is already baked
into the cache by the model layer). With rotary_dim < head_dim the tail passes through unchanged.
Out of place by default (the reference's contract); inplace=True rotates query and key where they
lie, which saves the copy when the model owns the buffers.
"""

import torch
import triton
import triton.language as tl

from pagoda.kernels.fp8_cast import to_cache


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, stride_st, stride_sh, stride_dt, stride_dh, token, num_heads, head_dim,
    cos, sin, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr, COPY_PASS: tl.constexpr,
    scale=1.0, FP8: tl.constexpr = False, ROUND_FIRST: tl.constexpr = False,
):
    """FP8=True: dst is an e4m3 KV cache, which gets the rotated values / scale (kv_cache.to_cache)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < num_heads) & (j < HALF)
    src = src_ptr + token * stride_st + h * stride_sh
    dst = dst_ptr + token * stride_dt + h * stride_dh
    x1 = tl.load(src + j, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + j, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    tl.store(dst + j, to_cache(o1, scale, dst_ptr.dtype.element_ty, FP8, ROUND_FIRST), mask=mask)
    tl.store(dst + HALF + j, to_cache(o2, scale, dst_ptr.dtype.element_ty, FP8, ROUND_FIRST), mask=mask)
    if COPY_PASS:  # partial rotary: copy the unrotated tail into the fresh output
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, :]
        pmask = (h < num_heads) & (p < head_dim)
        tail = tl.load(src + p, mask=pmask)
        tl.store(dst + p, to_cache(tail, scale, dst_ptr.dtype.element_ty, FP8, ROUND_FIRST), mask=pmask)


@triton.jit
def _cos_sin(positions_ptr, cos_sin_ptr, token, stride_cs, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """This token's cos and sin rows, [1, BLOCK_HALF] in fp32."""
    pos = tl.load(positions_ptr + token).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_sin_ptr + pos * stride_cs + j, mask=j < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_cs,
    num_heads, num_kv_heads, head_dim,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, COPY_PASS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(positions_ptr, cos_sin_ptr, token, stride_cs, HALF, BLOCK_HALF)
    _rotate_heads(q_ptr, q_out_ptr, stride_qt, stride_qh, stride_qot, stride_qoh, token, num_heads,
                  head_dim, cos, sin, HALF, BLOCK_H, BLOCK_HALF, BLOCK_PASS, COPY_PASS)
    _rotate_heads(k_ptr, k_out_ptr, stride_kt, stride_kh, stride_kot, stride_koh, token, num_kv_heads,
                  head_dim, cos, sin, HALF, BLOCK_KH, BLOCK_HALF, BLOCK_PASS, COPY_PASS)


def rotary_embedding(
    positions: torch.Tensor,  # [num_tokens] int64
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]; head_dim contiguous
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, rotary_dim] float32
    *,
    inplace: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns the rotated (query, key): fresh tensors, the inputs themselves with inplace=True, or
    the given out pair (head_dim contiguous)."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    rotary_dim = cos_sin_cache.shape[-1]
    assert query.stride(-1) == 1 and key.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    if inplace:
        q_out, k_out = query, key
    elif out is not None:
        q_out, k_out = out
    else:
        q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    if num_tokens == 0:
        return q_out, k_out
    half = rotary_dim // 2
    pass_dim = head_dim - rotary_dim
    _rotary_kernel[(num_tokens,)](
        positions, query, key, q_out, k_out, cos_sin_cache,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cos_sin_cache.stride(0),
        num_heads, num_kv_heads, head_dim,
        HALF=half, BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_KH=triton.next_power_of_2(num_kv_heads), BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_PASS=triton.next_power_of_2(max(pass_dim, 1)), COPY_PASS=pass_dim > 0 and not inplace,
        num_warps=4 if num_heads * head_dim >= 2048 else 1,
    )
    return q_out, k_out
