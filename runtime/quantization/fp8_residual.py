"""The residual stream added inside the FP8 GEMVs at one decode row (ops.FOLD_SUMSQ).

A decoder layer is o_proj -> (+ residual, RMSNorm) -> gate_up ... down -> (+ residual, RMSNorm) ->
the next layer's qkv. With the fold, o_proj and down_proj (the "producers", marked by link_norms)
do not compute their output when called: they hand the norm after them a PendingOutput. The norm
then runs the producer's GEMV with the residual add in its epilogue (into the residual stream, in
place) and one sum of squares per program, and hands its own consumer (qkv_proj, gate_up_proj) a
NormedInput whose rstd comes from those sums (kernels/gemv.py ResidualSumsq, GemvNorm.sumsq). No
norm kernel runs, and nothing passes over the row for rstd. One rank only: under tensor
parallelism the producer's output is a partial sum that an all-reduce completes first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.runtime.quantization import fp8_linear


@dataclass(slots=True)
class PendingOutput:
    """A producer's one-row output, still to be computed by the norm after it (norm_after)."""
    layer: nn.Module
    x: torch.Tensor
    bias: torch.Tensor | None
    act: str | None
    launch: object  # the kernels.fp8_dispatch.Fp8Launch of the producer at these rows

    def materialize(self) -> torch.Tensor:
        """The output as the producer would have returned it."""
        return fp8_linear.apply(self.layer, self.x, self.bias, act=self.act)


def defer(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, act: str | None = None):
    """A PendingOutput where this producer's output may go into the residual stream inside its
    GEMV (the fold on, one rank, one row, the weight-only GEMV's path), else None."""
    if not (ops.FOLD_SUMSQ and getattr(layer, "sums_into_norm", False) and layer.tp_size == 1):
        return None
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.numel() != x.shape[-1] or not x.is_contiguous():
        return None
    launch = ops.fp8_path(x, layer.weight, bias, act)
    return PendingOutput(layer, x, bias, act, launch) if launch.path == "gemv" else None


def norm_after(pending: PendingOutput, norm_weight: torch.Tensor, eps: float, residual, consumer):
    """RMSNorm(pending's output + residual) * norm_weight for the norm's consumer (an FP8 layer, or
    None), and the residual stream: (the consumer's input, residual with the output added)."""
    if residual is None or not residual.is_contiguous() or residual.dtype != pending.x.dtype:
        out = pending.materialize()
        if consumer is not None:
            return fp8_linear.norm_for(consumer, norm_weight, eps, out, residual)
        return ops.rms_norm(out, norm_weight, eps, residual)
    from pagoda.kernels.gemv import GemvNorm, ResidualSumsq, fp8_launch

    layer, x = pending.layer, pending.x
    n, k = layer.weight.shape
    config = pending.launch.config or fp8_launch(1, n, k, pending.act, x.device)
    sumsq = torch.empty(-(-n // config.block_n), dtype=torch.float32, device=x.device)
    stream = residual.view(1, n)
    ops.fp8_gemv(x, layer.weight, layer.weight_scale, pending.bias, act=pending.act, config=config, out=stream,
                 residual_sumsq=ResidualSumsq(stream, sumsq))
    if consumer is None:  # the final norm (before the LM head), or one feeding no FP8 layer
        return ops.rms_norm(residual, norm_weight, eps), residual
    launch = ops.fp8_path(residual, consumer.weight, consumer.bias)
    if launch.path == "gemv" and norm_weight.dtype == residual.dtype:
        normed = fp8_linear.NormedInput(residual, GemvNorm(norm_weight, eps, sumsq=sumsq), launch)
        return normed, residual
    return fp8_linear.norm_for(consumer, norm_weight, eps, residual), residual
