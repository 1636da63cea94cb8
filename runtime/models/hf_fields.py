"""Per-family facts read from config.json alone: which layers are sparse (MoE), which attend
through a sliding window, which normalise q and k. Pure Python, so `pagoda plan` and the memory
arithmetic use the same answers as the models, without torch."""

from __future__ import annotations

from dataclasses import dataclass

QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3", "gemma3_text")
GEMMA_TYPES = ("gemma2", "gemma3", "gemma3_text")


@dataclass(frozen=True, slots=True)
class MoEShape:
    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert


def moe_shape(cfg: dict) -> MoEShape | None:
    """The experts of a mixture-of-experts checkpoint (Mixtral, Qwen3-MoE), or None if dense."""
    if cfg.get("model_type") == "mixtral":
        return MoEShape(cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"])
    # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts (an attribute alias)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if cfg.get("model_type") == "qwen3_moe" and experts:
        return MoEShape(experts, cfg["num_experts_per_tok"], cfg["moe_intermediate_size"])
    return None


def is_sparse_layer(cfg: dict, layer_idx: int) -> bool:
    """Whether layer layer_idx has experts; Qwen3-MoE may keep some layers dense, as transformers
    decides it (mlp_only_layers, decoder_sparse_step)."""
    if moe_shape(cfg) is None:
        return False
    if cfg.get("model_type") == "qwen3_moe":
        step = cfg.get("decoder_sparse_step", 1) or 1
        return layer_idx not in (cfg.get("mlp_only_layers") or []) and (layer_idx + 1) % step == 0
    return True


def layer_windows(cfg: dict) -> list[int | None]:
    """Each layer's sliding window in tokens (a query sees itself and the window - 1 tokens before
    it, as in transformers), or None for full attention."""
    n, window = cfg["num_hidden_layers"], cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if not window:
        return [None] * n
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    if cfg.get("model_type") in ("mistral", "mixtral", "phi3") or cfg.get("use_sliding_window"):
        return [window] * n
    return [None] * n


def has_qk_norm(cfg: dict) -> bool:
    return cfg.get("model_type") in QK_NORM_TYPES
