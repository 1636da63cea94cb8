"""Mixtral: the Llama block with a mixture-of-experts feed-forward (8 experts, top-2, weights
renormalised over the chosen two)."""

from __future__ import annotations

from pagoda.runtime.layers.fused_moe import FusedMoE
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.hf_fields import moe_shape
from pagoda.runtime.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class MixtralMoE(FusedMoE):
    expert_names = ("w1", "w3", "w2")

    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        moe = moe_shape(cfg.hf_config)
        super().__init__(cfg.hidden_size, moe.intermediate_size, moe.num_experts, moe.top_k, renormalize=True)

    @staticmethod
    def checkpoint_shapes(cfg: ModelConfig, p: str, layer_idx: int = 0) -> list[tuple[str, tuple[int, ...]]]:
        moe = moe_shape(cfg.hf_config)
        return FusedMoE.expert_checkpoint_shapes(p + "block_sparse_moe.", cfg.hidden_size, moe.intermediate_size,
                                                 moe.num_experts, MixtralMoE.expert_names)


class MixtralDecoderLayer(LlamaDecoderLayer):
    mlp_cls = MixtralMoE


class MixtralForCausalLM(LlamaForCausalLM):
    layer_cls = MixtralDecoderLayer
    # block_sparse_moe.gate is the router (our mlp.gate); experts.N.w1/w3/w2 go into mlp.w13 and mlp.w2
    checkpoint_renames = ((".block_sparse_moe.", ".mlp."),)
