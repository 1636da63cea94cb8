"""Reference gated-MLP activations over a merged gate-up tensor: silu(gate) * up (Llama) and
gelu_tanh(gate) * up (Gemma's GeGLU)."""

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x is [..., 2 * d] holding gate then up; returns [..., d]."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]
