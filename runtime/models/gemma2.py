"""Gemma 2: the Llama block with Gemma's changes, each as the paper and transformers have it.

- RMSNorm scales by (1 + weight), and each half of the block is wrapped in two norms: before
  attention and after it, before the feed-forward and after it;
- embeddings are multiplied by sqrt(hidden_size), rounded to the model dtype;
- the feed-forward is GeGLU: gelu_tanh(gate) * up;
- scores are scaled by query_pre_attn_scalar ** -0.5 and soft-capped, cap * tanh(score / cap),
  and so are the final logits;
- local (sliding-window) and global layers alternate, the first one local.
The per-layer attention parameters come from config.json through LlamaAttention (see hf_fields).
"""

from __future__ import annotations

import torch

from pagoda.kernels import ops
from pagoda.runtime.layers.norm import GemmaRMSNorm
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel


class GemmaMLP(LlamaMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = self.gate_up_proj.forward_glu(x, "gelu_tanh")  # --gemm-glu at many rows
        if act is not None:
            return self.down_proj(act)
        return self.down_proj(ops.gelu_tanh_and_mul(self.gate_up_proj(x)))


class Gemma2DecoderLayer(LlamaDecoderLayer):
    mlp_cls = GemmaMLP
    # post_attention_layernorm normalises the attention's output; the MLP's input norm is the next one
    fp8_norm_inputs = (("input_layernorm", "self_attn.qkv_proj"), ("pre_feedforward_layernorm", "mlp.gate_up_proj"))
    fp8_residual_producers = ()  # each output is normalised on its own before the residual add

    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary_emb):
        super().__init__(cfg, layer_idx, rotary_emb)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, positions, hidden, residual):
        # The residual adds are fused into the norms that follow them, as in LlamaDecoderLayer.
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual

    @classmethod
    def checkpoint_shapes(cls, cfg: ModelConfig, layer_idx: int) -> list[tuple[str, tuple[int, ...]]]:
        h, p = cfg.hidden_size, f"model.layers.{layer_idx}."
        norms = [(f"{p}{n}_feedforward_layernorm.weight", (h,)) for n in ("pre", "post")]
        return super().checkpoint_shapes(cfg, layer_idx) + norms


class GemmaModel(LlamaModel):
    def __init__(self, cfg: ModelConfig, layer_cls):
        super().__init__(cfg, layer_cls)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.embed_scale = cfg.hidden_size**0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids)
        # transformers rounds the scale to the model dtype before multiplying
        hidden, residual = embeds * torch.tensor(self.embed_scale, dtype=embeds.dtype), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Gemma2ForCausalLM(LlamaForCausalLM):
    model_cls = GemmaModel
    layer_cls = Gemma2DecoderLayer

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.config.hf_config.get("final_logit_softcapping")
        return logits if not cap else torch.tanh(logits / cap) * cap
