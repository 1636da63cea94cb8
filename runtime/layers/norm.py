"""RMSNorm, fused with the residual add before it (pagoda.kernels picks Triton or torch).

A norm whose output only feeds an FP8 linear layer that quantizes its input (qkv_proj after
input_layernorm, gate_up_proj after post_attention_layernorm) is linked to that layer after
loading (quantization/apply.link_norms): it then quantizes in its own kernel and hands the layer a
fp8_linear.QuantizedInput, at the rows where the layer would quantize anyway.
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.runtime.layers.weight_slice import materialize
from pagoda.runtime.quantization import fp8_linear, fp8_residual


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.quantize_for = None  # the FP8 layer this norm feeds, when linked (a plain attribute)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if isinstance(x, fp8_residual.PendingOutput):  # the GEMV before adds to the stream (FOLD_SUMSQ)
            return fp8_residual.norm_after(x, self.weight, self.eps, residual, self.quantize_for)
        if self.quantize_for is not None:
            return fp8_linear.norm_for(self.quantize_for, self.weight, self.eps, x, residual)
        return ops.rms_norm(x, self.weight, self.eps, residual)

    def link_fp8_consumer(self, layer: nn.Module | None) -> None:
        # object.__setattr__: as a Module attribute the layer would become this norm's submodule
        # (its parameters listed twice, in state_dict and named_modules)
        object.__setattr__(self, "quantize_for", layer)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm scales by (1 + weight): the loader adds the one, so the kernel is the same."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__(hidden_size, eps)
        self.weight.weight_loader = self.weight_loader

    @staticmethod
    def weight_loader(param: nn.Parameter, loaded) -> None:
        param.data.copy_(materialize(loaded).float() + 1.0)
