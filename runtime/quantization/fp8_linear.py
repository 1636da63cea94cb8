"""FP8 linear layers: their parameters, what loading leaves them as, and their forward.

A layer the scheme quantizes (see apply.py) holds weight [N, K] as float8_e4m3fn with one float32
weight_scale per output row (plus a per-tensor input_scale for static activations). Then:
- on a GPU with FP8 matmuls (compute capability 8.9 or more) it stays FP8, and the forward
  quantizes its input (per token, per tensor, or by the static scale) and calls torch._scaled_mm
  with row-wise scales: y[m, n] = (q_x[m] . q_w[n]) * scale_x[m] * scale_w[n], accumulated in fp32
  by cuBLASLt. At decode's few rows the measured table of kernels/fp8_dispatch.py may send it to a
  Triton kernel instead: a weight-only FP8 GEMV (kernels/gemv.py or gemv_fp8.py, y[m, n] =
  (x[m] . q_w[n]) * scale_w[n], x unquantized) or the tensor-core small-M GEMM (kernels/scaled_gemv.py, _scaled_mm's
  arithmetic). Where the layer quantizes its input per token (or by a static scale) and the RMSNorm
  before it is linked to it (link_norms), the norm's kernel quantizes instead (QuantizedInput);
- anywhere else the weight is dequantized once, at load, to the compute dtype (q * scale), and the
  layer runs as an ordinary linear one. That is the reference the tests compare with transformers.
On-the-fly quantization (--quantization fp8) loads the bf16 weight as usual and quantizes it per
output channel afterwards.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

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


@dataclass(slots=True)
class QuantizedInput:
    """An FP8 layer's input, already quantized by the RMSNorm kernel before it (norm_for): what
    _quantize_input would have made of the norm's output, and how the layer multiplies it."""
    q: torch.Tensor  # [M, K] e4m3
    scale: torch.Tensor  # [M, 1] float32
    shape: torch.Size  # the unquantized activation's
    dtype: torch.dtype  # its dtype, the layer's output dtype
    launch: object  # the kernels.fp8_dispatch.Fp8Launch the layer takes for these rows


def fuses_input_norm(layer: nn.Module) -> bool:
    """Whether the norm before this layer may quantize its input: FP8 kept for the GPU's matmuls,
    and a per-token or static activation scale (one row at a time; a per-tensor dynamic scale
    needs the whole activation first)."""
    return (getattr(layer, "fp8", None) is not None and is_fp8(layer.weight)
            and layer.fp8.activations in ("dynamic-token", "static-tensor"))


@dataclass(slots=True)
class NormedInput:
    """An FP8 layer's input still to be normalised: RMSNorm(x + residual) * weight, computed by the
    layer's weight-only GEMV as it reads x (norm_for; kernels/gemv.py). The GEMV also writes
    x + residual into norm.residual_out, the residual stream the decoder layer carries on."""
    x: torch.Tensor  # the norm's input
    norm: object  # kernels.gemv.GemvNorm
    launch: object  # the kernels.fp8_dispatch.Fp8Launch the layer takes for these rows


def norm_for(layer: nn.Module, norm_weight: torch.Tensor, eps: float, x: torch.Tensor, residual=None):
    """RMSNorm(x [+ residual]) * norm_weight as this FP8 layer's input: a NormedInput where the
    layer's weight-only GEMV folds the norm in (ops.FOLD_NORM), a QuantizedInput made by one
    kernel where the layer would quantize it (ops.FUSED_NORM_QUANT), else the plain norm's output."""
    launch = ops.fp8_path(x, layer.weight, layer.bias)
    if (ops.FOLD_NORM and launch.path == "gemv" and norm_weight.dtype == x.dtype and x.is_contiguous()
            and (residual is None or residual.is_contiguous())):
        from pagoda.kernels.gemv import GemvNorm

        residual_out = None if residual is None else torch.empty_like(x)
        normed = NormedInput(x, GemvNorm(norm_weight, eps, residual, residual_out), launch)
        return normed if residual is None else (normed, residual_out)
    if not (ops.FUSED_NORM_QUANT and launch.quantizes_input):
        return ops.rms_norm(x, norm_weight, eps, residual)
    static = layer.input_scale if layer.fp8.activations == "static-tensor" else None
    out = ops.rms_norm_quant_fp8(x, norm_weight, eps, residual, static)
    (q, scale), new_residual = out if residual is not None else (out, None)
    quantized = QuantizedInput(q, scale, x.shape, x.dtype, launch)
    return quantized if residual is None else (quantized, new_residual)


def apply(layer: nn.Module, x, bias: torch.Tensor | None, act: str | None = None) -> torch.Tensor:
    """y = act(x) @ dequant(weight)^T + bias for an FP8 weight on an FP8 GPU; act "silu_mul" takes
    the MLP's gate|up. The path is kernels/fp8_dispatch.py's for these rows: the weight-only FP8
    GEMV (x not quantized: one kernel that streams the weight), or x quantized (here, or already by
    the norm: a QuantizedInput) and then the small-M tensor-core GEMM or torch._scaled_mm."""
    if isinstance(x, QuantizedInput):
        return _matmul(layer, x.q, x.scale, x.shape, x.dtype, bias, x.launch)
    if isinstance(x, NormedInput):
        return ops.fp8_gemv(x.x, layer.weight, layer.weight_scale, bias, config=x.launch.config, norm=x.norm)
    launch = ops.fp8_path(x, layer.weight, bias, act)
    if not launch.quantizes_input:
        return ops.fp8_gemv(x, layer.weight, layer.weight_scale, bias, act=act, config=launch.config,
                            path=launch.path)
    q, scale_a, shape = _quantize_input(layer, x, act)
    return _matmul(layer, q, scale_a, shape, x.dtype, bias, launch)


def glu(layer: nn.Module, x, bias: torch.Tensor | None) -> torch.Tensor | None:
    """silu(gate) * up of this gate|up layer's output from one kernel, the weight-only GEMV with
    the activation in its epilogue, where kernels/fp8_dispatch.fused_glu has a launch for these
    rows (one row on the H200); else None, and the MLP runs gate_up, then down with SiLU fused."""
    if not ops.FOLD_GLU or isinstance(x, QuantizedInput):
        return None
    src = x.x if isinstance(x, NormedInput) else x
    if ops.fp8_path(src, layer.weight, bias).path not in ("gemv", "gemv_tma"):  # device, dtype, strides
        return None
    from pagoda.kernels.fp8_dispatch import fused_glu

    launch = fused_glu(src.numel() // src.shape[-1], layer.weight.shape[0], layer.weight.shape[1], src.device)
    if launch is None:
        return None
    norm = x.norm if isinstance(x, NormedInput) else None
    if norm is not None and launch.path != "gemv":  # only gemv.py folds the norm
        return None
    return ops.fp8_gemv(src, layer.weight, layer.weight_scale, bias, config=launch.config, path=launch.path,
                        norm=norm, epilogue="silu_mul")


def _matmul(layer, q, scale_a, shape, dtype, bias, launch) -> torch.Tensor:
    weight = layer.weight
    if launch.path == "scaled_gemv":
        y = ops.scaled_gemv(q, scale_a, weight, layer.weight_scale, bias, out_dtype=dtype, config=launch.config)
    else:
        y = torch._scaled_mm(q, weight.t(), scale_a=scale_a.contiguous(), scale_b=layer.weight_scale.view(1, -1),
                             out_dtype=dtype)
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
