"""Reference for the FP8 scaled GEMM (scaled_gemv.py, and torch._scaled_mm with row-wise scales):
both operands dequantized exactly (q * scale), multiplied in float32, one rounding at the end."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def scaled_gemv_ref(q: torch.Tensor, scale_x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    bias: torch.Tensor | None = None, *, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """q [M, K] e4m3 with scale_x [M, 1]; weight [N, K] e4m3 with weight_scale [N]."""
    x = q.float() * scale_x.float().reshape(-1, 1)
    w = weight.float() * weight_scale.float().reshape(-1, 1)
    return F.linear(x, w, None if bias is None else bias.float()).to(out_dtype)
