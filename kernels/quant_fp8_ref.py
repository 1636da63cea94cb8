"""Reference for FP8 (e4m3) activation quantization: x ~= q * scale, per token or per tensor.

scale = amax / 448 (448 is e4m3's largest finite value), so each row's (or the tensor's) largest
element lands on 448; q = x / scale, clamped and rounded to nearest by the cast. A static scale (a
checkpoint's input_scale) skips the amax. Zero rows get the floor scale, as vLLM's do.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # vLLM's floor for dynamic scales


def quantize_fp8_ref(x: torch.Tensor, scale: torch.Tensor | None = None, per_token: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] float8_e4m3fn, scale [M, 1] float32). scale given: [] or [1] (static)."""
    x32 = x.float()
    if scale is None:
        amax = x32.abs().amax(dim=-1, keepdim=True) if per_token else x32.abs().amax().reshape(1, 1)
        scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    scale = scale.float().reshape(-1, 1)
    q = (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale.expand(x.shape[0], 1).contiguous()


def quantize_weight_fp8_ref(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight [N, K] quantized per output channel: (q [N, K] e4m3, scale [N] float32), the
    arithmetic of compressed-tensors' channel strategy and of vLLM's per-channel FP8."""
    q, scale = quantize_fp8_ref(w, per_token=True)
    return q, scale.reshape(-1)
