"""Per-family facts read from config.json alone: which layers are sparse (MoE), which attend
through a sliding window, which normalise q and k. Pure Python, so `pagoda plan` and the memory
arithmetic use the same answers as the models, without torch."""

from __future__ import annotations

from dataclasses import dataclass

QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3", "gemma3_text")
GEMMA_TYPES = ("gemma2", "gemma3", "gemma3_text")
# Qwen2's language model, also as Qwen2-VL's and Qwen2.5-VL's text_config: a bias on q, k and v
QWEN2_TYPES = ("qwen2", "qwen2_vl_text", "qwen2_5_vl_text")


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
    it, as in transformers), or None for full attention. transformers 5 writes layer_types; older
    config.json files imply them, as transformers does when it reads them."""
    n, window, kind = cfg["num_hidden_layers"], cfg.get("sliding_window"), cfg.get("model_type")
    types = cfg.get("layer_types")
    if not window:
        return [None] * n
    if types is None:
        if kind == "gemma2":  # every other layer, the first one local
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
        elif kind in ("gemma3", "gemma3_text"):  # five local layers to one global
            pattern = cfg.get("sliding_window_pattern", 6)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        elif kind in QWEN2_TYPES + ("qwen3", "qwen3_moe"):
            first = cfg.get("max_window_layers", 0) if cfg.get("use_sliding_window") else n
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
        else:  # Mistral, Mixtral, Phi-3: every layer, when config.json gives a window
            types = ["sliding_attention"] * n
    return [window if t == "sliding_attention" else None for t in types]


def freeable_window(cfg: dict) -> int | None:
    """The window past which a block is read by no layer (the widest), when every layer has one;
    None when any layer attends to the whole sequence (then no block can be given back early)."""
    windows = layer_windows(cfg)
    return None if any(w is None for w in windows) else max(windows)


def rotary_dim(cfg: dict, head_dim: int) -> int:
    """Dimensions of each head that rotate (the rest pass through): partial_rotary_factor of them,
    at the top level or, as transformers 5 writes it, in rope_parameters (Phi-4-mini: 0.75)."""
    factor = cfg.get("partial_rotary_factor") or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor")
    return int(head_dim * (factor or 1.0))


def attention_scale(cfg: dict, head_dim: int) -> float:
    """Gemma scales scores by query_pre_attn_scalar ** -0.5, everyone else by head_dim ** -0.5."""
    return (cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5


def has_qk_norm(cfg: dict) -> bool:
    return cfg.get("model_type") in QK_NORM_TYPES


def has_qkv_bias(cfg: dict) -> bool:
    return cfg.get("model_type") in QWEN2_TYPES or bool(cfg.get("attention_bias", False))
