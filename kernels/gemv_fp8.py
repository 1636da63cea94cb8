"""Triton weight-only FP8 GEMV, second version: y[M, N] = act(x)[M, K] @ (q[N, K] * scale[N])^T, M <= 8.

x stays in its dtype (bf16/fp16/fp32) and each e4m3 weight is widened in registers, as in gemv.py;
what changes is where x lives. gemv.py loads an x chunk in the layout its own load prefers (16
bytes of bf16: 8 values a thread) and the weights in theirs (16 bytes of e4m3: 16 a thread), so
every loop step moves x through shared memory to meet the weights, with two barriers that stall
all the program's warps between its weight loads (the sm_90 SASS of the 8B launches shows it).
Here both are loaded as [rows, BLOCK_K // VEC, VEC] chunks with VEC = 8 (8 bytes of weight, 16 of
bf16 x per thread), and with BLOCK_K >= 8 * 32 * num_warps Triton lays the two out alike (every
warp along K), so x broadcasts over the weight rows in registers: the loop has no barrier and no
shared memory, and each x value a thread holds serves all its BLOCK_N weight rows.

All rows of x are one extra tensor dimension (M_PAD, the next power of two), so 1..8 rows share
one loop and every weight is read once for all of them. Split-K and the fp32 partials' reduce are
gemv.py's; act="silu_mul" takes the MLP's gate|up and multiplies by silu(gate) * up, rounded as
kernels/activation.py rounds it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagoda.kernels.gemv import (
    FP8_DTYPES,
    _num_sms,
    empty_result,
    reduce_splits,
    rows_and_out,
    split_k_plan,
)
from pagoda.kernels.gemv_folds import row_scales

MAX_ROWS = 8
VEC = 8  # K values per thread and load: 8 bytes of e4m3, 16 of bf16 x (the layouts then agree)


@dataclass(frozen=True, slots=True)
class Fp8GemvConfig:
    block_n: int = 8
    block_k: int = 1024  # >= VEC * 32 * num_warps keeps x in the weights' layout
    split_k: int = 1
    num_warps: int = 4


@functools.lru_cache(maxsize=256)
def fp8_gemv_config(m: int, n: int, k: int, num_sms: int = 132) -> Fp8GemvConfig:
    """A heuristic launch; the runtime takes this kernel only where a measured launch won
    (kernels/fp8_dispatch.py). Fewer weight rows per program as x's rows grow (each row keeps
    BLOCK_N accumulators a thread), K split until the SMs have programs."""
    num_warps = 4
    block_k = min(VEC * 32 * num_warps, max(VEC, triton.next_power_of_2(k)))
    block_n = 8 if m <= 4 else 4
    split_k = 1
    while triton.cdiv(n, block_n) * split_k < 2 * num_sms and k >= 2 * split_k * 2 * block_k:
        split_k *= 2
    return Fp8GemvConfig(block_n, block_k, split_k, num_warps)


@triton.jit
def _x_chunk(x_rows, offs, K, SILU_MUL: tl.constexpr, EVEN_K: tl.constexpr):
    """x's rows at offs ([M_PAD, 1, BLOCK_K // VEC, VEC]), in fp32; with SILU_MUL silu(gate) * up."""
    # x is a few KB every program reads: keep it in L2 while the weights stream past
    if EVEN_K:
        v = tl.load(x_rows + offs, eviction_policy="evict_last")
    else:
        v = tl.load(x_rows + offs, mask=offs < K, other=0.0, eviction_policy="evict_last")
    if SILU_MUL:
        if EVEN_K:
            up = tl.load(x_rows + K + offs, eviction_policy="evict_last")
        else:
            up = tl.load(x_rows + K + offs, mask=offs < K, other=0.0, eviction_policy="evict_last")
        gate = v.to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(v.dtype)
        v = (silu.to(tl.float32) * up.to(tl.float32)).to(v.dtype)
    return v.to(tl.float32)


@triton.jit
def _fp8_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split, stride_xm, stride_wn, stride_om,
    SCALE_PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, PARTIAL: tl.constexpr,
    EVEN_K: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, VEC: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, M_PAD)
    # Rows past N re-read row N - 1 and rows past M row M - 1, so the loads stay unpredicated
    # (and vectorized); their results are dropped at the store.
    w_rows = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[None, :, None, None] * stride_wn
    x_rows = x_ptr + tl.minimum(m, M - 1).to(tl.int64)[:, None, None, None] * stride_xm
    chunk = (tl.arange(0, BLOCK_K // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :])[None, None, :, :]
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = tl.zeros((M_PAD, BLOCK_N, BLOCK_K // VEC), tl.float32)
    for k in range(k_begin, k_end, BLOCK_K):
        offs = k + chunk
        # the weights are read once per step: do not let them push x out of L2
        if EVEN_K:
            w = tl.load(w_rows + offs, eviction_policy="evict_first")
        else:
            w = tl.load(w_rows + offs, mask=offs < K, other=0.0, eviction_policy="evict_first")
        # e4m3 widens exactly; the scale waits for the sum
        acc += tl.sum(w.to(tl.float32) * _x_chunk(x_rows, offs, K, SILU_MUL, EVEN_K), axis=3)
    y = tl.sum(acc, axis=2)  # [M_PAD, BLOCK_N]
    keep = (m[:, None] < M) & (rows[None, :] < N)
    if PARTIAL:  # fp32 partials [splits, M, N]; gemv.py's reduce kernel scales and adds the bias
        tl.store(out_ptr + (pid_k * M + m[:, None]) * N + rows[None, :], y, mask=keep)
    else:
        y *= row_scales(scale_ptr, rows, N, SCALE_PER_ROW)[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + m[:, None] * stride_om + rows[None, :], y.to(out_ptr.dtype.element_ty), mask=keep)


def fp8_gemv(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None, *,
    act: str | None = None, out: torch.Tensor | None = None, config: Fp8GemvConfig | None = None,
) -> torch.Tensor:
    """x [..., K] (or [..., 2 * K], gate then up, with act="silu_mul") with at most MAX_ROWS rows;
    weight [N, K] e4m3 row-major, weight_scale float32 [N] (per row) or [] / [1] (per tensor).
    Returns [..., N] in x's dtype (into out, if given); gemv_ref's arithmetic."""
    assert act in (None, "silu_mul"), f"unknown act {act!r}"
    n, k = weight.shape
    assert weight.dtype in FP8_DTYPES, "weight must be e4m3"
    assert weight_scale.dtype == torch.float32 and weight_scale.numel() in (1, n) and weight_scale.is_contiguous(), (
        f"weight_scale {tuple(weight_scale.shape)}: float32, one per output row ({n}) or one per tensor")
    silu_mul = act == "silu_mul"
    x2, out, out2, m = rows_and_out(x, weight, silu_mul, out, MAX_ROWS, "fp8_gemv")
    if m == 0 or n == 0 or k == 0:
        return empty_result(out, bias, k)
    cfg = config or fp8_gemv_config(m, n, k, _num_sms(x.device))
    k_per_split, splits = split_k_plan(k, cfg.split_k, cfg.block_k)
    per_row = weight_scale.numel() != 1
    has_bias = bias is not None
    bias_arg = bias if has_bias else weight_scale  # never read
    target = out2 if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    _fp8_gemv_kernel[(triton.cdiv(n, cfg.block_n), splits)](
        x2, weight, weight_scale, bias_arg, target,
        m, n, k, k_per_split, x2.stride(0), weight.stride(0), out2.stride(0),
        SCALE_PER_ROW=per_row, HAS_BIAS=has_bias, SILU_MUL=silu_mul, PARTIAL=splits > 1,
        EVEN_K=k % k_per_split == 0, M_PAD=triton.next_power_of_2(m), BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, VEC=min(VEC, cfg.block_k), num_warps=cfg.num_warps, num_stages=1,
    )
    if splits > 1:
        reduce_splits(target, weight_scale, per_row, bias, out2)
    return out
