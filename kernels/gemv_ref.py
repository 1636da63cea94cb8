"""Reference for the GEMV: a linear layer, optionally fed by the gated MLP's silu(gate) * up or by
an RMSNorm (+ residual), optionally followed by silu(gate) * up of its output, with an FP8 weight
dequantized (q * scale) first."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagoda.kernels.activation_ref import silu_and_mul_ref
from pagoda.kernels.norm_ref import rms_norm_ref


def gemv_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    weight_scale: torch.Tensor | None = None, act: str | None = None, norm=None, epilogue: str | None = None,
):
    """x [..., K] (or [..., 2 * K], gate then up, with act="silu_mul"); weight [N, K], FP8 with
    weight_scale float32 [N] or [] / [1]. norm (a kernels.gemv.GemvNorm): the input is
    RMSNorm(x + residual) * norm.weight, and with a residual the result is (y, x + residual).
    epilogue="silu_mul": y is silu(gate) * up of the product's two halves."""
    assert act in (None, "silu_mul"), f"unknown act {act!r}"
    assert epilogue in (None, "silu_mul"), f"unknown epilogue {epilogue!r}"
    new_residual = None
    if act == "silu_mul":
        x = silu_and_mul_ref(x)
    if norm is not None:
        x = rms_norm_ref(x, norm.weight, norm.eps, norm.residual)
        if norm.residual is not None:
            x, new_residual = x
    if weight_scale is None:
        y = F.linear(x, weight, bias)
    else:
        # The kernel's arithmetic: the weight widened exactly, fp32 sums, one rounding to x's dtype.
        dequantized = weight.float() * weight_scale.float().reshape(-1, 1)
        y = F.linear(x.float(), dequantized, None if bias is None else bias.float()).to(x.dtype)
    if epilogue == "silu_mul":
        y = silu_and_mul_ref(y)
    return y if new_residual is None else (y, new_residual)
