"""Which FP8 weights a decoder layer reads into L2 ahead of their GEMV, at one decode row.

A decoder layer names, in fp8_l2_prefetch, the module whose forward starts the reads and the layers
whose weights it reads: (the attention, (o_proj, gate_up_proj)) for Llama. link() (at load, after
the FP8 weights are final) gives that module the layers; its forward calls ahead() once its qkv
GEMV is enqueued, and join() once its o GEMV is, so the reads run beside rotary, the decode
attention and o_proj (kernels/l2_prefetch.py says why that pays) and are joined inside the same
forward, whatever a graph capture around it does. Only the GEMV path reads weights this way, so
only one token at a time takes it, on a GPU that keeps FP8 weights, with ops.L2_PREFETCH on.
"""

from __future__ import annotations

import torch
from torch import nn

from pagoda.kernels import ops
from pagoda.runtime.quantization import fp8_linear

_prefetcher = None  # kernels.l2_prefetch.Prefetcher, built on first use (it imports Triton)


def link(model: nn.Module) -> None:
    """Give each decoder layer's named module its FP8 layers to read ahead (l2_prefetch_layers)."""
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


def regions(layer: nn.Module) -> list[torch.Tensor]:
    """The parts of a layer's weight to read: all of it, or for a gate|up layer the first
    L2_PREFETCH_MLP_BYTES, half from the head of each half (the rows its first programs read)."""
    w = layer.weight
    sizes = getattr(layer, "output_sizes", None)
    if sizes is None or len(sizes) != 2:
        return [w]
    half = w.shape[0] // 2
    rows = min(half, ops.L2_PREFETCH_MLP_BYTES // (2 * w.shape[1] * w.element_size()))
    return [w[:rows], w[half:half + rows]] if rows > 0 else []


def ahead(module: nn.Module, out: torch.Tensor) -> bool:
    """Start the reads for module's linked layers if this forward runs one token; whether it did
    (then the caller must join())."""
    layers = getattr(module, "l2_prefetch_layers", None)
    if not (ops.L2_PREFETCH and layers and out.is_cuda and out.dim() >= 1 and out.shape[0] == 1):
        return False
    global _prefetcher
    if _prefetcher is None:
        from pagoda.kernels.l2_prefetch import Prefetcher

        _prefetcher = Prefetcher()
    parts = [region for layer in layers for region in regions(layer)]
    if not parts:
        return False
    _prefetcher.ahead(parts)
    return True


def join() -> None:
    """The current stream waits for the reads ahead() started."""
    if _prefetcher is not None:
        _prefetcher.join()
