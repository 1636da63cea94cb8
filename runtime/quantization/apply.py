"""Put a model's linear layers and MoE experts on FP8: which ones, before the weights load and after.

The scheme names checkpoint modules (q_proj, gate_proj, experts.3.w1, ...) in its ignore and targets
lists; Pagoda's fused layers (qkv_proj, gate_up_proj) answer for the checkpoint modules they hold,
through the model's stacked_params, and an expert block (FusedMoE) for every expert's gate, up and
down matrices, under the checkpoint's name of the block (the model's checkpoint_renames undone). An
image-text checkpoint's prefixes (language_model.model., ...) are the scheme's to undo (scheme.py).
Column- and row-parallel layers (fp8_linear.py) and the experts (fp8_moe.py) are quantized; the
embeddings, the LM head and the MoE router (a ReplicatedLinear) stay in the compute dtype, as in
vLLM (an FP8 router in a checkpoint is refused by the loader).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from pagoda.runtime.layers.fused_moe import FusedMoE
from pagoda.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagoda.runtime.quantization import fp8_linear, fp8_moe
from pagoda.runtime.quantization.scheme import FP8Scheme, UnsupportedQuantization

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


def expert_checkpoint_names(model: nn.Module, name: str, experts: FusedMoE) -> list[str]:
    """The checkpoint modules an expert block holds: model.layers.0.mlp (Mixtral's
    block_sparse_moe in the checkpoint) -> [...block_sparse_moe.experts.0.w1, ...experts.0.w3, ...]."""
    prefix = name + "."
    for ckpt_part, our_part in getattr(model, "checkpoint_renames", ()):
        prefix = prefix.replace(our_part, ckpt_part)
    return [f"{prefix}experts.{e}.{part}" for e in range(experts.num_experts) for part in experts.expert_names]


def fp8_experts(model: nn.Module, scheme: FP8Scheme) -> list[FusedMoE]:
    """The expert blocks the scheme quantizes: all of a block's experts, or none."""
    blocks = []
    for name, module in model.named_modules():
        if not isinstance(module, FusedMoE):
            continue
        try:
            quantized = scheme.quantizes(expert_checkpoint_names(model, name, module))
        except UnsupportedQuantization:  # its message would list every expert matrix of the block
            raise UnsupportedQuantization(
                f"quantization_config quantizes only some of the experts of {name}: a block's experts are one "
                "fused tensor, so they must be quantized alike") from None
        if quantized:
            blocks.append(module)
    return blocks


def prepare(model: nn.Module, scheme: FP8Scheme) -> None:
    """Before loading: FP8 checkpoint layers and experts get FP8 weights and scale parameters to load into."""
    for layer in fp8_layers(model, scheme):
        if scheme.serialized:
            fp8_linear.prepare_checkpoint_weights(layer, scheme)
        else:
            layer.fp8 = scheme
    for experts in fp8_experts(model, scheme):
        if scheme.serialized:
            fp8_moe.prepare_checkpoint_experts(experts, scheme)
        else:
            experts.fp8 = scheme


def finish(model: nn.Module, scheme: FP8Scheme, compute_dtype: torch.dtype) -> None:
    """After loading: quantize on the fly, keep FP8 for the GPU's FP8 kernels, or dequantize."""
    fp8 = [m for m in model.modules() if getattr(m, "fp8", None) is not None]
    layers = [m for m in fp8 if not isinstance(m, FusedMoE)]
    experts = [m for m in fp8 if isinstance(m, FusedMoE)]
    dequantized = [fp8_linear.finish_loading(layer, scheme, compute_dtype) for layer in layers]
    experts_dequantized = [fp8_moe.finish_loading(block, scheme, compute_dtype) for block in experts]
    if fp8 and next(fp8[0].parameters()).is_cuda:
        torch.cuda.empty_cache()  # the replaced bf16 weights: give the KV pool their memory back whole
    link_norms(model)
    if any(dequantized):
        device = layers[0].weight.device
        why = ("the scheme quantizes weights only" if scheme.activations == "none"
               else f"{device} has no FP8 matmul (CUDA compute capability 8.9 or more)")
        logger.warning("FP8 weights (%s) of %d linear layers are dequantized to %s at load: %s. The output has "
                       "FP8 weights' numerics, not their speed or memory.", scheme.source, len(layers),
                       compute_dtype, why)
    if any(experts_dequantized):
        logger.warning("FP8 experts (%s) of %d MoE blocks are dequantized to %s at load: %s has no FP8 (CUDA "
                       "compute capability 8.9 or more). The output has FP8 weights' numerics (weight-only), not "
                       "their speed or memory.", scheme.source, len(experts), compute_dtype, experts[0].w13.device)


def link_norms(model: nn.Module) -> None:
    """Let each RMSNorm whose output only feeds an FP8 layer quantize that layer's input in its own
    kernel. A decoder layer names its (norm, consumer) pairs in fp8_norm_inputs; a pair whose
    consumer is absent (an MoE block has no gate_up_proj) or not an FP8 layer that quantizes its
    input per token or statically (fp8_linear.fuses_input_norm) is left alone."""
    for module in model.modules():
        for producer_path in getattr(module, "fp8_residual_producers", ()):
            producer = _submodule(module, producer_path)
            if producer is not None and fp8_linear.fuses_input_norm(producer):
                producer.sums_into_norm = True  # fp8_residual.defer: its output may go into the stream
        for norm_name, consumer_path in getattr(module, "fp8_norm_inputs", ()):
            norm, consumer = getattr(module, norm_name, None), _submodule(module, consumer_path)
            if norm is not None and consumer is not None and fp8_linear.fuses_input_norm(consumer):
                norm.link_fp8_consumer(consumer)


def _submodule(module: nn.Module, path: str) -> nn.Module | None:
    """module's submodule at a dotted path ("mlp.gate_up_proj"), or None where a part is absent."""
    for part in path.split("."):
        module = getattr(module, part, None)
    return module
