"""Reference for RMSNorm fused with FP8 quantization: rms_norm_ref, then quantize_fp8_ref."""

import torch

from pagoda.kernels.norm_ref import rms_norm_ref
from pagoda.kernels.quant_fp8_ref import quantize_fp8_ref


def rms_norm_quant_fp8_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
):
    """(q, scale) of norm(x) * weight (in the dtype the unfused norm stores it in), per
    token or by the static scale; with residual, ((q, scale), x + residual)."""
    normed = rms_norm_ref(x, weight, eps, residual)
    if residual is not None:
        normed, new_residual = normed
    quantized = quantize_fp8_ref(normed.reshape(-1, x.shape[-1]), scale)
    return quantized if residual is None else (quantized, new_residual)
