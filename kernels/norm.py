"""Triton RMSNorm, fused with the residual add that precedes it in every decoder block.

One program normalises one row; the whole row sits in registers (hidden sizes up to 16k), so each
input is read once and each output written once. The rounding follows the reference exactly: the
sum is rounded to the activation dtype before it is normalised, and the normalised row is rounded
before it is scaled by the weight, as transformers' LlamaRMSNorm does.
"""

import torch
import triton
import triton.language as tl

from pagoda.kernels import pdl


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr,
    stride_x, stride_r, stride_o, stride_nr,
    hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    pdl.launch_dependents(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)  # a weight: no kernel before writes it
    pdl.wait(PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * stride_nr + cols, x, mask=mask)
    h = x.to(tl.float32)
    variance = tl.sum(h * h, axis=0) / hidden
    h = (h * tl.rsqrt(variance + eps)).to(x_ptr.dtype.element_ty)
    out = w.to(tl.float32) * h.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
    *, out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as rms_norm_ref: norm(x) * weight, or (norm(x + residual) * weight, x + residual).

    out / residual_out may be given (contiguous, x's shape) to write into persistent buffers;
    residual_out may alias residual, which updates the residual stream in place."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    assert x2.stride(-1) == 1, "the hidden dimension must be contiguous"
    rows = x2.shape[0]
    if out is None:
        out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    out2 = out.view(-1, hidden)
    if residual is not None:
        r2 = residual.reshape(-1, hidden)
        assert r2.stride(-1) == 1
        new_residual = residual_out
        if new_residual is None:
            new_residual = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        nr2 = new_residual.view(-1, hidden)
    else:
        r2 = nr2 = x2  # unused: the HAS_RESIDUAL branch is compiled out
    if rows > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(rows,)](
            x2, r2, weight, out2, nr2,
            x2.stride(0), r2.stride(0), out2.stride(0), nr2.stride(0),
            hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, PDL=(on := pdl.flag(x, rows)),
            num_warps=max(1, min(16, block // 256)), **pdl.options(on),
        )
    return out if residual is None else (out, new_residual)
