"""Triton FP8 GEMM for decode's few rows on tensor cores: y[M, N] = (q_x @ q_w^T) * s_x[m] * s_w[n].

q_x [M, K] is the activation quantized to e4m3 per token (or by a static scale), q_w [N, K] the
e4m3 weight with one float32 scale per output row: torch._scaled_mm's arithmetic, for M <= 16.
cuBLASLt runs it with a tile built for large M and streams the 8B model's FP8 weights at 1.0-2.5 of
4.25 TB/s at one row (e2e/results/gemv-fp8-at-d29891a/); the weight-only FP8 GEMV (gemv.py) widens
every weight on the CUDA cores and reaches 2.2-3.6 at one row but falls to 0.7-1.3 at four.

Here the operands are swapped (y^T = q_w @ q_x^T), so the weight rows fill the MMA's M side (64 or
128, a Hopper warpgroup MMA) and the few activation rows its N side (16, zero-padded): no weight
is converted or touched by an ALU, and the loop is Triton's pipelined GEMM loop (cp.async into
num_stages shared-memory buffers), which keeps the weight bytes in flight that a plain-load loop
does not. Rows up to 16 cost the same, so one launch serves every decode batch up to 16.

When N / BLOCK_N gives too few programs for the SMs, SPLIT_K programs share a row block's K range
and write fp32 partials already scaled by s_x, which gemv.py's split-K reduce kernel sums in a
fixed order (deterministic) before it applies s_w and the bias.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagoda.kernels.gemv import _num_sms, empty_result, reduce_splits, split_k_plan
from pagoda.kernels.quant_fp8_ref import FP8_DTYPE

MAX_ROWS = 16  # the MMA's N side: rows 1..16 are one tile


@dataclass(frozen=True, slots=True)
class ScaledGemvConfig:
    block_n: int = 64  # weight rows per program: the MMA's M (64 per warpgroup)
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4  # shared-memory buffers of the weight tile in flight


@functools.lru_cache(maxsize=256)
def scaled_gemv_config(n: int, k: int, num_sms: int = 132) -> ScaledGemvConfig:
    """A heuristic launch: 64-row blocks, and K split until every SM has a program; the runtime
    takes this path only where a measured launch beat _scaled_mm (kernels/fp8_dispatch.py)."""
    block_n, block_k = 64, min(256, max(32, triton.next_power_of_2(k)))
    split_k = 1
    while triton.cdiv(n, block_n) * split_k < num_sms and k >= 2 * split_k * 2 * block_k:
        split_k *= 2
    return ScaledGemvConfig(block_n, block_k, split_k)


@triton.jit
def _scaled_gemv_kernel(
    q_ptr, w_ptr, sx_ptr, sw_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split, stride_qm, stride_sx, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    # Rows past N re-read row N - 1 and rows past M re-read row M - 1, so the loads stay
    # unpredicated; their products are dropped at the store.
    w_ptrs = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * stride_wn + (k_begin + offs_k)[None, :]
    q_ptrs = q_ptr + tl.minimum(m, M - 1)[:, None] * stride_qm + (k_begin + offs_k)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k in range(k_begin, k_end, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")  # read once per step: keep x in L2
            q = tl.load(q_ptrs)
        else:
            in_k = (k + offs_k < K)[None, :]
            w = tl.load(w_ptrs, mask=in_k, other=0.0, eviction_policy="evict_first")
            q = tl.load(q_ptrs, mask=in_k, other=0.0)
        acc = tl.dot(w, tl.trans(q), acc)  # [BLOCK_N, BLOCK_M], fp32
        w_ptrs += BLOCK_K
        q_ptrs += BLOCK_K
    acc *= tl.load(sx_ptr + m * stride_sx, mask=m < M, other=0.0)[None, :]
    keep = (m[None, :] < M) & (rows[:, None] < N)
    if PARTIAL:  # fp32 partials [splits, M, N]; the reduce kernel applies s_w and the bias
        tl.store(out_ptr + (pid_k * M + m[None, :]) * N + rows[:, None], acc, mask=keep)
    else:
        acc *= tl.load(sw_ptr + rows, mask=rows < N, other=0.0)[:, None]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + m[None, :] * stride_om + rows[:, None], acc.to(out_ptr.dtype.element_ty), mask=keep)


def scaled_gemv(
    q: torch.Tensor, scale_x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None, *, out_dtype: torch.dtype = torch.bfloat16,
    config: ScaledGemvConfig | None = None,
) -> torch.Tensor:
    """q [M, K] e4m3 (K contiguous), scale_x float32 [M, 1] (a static scale expanded is fine);
    weight [N, K] e4m3 row-major, weight_scale float32 [N]; returns [M, N] in out_dtype."""
    m, k = q.shape
    n = weight.shape[0]
    assert q.dtype == FP8_DTYPE and weight.dtype == FP8_DTYPE, "q and weight must be e4m3"
    assert weight.shape[1] == k and weight.stride(1) == 1 and q.stride(1) == 1, "K must be contiguous"
    assert m <= MAX_ROWS, f"scaled_gemv takes at most {MAX_ROWS} rows, got {m}"
    assert scale_x.dtype == torch.float32 and scale_x.shape[0] == m, "scale_x: float32, one per row"
    assert weight_scale.dtype == torch.float32 and weight_scale.numel() == n and weight_scale.is_contiguous(), (
        f"weight_scale {tuple(weight_scale.shape)}: float32, one per output row ({n})")
    out = torch.empty(m, n, dtype=out_dtype, device=q.device)
    if m == 0 or n == 0 or k == 0:
        return empty_result(out, bias, k)
    cfg = config or scaled_gemv_config(n, k, _num_sms(q.device))
    k_per_split, splits = split_k_plan(k, cfg.split_k, cfg.block_k)
    has_bias = bias is not None
    bias_arg = bias if has_bias else weight_scale  # never read
    target = out if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=q.device)
    _scaled_gemv_kernel[(triton.cdiv(n, cfg.block_n), splits)](
        q, weight, scale_x, weight_scale, bias_arg, target,
        m, n, k, k_per_split, q.stride(0), scale_x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=has_bias, PARTIAL=splits > 1, EVEN_K=k % k_per_split == 0,
        BLOCK_M=MAX_ROWS, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        reduce_splits(target, weight_scale, True, bias, out)
    return out
