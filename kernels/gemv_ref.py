"""Reference for the GEMV: a linear layer, optionally fed by the gated MLP's silu(gate) * up."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagoda.kernels.activation_ref import silu_and_mul_ref


def gemv_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, act: str | None = None
) -> torch.Tensor:
    """x [..., K] (or [..., 2 * K], gate then up, with act="silu_mul"); weight [N, K]."""
    assert act in (None, "silu_mul"), f"unknown act {act!r}"
    if act == "silu_mul":
        x = silu_and_mul_ref(x)
    return F.linear(x, weight, bias)
