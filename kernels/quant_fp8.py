"""Triton FP8 (e4m3) activation quantization, per token (dynamic) or with a given per-tensor scale.

One program per row. A dynamic row is read twice, once for its amax and once to quantize (the
second read comes from L2 at these sizes); a static scale skips the first pass. The arithmetic is
quant_fp8_ref's: scale = max(amax / 448, floor), q = clamp(x / scale) rounded by the cast.

With silu_mul=True the row is the gated MLP's gate|up and the value quantized is silu(gate) * up,
rounded to x's dtype as kernels/activation.py rounds it, computed on the fly in both passes: the
down projection's FP8 input then costs one kernel, and the activation never goes through memory.
"""

import torch
import triton
import triton.language as tl

from pagoda.kernels.activation import silu_times_up
from pagoda.kernels.fp8_cast import round_first, to_e4m3
from pagoda.kernels.quant_fp8_ref import FP8_DTYPE, FP8_MAX, MIN_SCALE


@triton.jit
def _input(x_ptr, row, stride_x, k, cols, mask, SILU_MUL: tl.constexpr):
    """The values to quantize at cols of a row, in float32."""
    if SILU_MUL:
        return silu_times_up(x_ptr, row, stride_x, k, cols, mask).to(x_ptr.dtype.element_ty).to(tl.float32)
    else:
        return tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _quantize_fp8_kernel(
    x_ptr, q_ptr, scale_ptr, stride_x, stride_q, k,
    STATIC: tl.constexpr, BLOCK: tl.constexpr, ROUND_FIRST: tl.constexpr, SILU_MUL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if STATIC:
        scale = tl.load(scale_ptr)
    else:
        amax = tl.zeros([BLOCK], tl.float32)
        for k0 in range(0, k, BLOCK):
            x = _input(x_ptr, row, stride_x, k, k0 + cols, k0 + cols < k, SILU_MUL)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0) / 448.0, 1.0 / (448.0 * 512.0))
        tl.store(scale_ptr + row, scale)
    for k0 in range(0, k, BLOCK):
        mask = k0 + cols < k
        x = _input(x_ptr, row, stride_x, k, k0 + cols, mask, SILU_MUL)
        q = tl.clamp(x / scale, -448.0, 448.0)
        tl.store(q_ptr + row * stride_q + k0 + cols, to_e4m3(q, q_ptr.dtype.element_ty, ROUND_FIRST), mask=mask)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor | None = None, *, silu_mul: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K contiguous) -> (q [M, K] e4m3, scale [M, 1] float32): per token, or with the given
    per-tensor scale ([] or [1] float32 on x's device) for every row. silu_mul: x is [M, 2 * K],
    gate then up, and silu(gate) * up is quantized."""
    assert FP8_MAX == 448.0 and MIN_SCALE == 1.0 / (448.0 * 512.0)  # the kernel's literals
    m, k = x.shape
    if silu_mul:
        k //= 2
    assert x.stride(-1) == 1, "rows must be contiguous"
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    static = scale is not None
    out_scale = scale.reshape(1) if static else torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m > 0:
        block = min(2048, triton.next_power_of_2(k))
        _quantize_fp8_kernel[(m,)](x, q, out_scale, x.stride(0), q.stride(0), k,
                                   STATIC=static, BLOCK=block, ROUND_FIRST=round_first(x), SILU_MUL=silu_mul,
                                   num_warps=4 if block >= 1024 else 1)
    if static:
        out_scale = out_scale.reshape(1, 1).expand(m, 1)
    return q, out_scale
