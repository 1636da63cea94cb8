"""The FP8 share of a model's weights, for `pagoda plan`: the layers and expert blocks the scheme
quantizes, asked of the model itself, built on the meta device (no memory, no weights). So an
ignore list or a targets list counts exactly as the loader applies it (apply.py), for every family,
instead of the config arithmetic's guess that every projection is FP8."""

from __future__ import annotations

import torch

from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.quantization import apply
from pagoda.runtime.quantization.scheme import FP8Scheme


def fp8_weight_shape(cfg: ModelConfig, scheme: FP8Scheme) -> tuple[int, int]:
    """(parameters, output rows) of the FP8 weights: one byte per parameter and a float32 scale
    per output row (per expert for an expert block), as memory.count_weight_bytes counts them."""
    from pagoda.runtime.models.registry import get_model_class

    with torch.device("meta"):
        model = get_model_class(cfg.architecture)(cfg)
    params = rows = 0
    for layer in apply.fp8_layers(model, scheme):
        params += layer.weight.numel()
        rows += layer.weight.shape[0]
    for experts in apply.fp8_experts(model, scheme):
        for w in (experts.w13, experts.w2):  # [experts, out, in]
            params += w.numel()
            rows += w.shape[0] * w.shape[1]
    return params, rows
