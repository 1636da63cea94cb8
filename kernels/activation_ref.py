"""Reference SiLU-and-multiply for the gated MLP: silu(gate) * up over a merged gate-up tensor."""

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x is [..., 2 * d] holding gate then up; returns [..., d]."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
