"""Phi-3: the Llama block with q, k and v fused into one qkv_proj in the checkpoint, and gate and
up into one gate_up_proj, and LongRoPE (su) rotary scaling (layers/rotary.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from pagoda.runtime.layers.weight_slice import narrow
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.llama import LlamaForCausalLM, LlamaModel


class Phi3Model(LlamaModel):
    @staticmethod
    def layer_rotary_embeddings(cfg: ModelConfig):
        # LongRoPE's attention factor needs the lengths from outside rope_scaling.
        if cfg.rope_scaling is not None:
            hf = cfg.hf_config
            scaling = dict(cfg.rope_scaling)
            scaling.setdefault("original_max_position_embeddings", hf.get("original_max_position_embeddings"))
            scaling.setdefault("max_position_embeddings", hf["max_position_embeddings"])
            cfg = replace(cfg, rope_scaling=scaling)
        return LlamaModel.layer_rotary_embeddings(cfg)


class Phi3ForCausalLM(LlamaForCausalLM):
    model_cls = Phi3Model

    def load_weights(self, weights: Iterable) -> set[str]:
        return super().load_weights(self._unfuse(weights))

    def _unfuse(self, weights: Iterable) -> Iterator:
        """qkv_proj -> q_proj, k_proj, v_proj and gate_up_proj -> gate_proj, up_proj, so the
        fused layers' loaders cut each part's tensor-parallel shard as for Llama."""
        cfg = self.config
        q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
        for name, tensor in weights:
            if ".qkv_proj." in name:
                for part, start, size in (("q_proj", 0, q), ("k_proj", q, kv), ("v_proj", q + kv, kv)):
                    yield name.replace("qkv_proj", part), narrow(tensor, 0, start, size)
            elif ".gate_up_proj." in name:
                yield name.replace("gate_up_proj", "gate_proj"), narrow(tensor, 0, 0, inter)
                yield name.replace("gate_up_proj", "up_proj"), narrow(tensor, 0, inter, inter)
            else:
                yield name, tensor

    @classmethod
    def checkpoint_shapes(cls, cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
        """Llama's, with the fused tensors as the checkpoint holds them."""
        h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        inter = cfg.intermediate_size
        shapes = [("model.embed_tokens.weight", (cfg.vocab_size, h))]
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            shapes += [
                (p + "input_layernorm.weight", (h,)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "self_attn.qkv_proj.weight", (q + 2 * kv, h)),
                (p + "self_attn.o_proj.weight", (h, q)),
                (p + "mlp.gate_up_proj.weight", (2 * inter, h)),
                (p + "mlp.down_proj.weight", (h, inter)),
            ]
        shapes.append(("model.norm.weight", (h,)))
        if not cfg.tie_word_embeddings:
            shapes.append(("lm_head.weight", (cfg.vocab_size, h)))
        return shapes
