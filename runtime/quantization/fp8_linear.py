"""FP8 linear layers: their parameters, what loading leaves them as, and their forward.

A layer the scheme quantizes (see apply.py) holds weight [N, K] as float8_e4m3fn with one float32
weight_scale per output row (plus a per-tensor input_scale for static activations). Then:
- on a GPU with FP8 matmuls (compute capability 8.9 or more) it stays FP8, and the forward
  quantizes its input (per token, per tensor, or by the static scale) and calls torch._scaled_mm
  with row-wise scales: y[m, n] = (q_x[m] . q_w[n]) * scale_x[m] * scale_w[n], accumulated in fp32
  by cuBLASLt. At decode's 1..4 rows a Triton GEMV takes it instead (kernels/gemv.py), weight-only:
  y[m, n] = (x[m] . q_w[n]) * scale_w[n], x unquantized, which is faster there and no less exact;
- anywhere else the weight is dequantized once, at load, to the compute dtype (q * scale), and the
  layer runs as an ordinary linear one. That is the reference the tests compare with transformers.
On-the-fly quantization (--quantization fp8) loads the bf16 weight as usual and quantizes it per
output channel afterwards.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.kernels.quant_fp8_ref import FP8_DTYPE, FP8_MAX, MIN_SCALE, quantize_weight_fp8_ref

logger = logging.getLogger(__name__)


def is_fp8(weight: torch.Tensor) -> bool:
    return weight.dtype == FP8_DTYPE


def has_fp8_matmul(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def prepare_checkpoint_weights(layer: nn.Module, scheme) -> None:
    """Make room for an FP8 checkpoint's tensors: an e4m3 weight, its scales, a static input scale."""
    layer.fp8 = scheme
    weight = layer.weight
    layer.weight = nn.Parameter(torch.empty(weight.shape, dtype=FP8_DTYPE, device=weight.device),
                                requires_grad=False)
    layer.weight.weight_loader = weight.weight_loader
    layer.weight_scale = nn.Parameter(torch.ones(weight.shape[0], dtype=torch.float32, device=weight.device),
                                      requires_grad=False)
    layer.weight_scale.weight_loader = layer.scale_loader
    if scheme.activations == "static-tensor":
        layer.input_scale = nn.Parameter(torch.zeros((), dtype=torch.float32, device=weight.device),
                                         requires_grad=False)
        layer.input_scale.weight_loader = layer.input_scale_loader


def finish_loading(layer: nn.Module, scheme, compute_dtype: torch.dtype) -> bool:
    """After the weights are in: quantize a bf16 weight (on the fly), or keep FP8 where the device
    multiplies it, or dequantize it to compute_dtype. Returns True when it dequantized."""
    layer.fp8 = scheme
    device = layer.weight.device
    if not is_fp8(layer.weight):  # --quantization fp8: per output channel
        q, scale = quantize_weight_fp8_ref(layer.weight.data)
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)
    if has_fp8_matmul(device) and scheme.activations != "none":
        layer.weight.data = layer.weight.data.contiguous()
        return False
    dequantized = (layer.weight.data.float() * layer.weight_scale.data[:, None]).to(compute_dtype)
    layer.weight = nn.Parameter(dequantized, requires_grad=False)
    del layer.weight_scale
    if hasattr(layer, "input_scale"):
        del layer.input_scale
    return True


def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, act: str | None = None) -> torch.Tensor:
    """y = act(x) @ dequant(weight)^T + bias for an FP8 weight on an FP8 GPU; act "silu_mul" takes
    the MLP's gate|up. Decode's few rows go to the weight-only FP8 GEMV (x is not quantized: one
    kernel that streams the weight); more rows quantize x and call torch._scaled_mm."""
    if ops.use_fp8_gemv(x, bias):
        return ops.fp8_gemv(x, layer.weight, layer.weight_scale, bias, act=act)
    q, scale_a, shape = _quantize_input(layer, x, act)
    weight = layer.weight
    y = torch._scaled_mm(q, weight.t(), scale_a=scale_a.contiguous(), scale_b=layer.weight_scale.view(1, -1),
                         out_dtype=x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*shape[:-1], weight.shape[0])


def _quantize_input(layer: nn.Module, x: torch.Tensor, act: str | None):
    """(q, scale [M, 1], act(x)'s shape) for torch._scaled_mm. A per-token or static scale needs
    one row at a time, so silu(gate) * up is quantized as it is computed (one kernel, the
    activation never stored); a per-tensor dynamic scale needs the whole activation first."""
    activations = layer.fp8.activations
    silu_mul = act == "silu_mul"
    if silu_mul and activations == "dynamic-tensor":
        x, silu_mul = ops.silu_and_mul(x), False
    shape = (*x.shape[:-1], x.shape[-1] // 2) if silu_mul else x.shape
    x2 = x.reshape(-1, x.shape[-1])
    if activations == "dynamic-token":
        q, scale_a = ops.quantize_fp8(x2, silu_mul=silu_mul)
    elif activations == "dynamic-tensor":
        q, scale_a = ops.quantize_fp8(x2, (x2.abs().amax().float() / FP8_MAX).clamp(min=MIN_SCALE))
    else:
        q, scale_a = ops.quantize_fp8(x2, layer.input_scale, silu_mul=silu_mul)
    return q, scale_a, shape
