"""A one-row FP8 GEMV whose weight tiles arrive by TMA (Hopper's copy engine) into a deep pipeline.

gemv.py streams the weight with register loads: each thread waits on its own loads, so the bytes in
flight per SM are what its registers hold, and at one decode row the 8B model's GEMVs reach about
3.1 TB/s of the H200's 4.25+ (e2e/PERF_NOTES.md). Triton's pipeliner does not deepen those loads
(num_stages 1-4 measured level). Here each program owns BLOCK_N rows and walks K in BLOCK_K tiles
read through a tensor descriptor: the pipeliner issues NUM_STAGES tiles ahead by TMA into shared
memory, so the loads in flight no longer cost registers, and the threads only widen, multiply and
add. The arithmetic is gemv.py's at one row: fp32 products summed over K, the row's float32 scale
after the sum, a bias, and for a gate|up weight silu(gate) * up in the epilogue (gemv_folds.store_glu).

The engine takes it with --gemv-tma (off: kernels/fp8_dispatch.ONE_ROW_TMA), in place of every
1-row entry of the weight-only GEMV, and the chain bench as its "tma" variant, until the H200 says
whether it beats gemv.py; the tests hold it to gemv_ref and gemv.py under Triton's interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from pagoda.kernels import pdl
from pagoda.kernels.gemv_folds import row_scales, store_glu

MAX_BOX = 256  # a TMA box has at most 256 elements a dimension


@dataclass(frozen=True, slots=True)
class TmaGemvConfig:
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def _gemv_tma_kernel(
    w_desc, x_ptr, scale_ptr, bias_ptr, out_ptr, N, K,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, GLU_OUT: tl.constexpr,
    HAS_SCALE: tl.constexpr, SCALE_PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):
    pdl.launch_dependents(PDL)
    pid = tl.program_id(0)
    n0 = pid * BLOCK_N
    rows = n0 + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        w = w_desc.load([n0, k]).to(tl.float32)  # rows past the weight's end come back as zeros
        # x is the kernel before's output: wait for it here, after the pipeliner's first tile
        # loads were issued (weights are never written during a step; kernels/pdl.py)
        pdl.wait(PDL)
        offs = k + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
        acc += w * x[None, :]
        if GLU_OUT:
            acc_up += w_desc.load([N + n0, k]).to(tl.float32) * x[None, :]
    pdl.wait(PDL)  # kernels/pdl.py's contract: waited before any write, whatever K is (a no-op by now)
    if GLU_OUT:
        store_glu(out_ptr, acc, acc_up, rows, scale_ptr, bias_ptr, N, HAS_SCALE, SCALE_PER_ROW, HAS_BIAS)
    else:
        y = tl.sum(acc, axis=1)
        if HAS_SCALE:
            y *= row_scales(scale_ptr, rows, N, SCALE_PER_ROW)
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


def weight_descriptor(weight: torch.Tensor, block_n: int, block_k: int) -> TensorDescriptor:
    """The weight's descriptor for a tile, built once and kept on the weight tensor itself (eager
    decode calls every GEMV each step): it goes when the weight goes, and a weight whose storage is
    replaced in place (a reload) gets a new one."""
    cache = weight.__dict__.setdefault("_tma_descriptors", {})
    key = (weight.data_ptr(), block_n, block_k)
    if any(k[0] != key[0] for k in cache):  # new storage: drop the old one's (they hold it alive)
        cache.clear()
    if key not in cache:
        cache[key] = TensorDescriptor.from_tensor(weight, block_shape=[block_n, block_k])
    return cache[key]


def gemv_tma(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None = None,
             bias: torch.Tensor | None = None, config: TmaGemvConfig | None = None,
             epilogue: str | None = None) -> torch.Tensor:
    """y = x @ (weight * weight_scale)^T + bias for one row x [1, K] (or [K]) and weight [N, K],
    contiguous; epilogue "silu_mul": weight is gate|up [2 * N, K] and y silu(gate) * up [1, N]."""
    cfg = config or TmaGemvConfig()
    assert x.numel() == x.shape[-1], "one row"
    assert cfg.block_n <= MAX_BOX and cfg.block_k <= MAX_BOX, "a TMA box is at most 256 a side"
    assert weight.is_contiguous() and (weight.shape[1] * weight.element_size()) % 16 == 0, "TMA strides"
    k = weight.shape[1]
    glu = epilogue == "silu_mul"
    assert epilogue in (None, "silu_mul")
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    x = x.reshape(-1).contiguous()
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    desc = weight_descriptor(weight, cfg.block_n, cfg.block_k)
    has_scale = weight_scale is not None
    _gemv_tma_kernel[(triton.cdiv(n, cfg.block_n),)](
        desc, x, weight_scale if has_scale else x, bias if bias is not None else x, out, n, k,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, NUM_STAGES=cfg.num_stages, GLU_OUT=glu,
        HAS_SCALE=has_scale, SCALE_PER_ROW=has_scale and weight_scale.numel() > 1, HAS_BIAS=bias is not None,
        PDL=(on := pdl.flag(x, 1)), num_warps=cfg.num_warps, **pdl.options(on),
    )
    return out
