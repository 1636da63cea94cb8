"""Gemma 3, text only: the Gemma 2 block with RMSNorm on q and k per head (Gemma's 1 + weight), no
soft-capping, and five local (sliding-window) layers to each global one, each kind with its own
rotary base (and the global ones with their own scaling)."""

from __future__ import annotations

from pagoda.runtime.layers.norm import GemmaRMSNorm
from pagoda.runtime.layers.rotary import RotaryEmbedding
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.gemma2 import Gemma2DecoderLayer, Gemma2ForCausalLM, GemmaModel
from pagoda.runtime.models.hf_fields import layer_windows
from pagoda.runtime.models.qwen3 import Qwen3Attention


def layer_rope(cfg: ModelConfig, local: bool) -> tuple[float, dict | None]:
    """(rope base, scaling) of local or global layers: transformers 5 writes rope_parameters per
    layer type; older config.json files give rope_local_base_freq, rope_theta and rope_scaling."""
    hf = cfg.hf_config
    kind = "sliding_attention" if local else "full_attention"
    per_type = hf.get("rope_parameters") or {}
    if kind in per_type:
        params = dict(per_type[kind])
        scaled = params.get("rope_type", "default") != "default"
        return float(params.get("rope_theta", 10000.0 if local else 1e6)), params if scaled else None
    if local:
        return float(hf.get("rope_local_base_freq", 10000.0)), None
    return float(hf.get("rope_theta", 1e6)), hf.get("rope_scaling")


class Gemma3Attention(Qwen3Attention):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary_emb):
        super().__init__(cfg, layer_idx, rotary_emb)
        self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    attention_cls = Gemma3Attention


class Gemma3Model(GemmaModel):
    @staticmethod
    def layer_rotary_embeddings(cfg: ModelConfig) -> list[RotaryEmbedding]:
        tables = {}
        for local in (True, False):
            base, scaling = layer_rope(cfg, local)
            tables[local] = RotaryEmbedding(cfg.head_dim, cfg.max_model_len, base, scaling)
        return [tables[window is not None] for window in layer_windows(cfg.hf_config)]


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    model_cls = Gemma3Model
    layer_cls = Gemma3DecoderLayer
