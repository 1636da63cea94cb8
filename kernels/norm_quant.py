"""Triton RMSNorm (with its residual add) fused with the FP8 (e4m3) quantization of its output.

Where the next op is an FP8 GEMM (qkv_proj after input_layernorm, gate_up_proj after
post_attention_layernorm), the normalised row is only ever read to be quantized. The unfused pair
writes it out and reads it back twice (amax, then the cast): here the row is normalised in
registers (norm.py's arithmetic and roundings: the residual sum and the normalised row rounded to
the activation dtype, then scaled by the weight and rounded again), its amax taken there, and only
the e4m3 row, its per-token scale (quant_fp8.py's: max(amax / 448, floor)) and the new residual
are written. One launch instead of two, and about half the bytes.
"""

import torch
import triton
import triton.language as tl

from pagoda.kernels.fp8_cast import round_first, to_e4m3
from pagoda.kernels.quant_fp8_ref import FP8_DTYPE, FP8_MAX, MIN_SCALE


@triton.jit
def _rms_norm_quant_kernel(
    x_ptr, residual_ptr, weight_ptr, q_ptr, scale_ptr, new_residual_ptr,
    stride_x, stride_r, stride_q, stride_nr, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, STATIC: tl.constexpr, ROUND_FIRST: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * stride_nr + cols, x, mask=mask)
    h = x.to(tl.float32)
    variance = tl.sum(h * h, axis=0) / hidden
    h = (h * tl.rsqrt(variance + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    # The norm's output as rms_norm would store it (in x's dtype), then quantized
    out = (w.to(tl.float32) * h.to(tl.float32)).to(x_ptr.dtype.element_ty).to(tl.float32)
    if STATIC:
        scale = tl.load(scale_ptr)
    else:
        scale = tl.maximum(tl.max(tl.abs(out), axis=0) / 448.0, 1.0 / (448.0 * 512.0))
        tl.store(scale_ptr + row, scale)
    q = tl.clamp(out / scale, -448.0, 448.0)
    tl.store(q_ptr + row * stride_q + cols, to_e4m3(q, q_ptr.dtype.element_ty, ROUND_FIRST), mask=mask)


def rms_norm_quant_fp8(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
):
    """x [M, hidden] (hidden contiguous) -> (q e4m3 [M, hidden], scale float32 [M, 1]) of
    norm(x) * weight, per token or by the given static scale ([] or [1] float32); with residual,
    ((q, scale), x + residual), as rms_norm_quant_fp8_ref."""
    assert FP8_MAX == 448.0 and MIN_SCALE == 1.0 / (448.0 * 512.0)  # the kernel's literals
    assert x.dtype == weight.dtype, "the norm's weight must have x's dtype (the unfused norm's output dtype)"
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    assert x2.stride(-1) == 1, "the hidden dimension must be contiguous"
    rows = x2.shape[0]
    q = torch.empty((rows, hidden), dtype=FP8_DTYPE, device=x.device)
    static = scale is not None
    out_scale = scale.reshape(1) if static else torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if residual is not None:
        r2 = residual.reshape(-1, hidden)
        assert r2.stride(-1) == 1
        new_residual = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        nr2 = new_residual.view(-1, hidden)
    else:
        r2 = nr2 = x2  # unused: the HAS_RESIDUAL branch is compiled out
    if rows > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_quant_kernel[(rows,)](
            x2, r2, weight, q, out_scale, nr2,
            x2.stride(0), r2.stride(0), q.stride(0), nr2.stride(0), hidden, eps,
            HAS_RESIDUAL=residual is not None, STATIC=static, ROUND_FIRST=round_first(x), BLOCK=block,
            num_warps=max(1, min(16, block // 256)),
        )
    if static:
        out_scale = out_scale.reshape(1, 1).expand(rows, 1)
    quantized = (q, out_scale)
    return quantized if residual is None else (quantized, new_residual)
