"""Qwen3: the Llama block with an RMSNorm on each query and key head before rotary, and no qkv
bias (unless config.json sets attention_bias)."""

from __future__ import annotations

import torch

from pagoda.runtime.layers.norm import RMSNorm
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary_emb):
        super().__init__(cfg, layer_idx, rotary_emb)
        # Over head_dim only, shared by every head (and by every rank).
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        d = self.q_norm.weight.shape[0]
        q = self.q_norm(q.reshape(-1, d)).view(q.shape[0], self.num_heads, d)
        k = self.k_norm(k.reshape(-1, d)).view(k.shape[0], self.num_kv_heads, d)
        return self.o_proj(self.attn(q, k, v, positions, self.rotary_emb.cos_sin_cache))

    @staticmethod
    def checkpoint_shapes(cfg: ModelConfig, p: str) -> list[tuple[str, tuple[int, ...]]]:
        d = cfg.head_dim
        return LlamaAttention.checkpoint_shapes(cfg, p) + [
            (p + "self_attn.q_norm.weight", (d,)),
            (p + "self_attn.k_norm.weight", (d,)),
        ]


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3ForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen3DecoderLayer
