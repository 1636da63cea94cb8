"""The GEMV's folds for one-row decode layers (kernels/gemv.py): the pieces its kernel calls, with
the loads of x and the FP8 scales that the GEMVs (gemv.py, gemv_fp8.py) share.

Each takes a kernel boundary out of a decode layer at one row (each costs a few microseconds there,
whatever PDL overlaps):
- GemvNorm: x is the RMSNorm's input, not its output. Each program first sums the squares of x
  (+ residual) over the whole row for rstd (or adds up the sums a GemvNorm.sumsq carries), then
  feeds RMSNorm(x + residual) * weight to the product chunk by chunk, rounded at each step as
  kernels/norm.py rounds it; the first program also writes x + residual (the residual stream).
- ResidualSumsq: the product is added to the residual stream in place, and each program writes
  the sum of the squares of its columns, so the next GEMV's GemvNorm needs no pass over the row.
- store_glu (epilogue="silu_mul"): W is the MLP's merged [2 * I, K] gate|up weight and the output
  silu(gate) * up [M, I]. A program owns the same rows of both halves, so the activation is
  computed where the two sums are, and down_proj reads a plain [M, I] input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True, slots=True)
class GemvNorm:
    """The RMSNorm folded into the GEMV's input: x is normalised as RMSNorm(x + residual) * weight,
    and x + residual is written to residual_out (a buffer other than residual and x: every program
    reads those while the first one writes)."""
    weight: torch.Tensor  # [K], x's dtype
    eps: float
    residual: torch.Tensor | None = None  # [M, K]; None: RMSNorm(x) * weight, nothing written
    residual_out: torch.Tensor | None = None  # [M, K], needed with residual
    # float32 [P]: x's squares summed in P parts by the GEMV that wrote x (gemv's residual_sumsq),
    # so rstd needs no pass over x; one row, no residual.
    sumsq: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class ResidualSumsq:
    """The GEMV's output added to the residual stream, x @ W^T + residual (out may be residual
    itself: each program reads and writes its own columns), with each program's sum of the squares
    of its columns in sumsq [programs], float32: what the next GEMV's folded RMSNorm needs for rstd
    (GemvNorm.sumsq). One row, one K split."""
    residual: torch.Tensor  # [1, N]
    sumsq: torch.Tensor  # [cdiv(N, block_n)] float32


@triton.jit
def load_x(ptrs, offs_k, K, EVEN_K: tl.constexpr):
    # x is a few KB that every program reads: keep it in L2 while the weights stream past.
    if EVEN_K:
        return tl.load(ptrs, eviction_policy="evict_last")
    return tl.load(ptrs, mask=offs_k < K, other=0.0, eviction_policy="evict_last")


@triton.jit
def norm_input(x_ptr, r_ptr, m, stride_xm, stride_rm, offs_k, K, RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr):
    """x (+ residual) of row m at offs_k, in x's dtype: the sum rounded as kernels/norm.py rounds it."""
    v = load_x(x_ptr + m * stride_xm + offs_k, offs_k, K, EVEN_K)
    if RESIDUAL:
        r = load_x(r_ptr + m * stride_rm + offs_k, offs_k, K, EVEN_K)
        v = (v.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return v


@triton.jit
def row_rstd(x_ptr, r_ptr, h_ptr, m, stride_xm, stride_rm, stride_hm, chunk, K, eps, write,
              RESIDUAL: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / rms of row m of x (+ residual) over all of K, the folded norm's first pass; where
    `write`, the row's x + residual is stored to h_ptr on the way."""
    squares = tl.zeros(chunk.shape, tl.float32)
    for k in range(0, K, BLOCK_K):
        h = norm_input(x_ptr, r_ptr, m, stride_xm, stride_rm, k + chunk, K, RESIDUAL, False)
        if RESIDUAL:
            tl.store(h_ptr + m * stride_hm + k + chunk, h, mask=((k + chunk) < K) & write)
        squares += h.to(tl.float32) * h.to(tl.float32)
    return tl.rsqrt(tl.sum(tl.sum(squares, axis=1), axis=0) / K + eps)


@triton.jit
def row_scales(scale_ptr, rows, N, PER_ROW: tl.constexpr):
    """The FP8 weight's float32 scale of each output row: its own, or the tensor's one."""
    if PER_ROW:
        return tl.load(scale_ptr + rows, mask=rows < N, other=1.0)
    else:
        return tl.load(scale_ptr)


@triton.jit
def store_residual_sumsq(out_ptr, acc, rows, scale, bias, r_ptr, sq_ptr, pid_n, N,
                          HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Row 0 of y + residual, y rounded to the output dtype first and the sum rounded again, as
    the norm kernel's residual add rounds them; and the program's sum of squares of the sum."""
    y = tl.sum(acc, axis=1)
    if HAS_SCALE:
        y *= scale
    if HAS_BIAS:
        y += bias
    dtype = out_ptr.dtype.element_ty
    r = tl.load(r_ptr + rows, mask=rows < N, other=0.0)
    h = (y.to(dtype).to(tl.float32) + r.to(tl.float32)).to(dtype)
    tl.store(out_ptr + rows, h, mask=rows < N)
    hf = tl.where(rows < N, h.to(tl.float32), 0.0)
    tl.store(sq_ptr + pid_n, tl.sum(hf * hf, axis=0))


@triton.jit
def store_glu(out_ptr, gate_acc, up_acc, rows, scale_ptr, bias_ptr, N,
               HAS_SCALE: tl.constexpr, SCALE_PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr):
    """silu(gate) * up for the program's rows of one row of x, each of gate and up rounded to the
    output dtype first, as a separate silu_and_mul kernel would find them (kernels/activation.py)."""
    gate = tl.sum(gate_acc, axis=1)
    up = tl.sum(up_acc, axis=1)
    if HAS_SCALE:
        gate *= row_scales(scale_ptr, rows, N, SCALE_PER_ROW)
        up *= row_scales(scale_ptr + N, rows, N, SCALE_PER_ROW)
    if HAS_BIAS:
        gate += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        up += tl.load(bias_ptr + N + rows, mask=rows < N, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)
    act = silu.to(tl.float32) * up.to(dtype).to(tl.float32)
    tl.store(out_ptr + rows, act.to(dtype), mask=rows < N)


def norm_args(norm: GemvNorm | None, x2: torch.Tensor, silu_mul: bool):
    """(residual as [M, K], residual_out as [M, K], norm weight) for the kernel; x2 itself where a
    part is absent (never read)."""
    if norm is None:
        return x2, x2, x2
    assert not silu_mul, "a folded norm feeds a plain input, not gate|up"
    k = x2.shape[1]
    assert norm.weight.shape == (k,) and norm.weight.dtype == x2.dtype and norm.weight.is_contiguous(), (
        f"the norm weight must be [{k}] in x's dtype {x2.dtype}")
    if norm.residual is None:
        return x2, x2, norm.weight
    assert norm.residual_out is not None, "a residual needs residual_out for x + residual"
    r2, h2 = norm.residual.reshape(x2.shape), norm.residual_out.view(x2.shape)
    assert r2.stride(-1) == 1 and h2.stride(-1) == 1, "residual rows must be contiguous"
    assert h2.data_ptr() not in (x2.data_ptr(), r2.data_ptr()), (
        "residual_out must not alias x or residual: every program reads them while one writes")
    return r2, h2, norm.weight
