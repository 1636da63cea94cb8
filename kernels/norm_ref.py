"""Reference RMSNorm, optionally fused with the residual add that precedes it in every block."""

import torch


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Without residual: norm(x) * weight. With it: h = x + residual; returns (norm(h) * weight, h).

    Computed in float32 and cast back, as transformers' LlamaRMSNorm does.
    """
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
        new_residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(x.dtype)
    return out if residual is None else (out, new_residual)
