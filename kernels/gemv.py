"""Triton GEMV for decode's few rows: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), M <= 4.

W is bf16/fp16/fp32, or FP8 (e4m3) with a float32 weight_scale per output row or per tensor:
y = (x @ q^T) * scale. That is weight-only FP8: x stays in its dtype, each weight is widened to
fp32 in registers, and the scale multiplies each output once, after the sum over K. At a few rows
the activation quantization + torch._scaled_mm path is two launches and a GEMM tile mostly idle,
while this reads half the bytes of a bf16 GEMV with the same loop.

At batch 1 a linear layer is a weight stream: every byte of W is read once and used M times.
cuBLAS's small-M tiles leave bandwidth idle on the 8B model's qkv and o_proj (3.1 of 4.25 TB/s),
so here each program owns BLOCK_N rows of W and streams them over K in BLOCK_K chunks, for all M
rows of x at once, so the weights are loaded once. Each row keeps an fp32 product of the chunk's
shape that is reduced across threads once, at the end: a reduction per chunk would put shuffles
and barriers between the loads. Within a thread, FOLD neighbours along K (its own 16-byte load) are
summed as they arrive, which is free and makes the accumulators FOLD times smaller; the registers
saved let more programs share an SM, and more loads be in flight.

When N / BLOCK_N gives too few programs to fill the GPU, SPLIT_K programs share a row block's K
range and write fp32 partials, and a second kernel sums them in a fixed order (deterministic,
unlike atomics) and adds the bias.

act="silu_mul" takes x as the MLP's merged [M, 2 * K] gate|up tensor and feeds silu(gate) * up,
rounded as kernels/activation.py rounds it, so the down projection needs no kernel of its own.

The folds for one-row decode layers (an RMSNorm into the input, the residual add and its sums
of squares, or silu(gate) * up into the output) are kernels/gemv_folds.py's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagoda.kernels import pdl
from pagoda.kernels.gemv_folds import (  # noqa: F401  (GemvNorm, ResidualSumsq: part of gemv's interface)
    GemvNorm,
    ResidualSumsq,
    load_x,
    norm_args,
    norm_input,
    row_rstd,
    row_scales,
    store_glu,
    store_residual_sumsq,
)

MAX_ROWS = 4  # each row of x keeps its own accumulators in registers
# Bytes of W each thread loads per loop step (8 16-byte loads): with the registers that leaves,
# enough programs fit on an SM to keep the ~30 KB per SM in flight that HBM3e needs.
LOAD_BYTES_PER_THREAD = 128
VECTOR_BYTES = 16  # one thread's widest load: 8 bf16 or 16 fp8 weights
FP8_DTYPES = (torch.float8_e4m3fn,)


@dataclass(frozen=True, slots=True)
class GemvConfig:
    block_n: int = 8  # rows of W per program
    block_k: int = 1024  # columns of W per loop step
    split_k: int = 1  # programs sharing one row block's K range
    num_warps: int = 4
    # The loop has no tl.dot, and Triton (3.9 at least) does not software-pipeline plain loads, so
    # stages change nothing there; bytes in flight come from block_n * block_k and occupancy.
    num_stages: int = 1
    # K neighbours one thread sums as they arrive (8 bf16 = its 16-byte load): no shuffles, and
    # accumulators fold times smaller, which buys occupancy. 1 keeps the whole product.
    fold: int = 8


# Where this GEMV beat cuBLAS on the H200 (e2e/results/gemv-e34d2a9/), keyed by (rows, N, K, act),
# with the launch that won, weights cold in L2 as in a real step. The runtime takes the GEMV for
# these only: cuBLAS was faster at 4 rows for every Llama-8B shape, and at one row for gate_up
# (4.25 vs 3.77 TB/s) and the LM head (4.40 vs 3.99). Add a shape by running the sweep there.
FASTER_THAN_CUBLAS: dict[tuple[int, int, int, str | None], GemvConfig] = {
    # qkv_proj: 3.61 vs 3.07 TB/s; cuBLAS's 64x8 tile leaves SMs idle
    (1, 6144, 4096, None): GemvConfig(block_n=8, block_k=512, num_warps=4, fold=1),
    # o_proj: 3.11 vs 2.47 TB/s
    (1, 4096, 4096, None): GemvConfig(block_n=8, block_k=512, num_warps=8, fold=1),
    # down_proj with silu_and_mul fused: 31.1 us against 33.1 us for the two kernels
    (1, 4096, 14336, "silu_mul"): GemvConfig(block_n=8, block_k=1024, split_k=4, num_warps=4, fold=1),
}


def measured_win(rows: int, n: int, k: int, act: str | None, device: torch.device) -> GemvConfig | None:
    """The launch for a shape where the GEMV measured faster than cuBLAS, or None. The table was
    measured on Hopper (sm_90); the interpreter (a CPU device) sees it too, for the tests."""
    if device.type == "cuda" and not is_hopper(device):
        return None
    return FASTER_THAN_CUBLAS.get((rows, n, k, act))


@functools.cache
def is_hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


# FP8 launches measured on the H200, keyed as above: the launch of the FP8 GEMV where
# kernels/fp8_dispatch.py sends a shape to it without an entry of its own (FP8_SMALL_M entries carry
# their launch); shapes not in it take gemv_config's heuristic.
# The fastest launches of the 1-row sweep on the H200 (e2e/gemv_fp8_gpu_bench.py; e2e/results/
# gemv-fp8-at-d29891a/), for the 8B shapes where they beat the heuristic (qkv and o_proj did not).
FP8_MEASURED: dict[tuple[int, int, int, str | None], GemvConfig] = {
    (1, 28672, 4096, None): GemvConfig(block_n=32, block_k=256, split_k=1, num_warps=4, num_stages=1, fold=1),
    (1, 4096, 14336, "silu_mul"): GemvConfig(block_n=8, block_k=2048, split_k=1, num_warps=8, num_stages=1, fold=1),
}


def fp8_launch(rows: int, n: int, k: int, act: str | None, device: torch.device) -> GemvConfig:
    """The FP8 GEMV's launch for a shape: the measured one, else the heuristic."""
    return FP8_MEASURED.get((rows, n, k, act)) or gemv_config(rows, n, k, _num_sms(device), weight_bytes=1)


@functools.lru_cache(maxsize=256)
def gemv_config(m: int, n: int, k: int, num_sms: int = 132, weight_bytes: int = 2) -> GemvConfig:
    """Default launch knobs for y[m, n] = x[m, k] @ W[n, k]^T with W of weight_bytes per element, a
    heuristic; the runtime passes the measured launch of FASTER_THAN_CUBLAS instead."""
    num_warps = 4
    block_k = min(1024, max(16, triton.next_power_of_2(k)))  # long contiguous reads per row
    # The tile is counted in weights, not bytes: every weight becomes an fp32 register once
    # widened, so an FP8 tile of a bf16 tile's bytes would double the registers and cost occupancy.
    tile = LOAD_BYTES_PER_THREAD * 32 * num_warps // 2  # weights per program and step
    block_n = max(1, min(64, tile // block_k, triton.next_power_of_2(n)))
    # Fewer programs than twice the SMs leaves SMs idle or unbalanced: thinner row blocks first,
    # then split K (a second kernel, a few microseconds against ~8 us of o_proj at batch 1).
    while block_n > 4 and triton.cdiv(n, block_n) < 2 * num_sms:
        block_n //= 2
    split_k = 1
    while triton.cdiv(n, block_n) * split_k < num_sms and k >= 2 * split_k * 4 * block_k:
        split_k *= 2
    return GemvConfig(block_n, block_k, split_k, num_warps, fold=VECTOR_BYTES // weight_bytes)


@triton.jit
def _input_chunk(x_ptr, m, stride_xm, offs_k, K, r_ptr, stride_rm, g_ptr, rstd,
                 SILU_MUL: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr):
    """Row m of the product's input at offs_k ([BLOCK_K // FOLD, FOLD]), in fp32, as [1, ., FOLD]."""
    if NORM:  # RMSNorm(x + residual) * g, rounded where kernels/norm.py rounds
        h = norm_input(x_ptr, r_ptr, m, stride_xm, stride_rm, offs_k, K, RESIDUAL, EVEN_K)
        g = load_x(g_ptr + offs_k, offs_k, K, EVEN_K)
        h = (h.to(tl.float32) * rstd).to(x_ptr.dtype.element_ty)
        v = (g.to(tl.float32) * h.to(tl.float32)).to(x_ptr.dtype.element_ty)
    else:
        v = load_x(x_ptr + m * stride_xm + offs_k, offs_k, K, EVEN_K)
    if SILU_MUL:
        up = load_x(x_ptr + m * stride_xm + offs_k + K, offs_k, K, EVEN_K)
        gate = v.to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty)
        v = (silu.to(tl.float32) * up.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return v.to(tl.float32)[None, :, :]


@triton.jit
def _store_row(out_ptr, acc, m, pid_k, rows, scale, bias, N, stride_om,
               M: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr):
    y = tl.sum(acc, axis=1)
    if PARTIAL:  # fp32 partials [splits, M, N]; the reduce kernel scales and adds the bias
        tl.store(out_ptr + (pid_k * M + m) * N + rows, y, mask=rows < N)
    else:
        if HAS_SCALE:
            y *= scale
        if HAS_BIAS:
            y += bias
        tl.store(out_ptr + m * stride_om + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def _weight_chunk(w_rows, offs_k, K, EVEN_K: tl.constexpr):
    """One chunk of the program's weight rows, as loaded (widened by the caller)."""
    # The weights are read once per step: do not let them push x out of L2.
    if EVEN_K:
        return tl.load(w_rows + offs_k[None, :, :], eviction_policy="evict_first")
    return tl.load(w_rows + offs_k[None, :, :], mask=offs_k[None, :, :] < K, other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _accumulate(acc0, acc1, acc2, acc3, w, w_up, x_ptr, stride_xm, offs_k, K, r_ptr, stride_rm, g_ptr,
                rstd0, rstd1, rstd2, rstd3,
                M: tl.constexpr, SILU_MUL: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr,
                GLU_OUT: tl.constexpr, EVEN_K: tl.constexpr):
    """Each row of x's products with one weight chunk, added to its accumulator; with GLU_OUT (one
    row) acc0 takes the gate rows' products and acc1 the up rows'."""
    w = w.to(tl.float32)  # FP8 too: e4m3 widens exactly, the scale waits for the store
    x0 = _input_chunk(x_ptr, 0, stride_xm, offs_k, K, r_ptr, stride_rm, g_ptr, rstd0, SILU_MUL, NORM, RESIDUAL, EVEN_K)
    acc0 += tl.sum(w * x0, axis=2)
    if GLU_OUT:
        acc1 += tl.sum(w_up.to(tl.float32) * x0, axis=2)
    if M > 1:
        acc1 += tl.sum(w * _input_chunk(x_ptr, 1, stride_xm, offs_k, K, r_ptr, stride_rm, g_ptr, rstd1,
                                        SILU_MUL, NORM, RESIDUAL, EVEN_K), axis=2)
    if M > 2:
        acc2 += tl.sum(w * _input_chunk(x_ptr, 2, stride_xm, offs_k, K, r_ptr, stride_rm, g_ptr, rstd2,
                                        SILU_MUL, NORM, RESIDUAL, EVEN_K), axis=2)
    if M > 3:
        acc3 += tl.sum(w * _input_chunk(x_ptr, 3, stride_xm, offs_k, K, r_ptr, stride_rm, g_ptr, rstd3,
                                        SILU_MUL, NORM, RESIDUAL, EVEN_K), axis=2)
    return acc0, acc1, acc2, acc3


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, r_ptr, g_ptr, h_ptr, sq_ptr,
    N, K, k_per_split, stride_xm, stride_wn, stride_om, stride_rm, stride_hm, eps, num_sumsq,
    M: tl.constexpr, HAS_SCALE: tl.constexpr, SCALE_PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr, PARTIAL: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr,
    GLU_OUT: tl.constexpr, SUMSQ_IN: tl.constexpr, SUMSQ_OUT: tl.constexpr, BLOCK_P: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD: tl.constexpr,
    PDL: tl.constexpr,
):
    # N counts output columns: with GLU_OUT, W has 2 * N rows (gate, then up).
    pdl.launch_dependents(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows past N re-read row N - 1 rather than masking, so the weight loads stay unpredicated
    # (and vectorized); their results are dropped at the store.
    w_rows = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None, None] * stride_wn
    w_up_rows = w_ptr + (tl.minimum(rows, N - 1) + N).to(tl.int64)[:, None, None] * stride_wn  # GLU_OUT: up's
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    # A chunk is viewed as [BLOCK_K // FOLD, FOLD], the FOLD in one thread (see the docstring).
    chunk = tl.arange(0, BLOCK_K // FOLD)[:, None] * FOLD + tl.arange(0, FOLD)[None, :]
    # One accumulator per row of x. Rows >= M are never touched, so they cost nothing.
    acc0 = tl.zeros((BLOCK_N, BLOCK_K // FOLD), tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_K // FOLD), tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_K // FOLD), tl.float32)
    acc3 = tl.zeros((BLOCK_N, BLOCK_K // FOLD), tl.float32)
    # The first chunk is loaded before the PDL wait, while the kernel before still runs (no kernel
    # writes weights; kernels/pdl.py). Every split has at least one chunk (split_k_plan).
    w = _weight_chunk(w_rows, k_begin + chunk, K, EVEN_K)
    w_up = w
    if GLU_OUT:
        w_up = _weight_chunk(w_up_rows, k_begin + chunk, K, EVEN_K)
    pdl.wait(PDL)
    rstd0 = 1.0
    rstd1 = 1.0
    rstd2 = 1.0
    rstd3 = 1.0
    if SUMSQ_IN:  # the GEMV that wrote x summed its squares (one row): no pass over x
        parts = tl.arange(0, BLOCK_P)
        squares = tl.load(sq_ptr + parts, mask=parts < num_sumsq, other=0.0, eviction_policy="evict_last")
        rstd0 = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    elif NORM:  # the folded RMSNorm's first pass, over the whole row; program 0 writes x + residual
        write = (pid_n == 0) & (pid_k == 0)
        rstd0 = row_rstd(x_ptr, r_ptr, h_ptr, 0, stride_xm, stride_rm, stride_hm, chunk, K, eps, write, RESIDUAL, BLOCK_K)
        if M > 1:
            rstd1 = row_rstd(x_ptr, r_ptr, h_ptr, 1, stride_xm, stride_rm, stride_hm, chunk, K, eps, write, RESIDUAL, BLOCK_K)
        if M > 2:
            rstd2 = row_rstd(x_ptr, r_ptr, h_ptr, 2, stride_xm, stride_rm, stride_hm, chunk, K, eps, write, RESIDUAL, BLOCK_K)
        if M > 3:
            rstd3 = row_rstd(x_ptr, r_ptr, h_ptr, 3, stride_xm, stride_rm, stride_hm, chunk, K, eps, write, RESIDUAL, BLOCK_K)
    acc0, acc1, acc2, acc3 = _accumulate(acc0, acc1, acc2, acc3, w, w_up, x_ptr, stride_xm, k_begin + chunk, K,
                                         r_ptr, stride_rm, g_ptr, rstd0, rstd1, rstd2, rstd3,
                                         M, SILU_MUL, NORM, RESIDUAL, GLU_OUT, EVEN_K)
    for k in range(k_begin + BLOCK_K, k_end, BLOCK_K):
        offs_k = k + chunk
        w = _weight_chunk(w_rows, offs_k, K, EVEN_K)
        w_up = w
        if GLU_OUT:
            w_up = _weight_chunk(w_up_rows, offs_k, K, EVEN_K)
        acc0, acc1, acc2, acc3 = _accumulate(acc0, acc1, acc2, acc3, w, w_up, x_ptr, stride_xm, offs_k, K,
                                             r_ptr, stride_rm, g_ptr, rstd0, rstd1, rstd2, rstd3,
                                             M, SILU_MUL, NORM, RESIDUAL, GLU_OUT, EVEN_K)

    if GLU_OUT:  # one row, one split (gemv checks)
        store_glu(out_ptr, acc0, acc1, rows, scale_ptr, bias_ptr, N, HAS_SCALE, SCALE_PER_ROW, HAS_BIAS)
    elif SUMSQ_OUT:  # one row, one split (gemv checks)
        scale = 1.0
        bias = 0.0
        if HAS_SCALE:
            scale = row_scales(scale_ptr, rows, N, SCALE_PER_ROW)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        store_residual_sumsq(out_ptr, acc0, rows, scale, bias, r_ptr, sq_ptr, pid_n, N, HAS_SCALE, HAS_BIAS)
    else:
        scale = 1.0
        bias = 0.0
        if not PARTIAL:
            if HAS_SCALE:
                scale = row_scales(scale_ptr, rows, N, SCALE_PER_ROW)
            if HAS_BIAS:
                bias = tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        _store_row(out_ptr, acc0, 0, pid_k, rows, scale, bias, N, stride_om, M, HAS_SCALE, HAS_BIAS, PARTIAL)
        if M > 1:
            _store_row(out_ptr, acc1, 1, pid_k, rows, scale, bias, N, stride_om, M, HAS_SCALE, HAS_BIAS, PARTIAL)
        if M > 2:
            _store_row(out_ptr, acc2, 2, pid_k, rows, scale, bias, N, stride_om, M, HAS_SCALE, HAS_BIAS, PARTIAL)
        if M > 3:
            _store_row(out_ptr, acc3, 3, pid_k, rows, scale, bias, N, stride_om, M, HAS_SCALE, HAS_BIAS, PARTIAL)


@triton.jit
def _split_k_reduce_kernel(
    partial_ptr, scale_ptr, bias_ptr, out_ptr, N, stride_om,
    M: tl.constexpr, SPLITS: tl.constexpr, HAS_SCALE: tl.constexpr, SCALE_PER_ROW: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)
    m = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.zeros((BLOCK,), tl.float32)
    for s in tl.static_range(SPLITS):  # a fixed order: the same bits every run
        acc += tl.load(partial_ptr + (s * M + m) * N + cols, mask=mask, other=0.0)
    if HAS_SCALE:  # once, on the sum, as without the split
        acc *= row_scales(scale_ptr, cols, N, SCALE_PER_ROW)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def rows_and_out(x, weight, silu_mul: bool, out, max_rows: int, name: str, n_out: int | None = None):
    """The GEMV wrappers' checks on x, weight [N, K] and out: (x as [M, K or 2K], out, out as
    [M, n_out], M), out made in x's dtype when not given; n_out defaults to N."""
    n, k = weight.shape
    n = n_out or n
    assert x.shape[-1] == (2 * k if silu_mul else k), f"x {tuple(x.shape)} does not fit weight {(n, k)}"
    assert weight.stride(1) == 1, "weight rows must be contiguous"
    x2 = x.reshape(-1, x.shape[-1])
    assert x2.stride(-1) == 1, "x rows must be contiguous"
    m = x2.shape[0]
    assert m <= max_rows, f"{name} takes at most {max_rows} rows, got {m}"
    if out is None:
        out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    return x2, out, out.view(-1, n), m


def empty_result(out: torch.Tensor, bias, k: int) -> torch.Tensor:
    """out for a product with no rows, columns or K: the bias, or zeros, where there is anything."""
    if out.numel() and k == 0:
        return out.copy_(bias.expand_as(out)) if bias is not None else out.zero_()
    return out


def split_k_plan(k: int, split_k: int, block_k: int) -> tuple[int, int]:
    """(K per split, splits): every split but the last covers whole BLOCK_K chunks, and a split that
    would start past K is dropped; K % (K per split) == 0 lets the loop run without masks."""
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    return k_per_split, triton.cdiv(k, k_per_split)


def reduce_splits(partials, weight_scale, per_row: bool, bias, out2) -> None:
    """Sum fp32 partials [splits, M, N] into out2 [M, N] in a fixed order, times weight_scale
    (None: no scale) and plus the bias, as one launch."""
    splits, m, n = partials.shape
    block = min(1024, triton.next_power_of_2(n))
    scale_arg = weight_scale if weight_scale is not None else partials  # never read
    bias_arg = bias if bias is not None else partials  # never read
    _split_k_reduce_kernel[(triton.cdiv(n, block), m)](
        partials, scale_arg, bias_arg, out2, n, out2.stride(0),
        M=m, SPLITS=splits, HAS_SCALE=weight_scale is not None, SCALE_PER_ROW=per_row,
        HAS_BIAS=bias is not None, BLOCK=block, PDL=(on := pdl.flag(out2, m)), num_warps=4, **pdl.options(on),
    )


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the interpreter: any count works; the H200's keeps configs as on the GPU
    return torch.cuda.get_device_properties(device).multi_processor_count


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    weight_scale: torch.Tensor | None = None,
    act: str | None = None,
    out: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    norm: GemvNorm | None = None,
    epilogue: str | None = None,
    residual_sumsq: ResidualSumsq | None = None,
) -> torch.Tensor:
    """x [..., K] (or [..., 2 * K] holding gate then up with act="silu_mul") with at most MAX_ROWS
    rows; weight [N, K] row-major, FP8 with weight_scale float32 [N] (per row) or [] / [1] (per
    tensor). Returns [..., N] in x's dtype (into out, if given).

    norm: x is RMSNorm's input (see GemvNorm). epilogue="silu_mul": weight is gate|up [2 * I, K]
    and the result silu(gate) * up [..., I]; one row of x and one K split only. residual_sumsq:
    the result is added to the residual stream, and its squares summed for the next GEMV's norm."""
    assert act in (None, "silu_mul"), f"unknown act {act!r}"
    assert epilogue in (None, "silu_mul"), f"unknown epilogue {epilogue!r}"
    n, k = weight.shape
    fp8 = weight.dtype in FP8_DTYPES
    assert (weight_scale is not None) == fp8, "an FP8 weight needs its weight_scale, and only it"
    per_row = fp8 and weight_scale.numel() != 1
    if fp8:
        assert weight_scale.dtype == torch.float32, "weight_scale must be float32"
        assert weight_scale.numel() in (1, n) and weight_scale.is_contiguous(), (
            f"weight_scale {tuple(weight_scale.shape)}: one per output row ({n}) or one per tensor")
    silu_mul = act == "silu_mul"
    glu = epilogue == "silu_mul"
    assert not (glu and n % 2), f"a gate|up weight has an even number of rows, not {n}"
    n_out = n // 2 if glu else n
    x2, out, out2, m = rows_and_out(x, weight, silu_mul, out, MAX_ROWS, "gemv", n_out)
    if m == 0 or n == 0 or k == 0:
        assert norm is None and not glu, "a folded norm or epilogue needs rows, columns and K"
        return empty_result(out, bias, k)
    cfg = config or gemv_config(m, n_out, k, _num_sms(x.device), weight_bytes=1 if fp8 else 2)

    k_per_split, splits = split_k_plan(k, cfg.split_k, cfg.block_k)
    assert not glu or (m == 1 and splits == 1 and out2.stride(0) == n_out), (
        "the silu_mul epilogue takes one row of x, one K split and a contiguous out")
    r2, h2, g = norm_args(norm, x2, silu_mul)
    sq, num_sumsq = x2, 1  # never read
    sumsq_in = norm is not None and norm.sumsq is not None
    if sumsq_in:
        assert m == 1 and norm.residual is None, "a norm from summed squares takes one row and no residual"
        sq, num_sumsq = norm.sumsq, norm.sumsq.numel()
    if residual_sumsq is not None:
        assert m == 1 and splits == 1 and not glu and norm is None, (
            "residual_sumsq takes one row, one K split, no epilogue and no norm")
        r2, sq = residual_sumsq.residual.reshape(1, n_out), residual_sumsq.sumsq
        assert sq.dtype == torch.float32 and sq.numel() == triton.cdiv(n_out, cfg.block_n), (
            f"sumsq holds one float32 per program: {triton.cdiv(n_out, cfg.block_n)}")
    has_bias = bias is not None
    bias_arg = bias if has_bias else weight  # never read
    scale_arg = weight_scale if fp8 else weight  # never read
    target = out2
    if splits > 1:
        target = torch.empty(splits, m, n_out, dtype=torch.float32, device=x.device)
    _gemv_kernel[(triton.cdiv(n_out, cfg.block_n), splits)](
        x2, weight, scale_arg, bias_arg, target, r2, g, h2, sq,
        n_out, k, k_per_split, x2.stride(0), weight.stride(0), out2.stride(0), r2.stride(0), h2.stride(0),
        norm.eps if norm is not None else 0.0, num_sumsq,
        M=m, HAS_SCALE=fp8, SCALE_PER_ROW=per_row, HAS_BIAS=has_bias, SILU_MUL=silu_mul, PARTIAL=splits > 1,
        NORM=norm is not None, RESIDUAL=norm is not None and norm.residual is not None, GLU_OUT=glu,
        SUMSQ_IN=sumsq_in, SUMSQ_OUT=residual_sumsq is not None,
        BLOCK_P=triton.next_power_of_2(num_sumsq),
        EVEN_K=k % k_per_split == 0, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FOLD=min(cfg.fold, cfg.block_k),
        PDL=(on := pdl.flag(x2, m)), num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.options(on),
    )
    if splits > 1:
        reduce_splits(target, scale_arg if fp8 else None, per_row, bias, out2)
    return out


