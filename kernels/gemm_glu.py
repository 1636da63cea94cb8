"""Triton GEMM for the gated MLP's gate|up projection with the activation in its epilogue:
out = act(x @ gate^T) * (x @ up^T), for batches too wide for the GEMV (prefill, mixed steps, decode
at many seats).

Why. Through cuBLAS the projection writes both halves ([M, 2 * inter]), and silu_and_mul reads them
back and writes [M, inter]: three passes over activations that the GEMM had in registers. On the
0.5B W4 model at 1,024 seats that pass was 11.6% of the kernel time (e2e/results/fp8-peer-34f5b5f/)
and it runs at the copy bandwidth already, so only removing it helps.

Launch. Each program owns BLOCK_M rows and BLOCK_N columns of the output, so it reads BLOCK_N
rows of gate and the same BLOCK_N rows of up (inter rows further down the merged weight) and keeps
two accumulators. Programs are ordered in groups of GROUP_M row tiles, so a group's weight tiles
are read while they are still in L2. M is not specialised (do_not_specialize): any batch reuses
the launch compiled at warm-up, which the engine's compile watch would otherwise flag.

Two forms: tiles loaded through pointers (cp.async pipelining), or through tensor descriptors
(GluGemmConfig.tma: Hopper's TMA copies whole boxes into shared memory and zero-fills past the
ends, so no load is masked and the addresses cost no registers). The sweep picks between them.

Rounding follows the reference (F.linear, then silu_and_mul): each projection is rounded to x's
dtype, then the activation, then the product. The sums run in another order than cuBLAS's, so
the bits may differ in the last place, as with any two GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from pagoda.kernels.activation import gated_activation
from pagoda.kernels.attention_dot import _dot, dot_precision
from pagoda.kernels.gemv import is_hopper
from pagoda.kernels.gemv_tma import weight_descriptor


@dataclass(frozen=True)
class GluGemmConfig:
    block_m: int = 128
    block_n: int = 64
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = False  # read x and the weight through tensor descriptors (Hopper's TMA) instead of pointers


# The interpreter takes a small tile so CPU tests stay quick.
INTERPRETED = GluGemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=1, num_stages=1)
# What the GPU launches (launch_for), from the H100 sweep of e2e/gemm_glu_gpu_bench.py
# (e2e/results/gemm-glu-701bb9c/). No one launch beats cuBLAS + silu_and_mul at every batch, so the
# choice goes by rows and K:
# - below 128 rows a 64-row tile through pointers (1.12x on the 0.5B shape; TMA boxes of 128 rows
#   would load mostly zeros);
# - from 128 rows the TMA form, whose unmasked loads were 1.1-1.3x faster than the pointer form's;
# - 128 columns where each program's K loop is long enough to hide the wider epilogue (K above
#   1,024, or 2,048 rows and more), else 64 so the short-K 0.5B shape still fills 132 SMs.
SMALL_BATCH = GluGemmConfig(block_m=64, block_n=64, block_k=64, group_m=8, num_warps=4, num_stages=4)
NARROW_TMA = GluGemmConfig(block_m=128, block_n=64, block_k=64, group_m=8, num_warps=8, num_stages=3, tma=True)
WIDE_TMA = GluGemmConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3, tma=True)
# Off Hopper, or where rows are not 16-byte aligned, the pointer form of NARROW_TMA.
DEFAULT = GluGemmConfig()
# What e2e/gemm_glu_gpu_bench.py measures against cuBLAS; e2e/sm90_asm.py compiles each for sm_90 on
# the CPU (wgmma, no spills, shared memory within an H100's 227 KB).
CANDIDATES = (
    DEFAULT,
    GluGemmConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3),
    GluGemmConfig(block_m=128, block_n=64, block_k=64, group_m=8, num_warps=4, num_stages=4),
    SMALL_BATCH,
    GluGemmConfig(block_m=128, block_n=64, block_k=128, group_m=8, num_warps=8, num_stages=2),
    GluGemmConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=3),
    NARROW_TMA,
    WIDE_TMA,
    GluGemmConfig(block_m=128, block_n=64, block_k=64, group_m=8, num_warps=4, num_stages=4, tma=True),
)


def _tma_fits(x2: torch.Tensor, weight: torch.Tensor) -> bool:
    """The TMA table is Hopper's (its sweep ran there), and descriptors need a contiguous weight and
    16-byte aligned rows and bases."""
    if not is_hopper(x2.device) or not weight.is_contiguous():
        return False
    row_bytes = x2.shape[1] * x2.element_size()
    return (row_bytes % 16 == 0 and (x2.stride(0) * x2.element_size()) % 16 == 0
            and x2.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0)


def launch_for(x2: torch.Tensor, weight: torch.Tensor) -> GluGemmConfig:
    """The launch for a [M, K] batch x2 against the merged weight (see SMALL_BATCH and the TMA forms)."""
    if not x2.is_cuda:
        return INTERPRETED
    return choose_launch(*x2.shape, tma=_tma_fits(x2, weight))


def choose_launch(rows: int, k: int, tma: bool) -> GluGemmConfig:
    if rows < 128:
        return SMALL_BATCH
    if not tma:
        return DEFAULT
    return WIDE_TMA if k > 1024 or rows >= 2048 else NARROW_TMA


@triton.jit
def _program_tile(M, inter, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of this program, in groups of GROUP_M row tiles: a group walks one
    stripe of weight columns while its tiles are still in L2."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(inter, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % in_group) % group_rows, (pid % in_group) // group_rows


@triton.jit
def _store_glu(out_ptr, acc_gate, acc_up, rows, cols, M, inter, stride_om, ACTIVATION: tl.constexpr):
    """act(gate) * up into out, rounded as the reference: each projection, the activation, the product."""
    dtype = out_ptr.dtype.element_ty
    h = gated_activation(acc_gate, acc_up, dtype, ACTIVATION)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :], h.to(dtype),
             mask=(rows < M)[:, None] & (cols < inter)[None, :])


@triton.jit(do_not_specialize=["M"])
def _gemm_glu_tma_kernel(
    x_desc, w_desc, out_ptr, M, inter, K, stride_om,
    ACTIVATION: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """The same GEMM with its tiles brought into shared memory by TMA: the boxes past x's rows or the
    weight's end come back as zeros, so no load is masked. A gate box of the last column tile may
    reach into up's first rows when inter is not a multiple of BLOCK_N; those columns are not stored."""
    pid_m, pid_n = _program_tile(M, inter, BLOCK_M, BLOCK_N, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        a = x_desc.load([m0, k])
        acc_gate += _dot(a, tl.trans(w_desc.load([n0, k])), PRECISION)
        acc_up += _dot(a, tl.trans(w_desc.load([inter + n0, k])), PRECISION)
    _store_glu(out_ptr, acc_gate, acc_up, m0 + tl.arange(0, BLOCK_M), n0 + tl.arange(0, BLOCK_N), M, inter,
               stride_om, ACTIVATION)


@triton.jit(do_not_specialize=["M"])
def _gemm_glu_kernel(
    x_ptr, w_ptr, out_ptr, M, inter, K,
    stride_xm, stride_wn, stride_om,
    ACTIVATION: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _program_tile(M, inter, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < inter
    k = tl.arange(0, BLOCK_K)
    x_tile = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + k[None, :]
    gate_tile = w_ptr + cols.to(tl.int64)[None, :] * stride_wn + k[:, None]  # [BLOCK_K, BLOCK_N]
    up_tile = gate_tile + inter.to(tl.int64) * stride_wn
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k < K - k0
        a = tl.load(x_tile, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_ok = k_ok[:, None] & col_ok[None, :]
        acc_gate += _dot(a, tl.load(gate_tile, mask=w_ok, other=0.0), PRECISION)
        acc_up += _dot(a, tl.load(up_tile, mask=w_ok, other=0.0), PRECISION)
        x_tile += BLOCK_K
        gate_tile += BLOCK_K
        up_tile += BLOCK_K

    _store_glu(out_ptr, acc_gate, acc_up, rows, cols, M, inter, stride_om, ACTIVATION)


def gemm_glu(x: torch.Tensor, weight: torch.Tensor, activation: str = "silu",
             config: GluGemmConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """act(x @ weight[:inter]^T) * (x @ weight[inter:]^T) for x [..., K] and the merged gate|up
    weight [2 * inter, K]; returns [..., inter] in x's dtype (into out if given)."""
    assert activation in ("silu", "gelu_tanh"), activation
    two_inter, K = weight.shape
    assert two_inter % 2 == 0 and x.shape[-1] == K and weight.stride(1) == 1
    inter = two_inter // 2
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    if out is None:
        out = torch.empty(*x.shape[:-1], inter, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, inter)
    if M == 0:
        return out
    cfg = config or launch_for(x2, weight)
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(inter, cfg.block_n),)
    if cfg.tma:
        assert weight.is_contiguous() and (K * x.element_size()) % 16 == 0, "TMA strides: 16-byte rows"
        x_desc = TensorDescriptor.from_tensor(x2, block_shape=[cfg.block_m, cfg.block_k])
        _gemm_glu_tma_kernel[grid](
            x_desc, weight_descriptor(weight, cfg.block_n, cfg.block_k), out2, M, inter, K, out2.stride(0),
            ACTIVATION=activation, PRECISION=dot_precision(x2),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        )
        return out
    _gemm_glu_kernel[grid](
        x2, weight, out2, M, inter, K,
        x2.stride(0), weight.stride(0), out2.stride(0),
        ACTIVATION=activation, PRECISION=dot_precision(x2),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
