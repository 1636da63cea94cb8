"""FP8 mixture-of-experts: the experts' FP8 parameters, what loading leaves them as, their forward.

An FP8 expert block (a FusedMoE the scheme quantizes, see apply.py) holds w13 [E, 2 * inter,
hidden] and w2 [E, hidden, inter] as float8_e4m3fn, with one float32 scale per expert and output
row: w13_weight_scale [E, 2 * inter], w2_weight_scale [E, hidden]. Checkpoints store one scale per
expert matrix (per tensor) or per its output channel (per channel); a per-tensor scale is repeated
over its rows, so gate and up keep their own scales exactly. (vLLM's kernels take one scale per
expert's w13, so vLLM requantizes gate and up to the larger of the two; our kernels scale each
output row, which needs no requantization and stays equal to the checkpoint's q * scale, the
numerics transformers computes.) Static activation scales (input_scale of each expert's gate, up
and down) become one per-tensor scale per GEMM, the largest over the experts, as in vLLM: a token's
hidden state is quantized once, before it is routed.

Then:
- on a GPU with FP8 (compute capability 8.9 or more) the experts stay FP8 and run the fused MoE
  kernel's FP8 variant (kernels/fused_moe.py): W8A8 where the scheme quantizes activations (per
  token, per tensor, or by the static scales), weight-only (W8A16) where it does not or where
  ops.MOE_FP8_W8A8 is off;
- anywhere else the weights are dequantized once, at load, to the compute dtype (q * scale), and
  the block runs the plain kernel. That is the reference the tests compare with transformers.
On-the-fly quantization (--quantization fp8) loads the bf16 experts as usual and quantizes every
expert matrix per output row afterwards.
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.kernels.quant_fp8_ref import FP8_DTYPE, quantize_weight_fp8_ref
from pagoda.runtime.quantization import fp8_linear
from pagoda.runtime.quantization.fp8_linear import is_fp8

SCALES = ("w13_weight_scale", "w2_weight_scale", "w13_input_scale", "w2_input_scale")


def _parameter(tensor: torch.Tensor, loader=None) -> nn.Parameter:
    param = nn.Parameter(tensor, requires_grad=False)
    if loader is not None:
        param.weight_loader = loader
    return param


def prepare_checkpoint_experts(layer: nn.Module, scheme) -> None:
    """Make room for an FP8 checkpoint's expert tensors: e4m3 w13 and w2, their row scales, and
    static input scales."""
    layer.fp8 = scheme
    for name in ("w13", "w2"):
        old = getattr(layer, name)
        setattr(layer, name, _parameter(torch.empty(old.shape, dtype=FP8_DTYPE, device=old.device),
                                        old.weight_loader))
        rows = torch.ones(old.shape[:2], dtype=torch.float32, device=old.device)
        setattr(layer, f"{name}_weight_scale", _parameter(rows, layer.expert_scale_loader))
        if scheme.activations == "static-tensor":
            zero = torch.zeros((), dtype=torch.float32, device=old.device)
            setattr(layer, f"{name}_input_scale", _parameter(zero, layer.expert_input_scale_loader))


def finish_loading(layer: nn.Module, scheme, compute_dtype: torch.dtype) -> bool:
    """After the weights are in: quantize bf16 experts (on the fly), keep FP8 where the device
    runs the FP8 kernel, or dequantize to compute_dtype. Returns True when it dequantized."""
    layer.fp8 = scheme
    if not is_fp8(layer.w13):  # --quantization fp8: every expert matrix per output row, one at a time
        for name in ("w13", "w2"):
            w = getattr(layer, name).data
            q = torch.empty(w.shape, dtype=FP8_DTYPE, device=w.device)
            scale = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
            for e in range(w.shape[0]):
                q[e], scale[e] = quantize_weight_fp8_ref(w[e])
            setattr(layer, name, _parameter(q))
            setattr(layer, f"{name}_weight_scale", _parameter(scale))
    if fp8_linear.has_fp8_matmul(layer.w13.device):  # the dense layers' test: one switch for both
        return False
    for name in ("w13", "w2"):
        q, scale = getattr(layer, name).data, getattr(layer, f"{name}_weight_scale").data
        w = torch.empty(q.shape, dtype=compute_dtype, device=q.device)
        for e in range(q.shape[0]):  # one expert at a time: no fp32 copy of the whole stack
            w[e] = (q[e].float() * scale[e][:, None]).to(compute_dtype)
        setattr(layer, name, _parameter(w))
    for name in SCALES:
        if hasattr(layer, name):
            delattr(layer, name)
    return True


def apply(layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """The FP8 experts' output for routed x (before the tensor-parallel all-reduce)."""
    activations = layer.fp8.activations if ops.MOE_FP8_W8A8 else "none"
    return ops.fused_moe(x, layer.w13, layer.w2, topk_weights, topk_ids, layer.activation,
                         w13_scale=layer.w13_weight_scale, w2_scale=layer.w2_weight_scale, activations=activations,
                         a13_scale=getattr(layer, "w13_input_scale", None),
                         a2_scale=getattr(layer, "w2_input_scale", None))
