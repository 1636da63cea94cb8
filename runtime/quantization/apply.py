"""Put a model's linear layers on FP8: which layers, before the weights load and after.

The scheme names checkpoint modules (q_proj, gate_proj, ...) in its ignore and targets lists;
Pagoda's fused layers (qkv_proj, gate_up_proj) answer for the checkpoint modules they hold, through
the model's stacked_params. Column- and row-parallel layers are quantized; the embeddings, the LM
head and the MoE router (a ReplicatedLinear) stay in the compute dtype, as in vLLM; MoE experts are
not quantized (an FP8 checkpoint's expert weights are refused by the loader).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from pagoda.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagoda.runtime.quantization import fp8_linear
from pagoda.runtime.quantization.scheme import FP8Scheme

logger = logging.getLogger(__name__)


def checkpoint_names(model: nn.Module, name: str) -> list[str]:
    """The checkpoint modules one of our layers holds: model.layers.0.self_attn.qkv_proj ->
    [...q_proj, ...k_proj, ...v_proj]."""
    names = []
    for ckpt_part, our_part, _ in getattr(model, "stacked_params", ()):
        if our_part in name + ".":
            names.append((name + ".").replace(our_part, ckpt_part)[:-1])
    return list(dict.fromkeys(names)) or [name]


def fp8_layers(model: nn.Module, scheme: FP8Scheme) -> list[nn.Module]:
    return [module for name, module in model.named_modules()
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear))
            and scheme.quantizes(checkpoint_names(model, name))]


def prepare(model: nn.Module, scheme: FP8Scheme) -> None:
    """Before loading: FP8 checkpoint layers get FP8 weights and scale parameters to load into."""
    for layer in fp8_layers(model, scheme):
        if scheme.serialized:
            fp8_linear.prepare_checkpoint_weights(layer, scheme)
        else:
            layer.fp8 = scheme


def finish(model: nn.Module, scheme: FP8Scheme, compute_dtype: torch.dtype) -> None:
    """After loading: quantize on the fly, keep FP8 for the GPU's FP8 matmuls, or dequantize."""
    layers = [m for m in model.modules() if getattr(m, "fp8", None) is not None]
    dequantized = [fp8_linear.finish_loading(layer, scheme, compute_dtype) for layer in layers]
    if layers and layers[0].weight.is_cuda:
        torch.cuda.empty_cache()  # the replaced bf16 weights: give the KV pool their memory back whole
    link_norms(model)
    if any(dequantized):
        device = layers[0].weight.device
        why = ("the scheme quantizes weights only" if scheme.activations == "none"
               else f"{device} has no FP8 matmul (CUDA compute capability 8.9 or more)")
        logger.warning("FP8 weights (%s) of %d linear layers are dequantized to %s at load: %s. The output has "
                       "FP8 weights' numerics, not their speed or memory.", scheme.source, len(layers),
                       compute_dtype, why)


def link_norms(model: nn.Module) -> None:
    """Let each RMSNorm whose output only feeds an FP8 layer quantize that layer's input in its own
    kernel. A decoder layer names its (norm, consumer) pairs in fp8_norm_inputs; a pair whose
    consumer is absent (an MoE block has no gate_up_proj) or not an FP8 layer that quantizes its
    input per token or statically (fp8_linear.fuses_input_norm) is left alone."""
    for module in model.modules():
        for norm_name, consumer_path in getattr(module, "fp8_norm_inputs", ()):
            norm, consumer = getattr(module, norm_name, None), module
            for part in consumer_path.split("."):
                consumer = getattr(consumer, part, None)
            if norm is not None and consumer is not None and fp8_linear.fuses_input_norm(consumer):
                norm.link_fp8_consumer(consumer)
