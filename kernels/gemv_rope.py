"""The qkv projection of one decode row with rotary and the KV-cache write in its epilogue.

At one row a Llama layer's attention half runs the qkv GEMV, then kernels/rotary_kv_cache.py (one
small program that rotates q and k and writes k and v to their cache slot), then the decode
attention. The middle kernel moves a few KB; what it costs is its launch and its PDL hand-over, a
few microseconds of a ~75 us layer. Here the GEMV's programs do its work where the sums are.

Rotate-half pairs element j of a head with element j + head_dim / 2, so each program owns BLOCK_N
rows of one head's first half and the same rows of its second half (gemv.py's gate|up pairing, with
the partner rows head_dim / 2 apart instead of N). After the sums, a program of a query head writes
the rotated query to q_out, one of a key head its rotated key to the cache slot, one of a value head
the value. The arithmetic is the unfused pair's, rounding included: the product rounded to x's
dtype (as the GEMV stores it), then rotated in float32 and rounded (or, for an FP8 cache, divided
by its scale and cast) as rotary_kv_cache does, so the result is the same bits.

One row, one K split, full rotary (rotary_dim == head_dim); the weights bf16/fp16/fp32 or FP8
(e4m3, per-row or per-tensor float32 scales), as gemv.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagoda.kernels import pdl
from pagoda.kernels.fp8_cast import round_first, to_cache
from pagoda.kernels.gemv import FP8_DTYPES, GemvConfig, _accumulate, _weight_chunk, row_scales


@dataclass(frozen=True, slots=True)
class RopeKv:
    """Where the rotated query goes and what the cache write needs: the attention layer's own."""
    positions: torch.Tensor  # [>= 1] int64: the row's position first
    cos_sin_cache: torch.Tensor  # [max_position, head_dim] float32, cos then sin
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [>= 1] int64: the row's slot first; -1 writes nothing
    num_heads: int
    num_kv_heads: int
    k_scale: float = 1.0  # FP8 caches only: the cache holds k / k_scale, v / v_scale
    v_scale: float = 1.0


@triton.jit
def _store_rope_kv(q_ptr, k_cache_ptr, v_cache_ptr, y_lo, y_hi, head, j, pos_ptr, cos_sin_ptr, slot_ptr,
                   stride_cs, stride_cb, stride_co, stride_ch, block_size, k_scale, v_scale,
                   num_heads, num_kv_heads, HALF: tl.constexpr, FP8: tl.constexpr, ROUND_FIRST: tl.constexpr):
    dtype = q_ptr.dtype.element_ty
    x1 = y_lo.to(dtype).to(tl.float32)  # the GEMV's stored output, as rotary_kv_cache loads it
    x2 = y_hi.to(dtype).to(tl.float32)
    slot = tl.load(slot_ptr).to(tl.int64)
    row = (slot // block_size) * stride_cb + (slot % block_size) * stride_co
    if head < num_heads + num_kv_heads:  # a query or key head: rotated
        pos = tl.load(pos_ptr).to(tl.int64)
        cos = tl.load(cos_sin_ptr + pos * stride_cs + j)
        sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + j)
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        if head < num_heads:
            tl.store(q_ptr + head * (2 * HALF) + j, o1.to(dtype))
            tl.store(q_ptr + head * (2 * HALF) + HALF + j, o2.to(dtype))
        elif slot >= 0:
            dst = k_cache_ptr + row + (head - num_heads) * stride_ch
            tl.store(dst + j, to_cache(o1, k_scale, k_cache_ptr.dtype.element_ty, FP8, ROUND_FIRST))
            tl.store(dst + HALF + j, to_cache(o2, k_scale, k_cache_ptr.dtype.element_ty, FP8, ROUND_FIRST))
    elif slot >= 0:  # a value head
        dst = v_cache_ptr + row + (head - num_heads - num_kv_heads) * stride_ch
        tl.store(dst + j, to_cache(x1.to(dtype), v_scale, v_cache_ptr.dtype.element_ty, FP8, ROUND_FIRST))
        tl.store(dst + HALF + j, to_cache(x2.to(dtype), v_scale, v_cache_ptr.dtype.element_ty, FP8, ROUND_FIRST))


@triton.jit
def _gemv_rope_kv_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, q_ptr, pos_ptr, cos_sin_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    N, K, stride_wn, stride_cs, stride_cb, stride_co, stride_ch, block_size, k_scale, v_scale,
    num_heads, num_kv_heads,
    HALF: tl.constexpr, HAS_SCALE: tl.constexpr, SCALE_PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr,
    FP8: tl.constexpr, ROUND_FIRST: tl.constexpr, PDL: tl.constexpr,
):
    pdl.launch_dependents(PDL)
    pid = tl.program_id(0)
    # BLOCK_N divides HALF (the wrapper checks): a program's rows lie in one head's first half
    head = (pid * BLOCK_N) // HALF
    j = (pid * BLOCK_N) % HALF + tl.arange(0, BLOCK_N)
    lo = head * (2 * HALF) + j
    hi = lo + HALF
    w_lo = w_ptr + lo.to(tl.int64)[:, None, None] * stride_wn
    w_hi = w_ptr + hi.to(tl.int64)[:, None, None] * stride_wn
    chunk = tl.arange(0, BLOCK_K // FOLD)[:, None] * FOLD + tl.arange(0, FOLD)[None, :]
    acc_lo = tl.zeros((BLOCK_N, BLOCK_K // FOLD), tl.float32)
    acc_hi = tl.zeros((BLOCK_N, BLOCK_K // FOLD), tl.float32)
    # The first chunks load before the PDL wait, while the kernel before still runs (no kernel
    # writes weights); the query buffer and the cache are written only after it.
    w = _weight_chunk(w_lo, chunk, K, EVEN_K)
    w_up = _weight_chunk(w_hi, chunk, K, EVEN_K)
    pdl.wait(PDL)
    # gemv.py's paired accumulation (GLU_OUT): acc_lo takes the first half's rows, acc_hi the
    # second's; one row of x, so the third and fourth accumulators are never touched.
    acc_lo, acc_hi, _, _ = _accumulate(acc_lo, acc_hi, acc_lo, acc_lo, w, w_up, x_ptr, 0, chunk, K,
                                       x_ptr, 0, x_ptr, 1.0, 1.0, 1.0, 1.0,
                                       1, False, False, False, True, EVEN_K)
    for k in range(BLOCK_K, K, BLOCK_K):
        w = _weight_chunk(w_lo, k + chunk, K, EVEN_K)
        w_up = _weight_chunk(w_hi, k + chunk, K, EVEN_K)
        acc_lo, acc_hi, _, _ = _accumulate(acc_lo, acc_hi, acc_lo, acc_lo, w, w_up, x_ptr, 0, k + chunk, K,
                                           x_ptr, 0, x_ptr, 1.0, 1.0, 1.0, 1.0,
                                           1, False, False, False, True, EVEN_K)
    y_lo = tl.sum(acc_lo, axis=1)
    y_hi = tl.sum(acc_hi, axis=1)
    if HAS_SCALE:  # once, on the sum, as gemv.py's store
        y_lo *= row_scales(scale_ptr, lo, N, SCALE_PER_ROW)
        y_hi *= row_scales(scale_ptr, hi, N, SCALE_PER_ROW)
    if HAS_BIAS:
        y_lo += tl.load(bias_ptr + lo).to(tl.float32)
        y_hi += tl.load(bias_ptr + hi).to(tl.float32)
    _store_rope_kv(q_ptr, k_cache_ptr, v_cache_ptr, y_lo, y_hi, head, j, pos_ptr, cos_sin_ptr, slot_ptr,
                   stride_cs, stride_cb, stride_co, stride_ch, block_size, k_scale, v_scale,
                   num_heads, num_kv_heads, HALF, FP8, ROUND_FIRST)


def gemv_rope_kv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    rope: RopeKv,
    *,
    weight_scale: torch.Tensor | None = None,
    config: GemvConfig,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [1, K] (one row), weight [(num_heads + 2 * num_kv_heads) * head_dim, K], q first, then k,
    then v. Returns the rotated query [1, num_heads * head_dim] in x's dtype (into out, if given);
    the rotated key and the value land in rope's cache slot. config's split_k is not used (one split)."""
    n, k = weight.shape
    heads = rope.num_heads + 2 * rope.num_kv_heads
    head_dim = n // heads
    half = head_dim // 2
    x2 = x.reshape(-1, x.shape[-1])
    assert x2.shape == (1, k) and x2.stride(-1) == 1, f"one contiguous row of {k}, not {tuple(x.shape)}"
    assert weight.stride(1) == 1 and n == heads * head_dim and head_dim % 2 == 0, (
        f"weight {tuple(weight.shape)} is not q|k|v of {rope.num_heads} + 2 x {rope.num_kv_heads} heads")
    assert rope.cos_sin_cache.shape[-1] == head_dim and rope.cos_sin_cache.stride(-1) == 1, (
        "the fold takes full rotary (rotary_dim == head_dim)")
    assert half % config.block_n == 0, f"block_n {config.block_n} must divide head_dim / 2 = {half}"
    kc, vc = rope.k_cache, rope.v_cache
    assert kc.stride() == vc.stride() and kc.stride(-1) == 1 and kc.shape[-2:] == (rope.num_kv_heads, head_dim)
    fp8 = weight.dtype in FP8_DTYPES
    assert (weight_scale is not None) == fp8, "an FP8 weight needs its weight_scale, and only it"
    if out is None:
        out = torch.empty(1, rope.num_heads * head_dim, dtype=x.dtype, device=x.device)
    assert out.is_contiguous() and out.numel() == rope.num_heads * head_dim and out.dtype == x.dtype
    block_k = min(config.block_k, triton.next_power_of_2(k))
    _gemv_rope_kv_kernel[(n // 2 // config.block_n,)](
        x2, weight, weight_scale if fp8 else weight, bias if bias is not None else weight, out,
        rope.positions, rope.cos_sin_cache, kc, vc, rope.slot_mapping,
        n, k, weight.stride(0), rope.cos_sin_cache.stride(0), kc.stride(0), kc.stride(1), kc.stride(2), kc.shape[1],
        float(rope.k_scale), float(rope.v_scale), rope.num_heads, rope.num_kv_heads,
        HALF=half, HAS_SCALE=fp8, SCALE_PER_ROW=fp8 and weight_scale.numel() != 1, HAS_BIAS=bias is not None,
        EVEN_K=k % block_k == 0, BLOCK_N=config.block_n, BLOCK_K=block_k, FOLD=min(config.fold, block_k),
        FP8=kc.dtype == torch.float8_e4m3fn, ROUND_FIRST=round_first(kc),
        PDL=(on := pdl.flag(x2, 1)), num_warps=config.num_warps, num_stages=config.num_stages, **pdl.options(on),
    )
    return out
