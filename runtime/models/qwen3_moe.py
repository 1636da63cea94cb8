"""Qwen3-MoE: the Qwen3 block (q/k norms) with a mixture-of-experts feed-forward: many experts,
top-k, the k weights renormalised only if norm_topk_prob. Layers listed in mlp_only_layers, or off
the decoder_sparse_step, keep a dense MLP."""

from __future__ import annotations

from torch import nn

from pagoda.runtime.layers.fused_moe import FusedMoE
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.hf_fields import is_sparse_layer, moe_shape
from pagoda.runtime.models.llama import LlamaMLP
from pagoda.runtime.models.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM


class Qwen3MoeSparseBlock(FusedMoE):
    def __init__(self, cfg: ModelConfig):
        moe = moe_shape(cfg.hf_config)
        super().__init__(cfg.hidden_size, moe.intermediate_size, moe.num_experts, moe.top_k,
                         renormalize=bool(cfg.hf_config.get("norm_topk_prob", False)))


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    @classmethod
    def make_mlp(cls, cfg: ModelConfig, layer_idx: int) -> nn.Module:
        return Qwen3MoeSparseBlock(cfg) if is_sparse_layer(cfg.hf_config, layer_idx) else LlamaMLP(cfg, layer_idx)

    @classmethod
    def mlp_checkpoint_shapes(cls, cfg: ModelConfig, p: str, layer_idx: int) -> list[tuple[str, tuple[int, ...]]]:
        if not is_sparse_layer(cfg.hf_config, layer_idx):
            return LlamaMLP.checkpoint_shapes(cfg, p, layer_idx)
        moe = moe_shape(cfg.hf_config)
        return FusedMoE.expert_checkpoint_shapes(p + "mlp.", cfg.hidden_size, moe.intermediate_size,
                                                 moe.num_experts, ("gate_proj", "up_proj", "down_proj"))


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    layer_cls = Qwen3MoeDecoderLayer
