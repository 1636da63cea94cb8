"""Rotary tables of the new families against transformers' own rotary modules: Phi-3's LongRoPE
on both sides of its original length, and Gemma 3's local and global layers."""

from __future__ import annotations

from pathlib import Path

import torch

from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.gemma3 import Gemma3Model
from pagoda.runtime.models.hf_fields import layer_windows
from pagoda.runtime.models.phi3 import Phi3Model


def hf_cos_sin(rope, num_positions: int, head_dim: int, **kwargs):
    x = torch.zeros(1, 1, head_dim)
    cos, sin = rope(x, torch.arange(num_positions)[None], **kwargs)
    half = head_dim // 2  # transformers repeats the half; our table holds it once
    return cos[0, :, :half], sin[0, :, :half]


def test_longrope_short_and_long_factors_match_transformers(tiny_models):
    from transformers import AutoConfig
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    path = Path(tiny_models["phi3"])
    cfg = ModelConfig.from_path(path, max_model_len=400)
    table = Phi3Model.layer_rotary_embeddings(cfg)[0].cos_sin_cache
    cos, sin = table.chunk(2, dim=-1)
    rope = Phi3RotaryEmbedding(AutoConfig.from_pretrained(path))
    original = 256
    # transformers uses the short factors while a forward's positions stay within the original
    # length, and the long ones for every position once any passes it
    short_cos, short_sin = hf_cos_sin(rope, original, cfg.head_dim)
    long_cos, long_sin = hf_cos_sin(rope, 400, cfg.head_dim)
    torch.testing.assert_close(cos[:original], short_cos, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sin[:original], short_sin, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cos[original:], long_cos[original:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sin[original:], long_sin[original:], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(short_cos[1:], long_cos[1:original])  # the two sets differ
    assert cos[0, 0] > 1.0  # LongRoPE's attention factor scales cos and sin


def test_gemma3_local_and_global_layers_have_their_own_rotary_tables(tiny_models):
    from transformers import AutoConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    path = Path(tiny_models["gemma3"])
    cfg = ModelConfig.from_path(path, max_model_len=128)
    tables = Gemma3Model.layer_rotary_embeddings(cfg)
    windows = layer_windows(cfg.hf_config)
    assert windows == [12, 12, None]
    assert tables[0] is tables[1] and tables[1] is not tables[2]  # one table per layer kind
    rope = Gemma3RotaryEmbedding(AutoConfig.from_pretrained(path))
    for layer, kind in ((0, "sliding_attention"), (2, "full_attention")):
        cos, sin = tables[layer].cos_sin_cache.chunk(2, dim=-1)
        want_cos, want_sin = hf_cos_sin(rope, 128, cfg.head_dim, layer_type=kind)
        torch.testing.assert_close(cos, want_cos, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(sin, want_sin, rtol=1e-6, atol=1e-6)


def test_partial_rotary_logits_match_transformers(tmp_path, hf):
    """Phi-4-mini's layout (a Phi3ForCausalLM): only partial_rotary_factor of each head rotates,
    with LongRoPE factors for those dimensions only; the rest pass through."""
    import random

    from pagoda.runtime.tools.tiny_models import build_tiny_model

    from .test_logits_parity import ATOL, engine_logits

    factors = [1.0, 1.5, 2.0, 2.5]  # head_dim 16 * 0.5 rotates 8 dims: 4 frequencies
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "original_max_position_embeddings": 256, "short_factor": factors,
            "long_factor": [4 * f for f in factors]}
    path = str(build_tiny_model(tmp_path / "phi_partial", "phi3",
                                extra={"rope_parameters": rope, "partial_rotary_factor": 0.5}))
    cfg = ModelConfig.from_path(Path(path), max_model_len=64)
    assert Phi3Model.layer_rotary_embeddings(cfg)[0].cos_sin_cache.shape[-1] == 8
    rng = random.Random(3)
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in (40, 44)]  # the phases' lengths
    got = engine_logits(path, seqs)
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            want = hf.model(path)(torch.tensor([seq])).logits[0]
        assert (got[s] - want).abs().max() <= ATOL
