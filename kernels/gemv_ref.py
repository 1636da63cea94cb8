"""Reference for the GEMV: a linear layer, optionally fed by the gated MLP's silu(gate) * up, with
an FP8 weight dequantized (q * scale) first."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagoda.kernels.activation_ref import silu_and_mul_ref


def gemv_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    weight_scale: torch.Tensor | None = None, act: str | None = None,
) -> torch.Tensor:
    """x [..., K] (or [..., 2 * K], gate then up, with act="silu_mul"); weight [N, K], FP8 with
    weight_scale float32 [N] or [] / [1]."""
    assert act in (None, "silu_mul"), f"unknown act {act!r}"
    if act == "silu_mul":
        x = silu_and_mul_ref(x)
    if weight_scale is None:
        return F.linear(x, weight, bias)
    # The kernel's arithmetic: the weight widened exactly, fp32 sums, one rounding to x's dtype.
    dequantized = weight.float() * weight_scale.float().reshape(-1, 1)
    y = F.linear(x.float(), dequantized, None if bias is None else bias.float())
    return y.to(x.dtype)
