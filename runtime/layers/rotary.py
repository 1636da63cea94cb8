"""Rotary position embedding: a cos/sin cache built once, with Llama-3's frequency scaling, linear
scaling, and Phi-3's LongRoPE.

The cache holds cat(cos, sin) of position * inv_freq in float32, computed the way transformers
computes it, so positions rotate bit-for-bit as in the reference model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "su")


def default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (base**exponents)


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's scheme: keep high frequencies, divide low ones by `factor`, blend in between."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def longrope_cos_sin_cache(rotary_dim: int, max_position: int, base: float, scaling: dict) -> torch.Tensor:
    """Phi-3's LongRoPE: per-frequency factors, short ones up to original_max_position_embeddings
    and long ones past it, and cos and sin scaled by an attention factor, as transformers computes
    them. transformers picks one set of factors for a whole forward pass (long once any position
    passes the original length); here each position has its own, so a cached key never changes its
    rotation: the two agree on every sequence within the original length."""
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or scaling["max_position_embeddings"] / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    shape = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    positions = torch.arange(max_position, dtype=torch.float32)[:, None]
    short, long = (1.0 / (torch.tensor(scaling[k], dtype=torch.float32) * base**shape)
                   for k in ("short_factor", "long_factor"))
    freqs = torch.where(positions < original, positions * short[None, :], positions * long[None, :])
    return torch.cat([freqs.cos() * attention_factor, freqs.sin() * attention_factor], dim=-1)


def build_cos_sin_cache(
    rotary_dim: int, max_position: int, base: float, scaling: dict | None
) -> torch.Tensor:
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")
    if rope_type in ("longrope", "su"):
        return longrope_cos_sin_cache(rotary_dim, max_position, base, scaling)
    inv_freq = default_inv_freq(rotary_dim, base)
    positions = torch.arange(max_position, dtype=torch.float32)
    if rope_type == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    elif rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    freqs = positions[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


class RotaryEmbedding(nn.Module):
    """The layer's cos/sin table; Attention applies it, in the kernel that writes the KV cache."""

    def __init__(self, rotary_dim: int, max_position: int, base: float, scaling: dict | None = None):
        super().__init__()
        cache = build_cos_sin_cache(rotary_dim, max_position, base, scaling)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

