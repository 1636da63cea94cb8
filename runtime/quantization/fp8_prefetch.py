"""Which FP8 weights a decoder layer reads into L2 ahead of their GEMV, at one decode row.

A decoder layer names, in fp8_l2_prefetch, its attention and the layers whose weights that
attention's rotary launch reads ahead: (self_attn.attn, (o_proj, gate_up_proj)) for Llama. link()
(at load, once the FP8 weights are final) gives the attention those layers; regions_for() turns
them into the launch's kernels.l2_prefetch.Regions when a forward runs one token on a GPU that
keeps FP8 weights, with ops.L2_PREFETCH on (kernels/l2_prefetch.py says why that pays). The
prefetch is a hint: it never changes what a kernel computes.
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.runtime.quantization import fp8_linear

CHUNK = 8192  # kernels.l2_prefetch.CHUNK (that module imports Triton; this one must not on the CPU)


def link(model: nn.Module) -> None:
    """Give each decoder layer's named attention its FP8 layers to read ahead (l2_prefetch_layers)."""
    from pagoda.runtime.quantization.apply import _submodule

    for module in model.modules():
        spec = getattr(module, "fp8_l2_prefetch", None)
        if spec is None:
            continue
        starter_path, layer_paths = spec
        starter = _submodule(module, starter_path)
        layers = [_submodule(module, p) for p in layer_paths]
        layers = [layer for layer in layers if layer is not None and getattr(layer, "fp8", None) is not None
                  and fp8_linear.is_fp8(layer.weight) and layer.weight.is_cuda]
        if starter is not None and layers:
            starter.l2_prefetch_layers = tuple(layers)


def whole_chunks(t: torch.Tensor) -> torch.Tensor:
    """t's bytes (t contiguous), cut to a whole number of CHUNKs."""
    flat = t.reshape(-1).view(torch.uint8)
    return flat[: flat.numel() // CHUNK * CHUNK]


def regions(layer: nn.Module) -> list[torch.Tensor]:
    """The byte ranges of a layer's weight to read: all of it, or for a gate|up layer the first
    L2_PREFETCH_MLP_BYTES, half from the head of each half (the rows its first programs read)."""
    w = layer.weight
    sizes = getattr(layer, "output_sizes", None)
    if sizes is None or len(sizes) != 2:
        parts = [whole_chunks(w)]
    else:
        half = w.shape[0] // 2
        rows = min(half, ops.L2_PREFETCH_MLP_BYTES // (2 * w.shape[1] * w.element_size()))
        parts = [whole_chunks(w[:rows]), whole_chunks(w[half:half + rows])] if rows > 0 else []
    return [p for p in parts if p.numel()]


def regions_for(module: nn.Module, q: torch.Tensor):
    """The Regions the rotary launch of this one-token forward reads ahead, or None."""
    layers = getattr(module, "l2_prefetch_layers", None)
    if not (ops.L2_PREFETCH and layers and q.is_cuda and q.shape[0] == 1):
        return None
    from pagoda.kernels.l2_prefetch import MAX_RANGES, Regions

    parts = [region for layer in layers for region in regions(layer)][:MAX_RANGES]
    return Regions(tuple(parts), early=ops.L2_PREFETCH_EARLY) if parts else None
