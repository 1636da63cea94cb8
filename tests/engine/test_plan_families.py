"""`pagoda plan`'s arithmetic per family, at real sizes, against transformers' own models built on
the meta device (no memory): total parameters, active parameters of a mixture of experts, and the
KV bytes per token."""

from __future__ import annotations

import json

import pytest
import torch

from pagoda.runtime.memory import count_parameters
from pagoda.runtime.plan import format_plan, make_plan

# The published shapes (config.json fields) of one checkpoint per family.
REAL = {
    "Qwen3-30B-A3B": ("Qwen3MoeConfig", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, vocab_size=151936, tie_word_embeddings=False)),
    "Mixtral-8x7B": ("MixtralConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000)),
    "Qwen3-8B": ("Qwen3Config", dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False)),
    # four norms per block, tied embeddings by default
    "Gemma-2-9B": ("Gemma2Config", dict(
        hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, vocab_size=256000, query_pre_attn_scalar=256, sliding_window=4096)),
    # q/k norms too
    "Gemma-3-1B": ("Gemma3TextConfig", dict(
        hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, vocab_size=262144, query_pre_attn_scalar=256, sliding_window=512)),
    # fused qkv and gate_up in the checkpoint: the same parameters
    "Phi-3-mini-4k": ("Phi3Config", dict(
        hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32064, sliding_window=2047, tie_word_embeddings=False)),
}


def hf_model(config_cls: str, fields: dict):
    import transformers as tf

    config = getattr(tf, config_cls)(**fields)
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(config)
    return config, model


@pytest.mark.parametrize("name", list(REAL))
def test_parameter_counts_match_transformers_at_real_size(name):
    config_cls, fields = REAL[name]
    config, model = hf_model(config_cls, fields)
    as_json = json.loads(config.to_json_string())
    total = sum(p.numel() for p in model.parameters())
    assert count_parameters(as_json) == total
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    if experts:  # active = everything but the experts, plus k of each layer's E experts
        num_experts, top_k = as_json.get("num_experts") or as_json["num_local_experts"], as_json["num_experts_per_tok"]
        assert count_parameters(as_json, active=True) == total - experts + experts * top_k // num_experts
    else:
        assert count_parameters(as_json, active=True) == total


def test_plan_prints_active_parameters_of_a_mixture_of_experts(tmp_path):
    config_cls, fields = REAL["Qwen3-30B-A3B"]
    config, _ = hf_model(config_cls, fields)
    config.architectures = ["Qwen3MoeForCausalLM"]
    config.save_pretrained(tmp_path)
    plan = make_plan(str(tmp_path), 141.0, dtype="bfloat16", max_model_len=4096)
    assert plan["num_parameters"] > 30e9 and 3.2e9 < plan["num_active_parameters"] < 3.4e9
    # K and V of 48 layers of 4 KV heads of 128, in bf16
    assert plan["kv_bytes_per_token"] == 2 * 48 * 4 * 128 * 2
    assert plan["weight_bytes"] == plan["num_parameters"] * 2
    assert "B active per token" in format_plan(plan)


@pytest.mark.parametrize("name,arch,freed", [("Phi-3-mini-4k", "Phi3ForCausalLM", True),
                                             ("Gemma-2-9B", "Gemma2ForCausalLM", False)])
def test_plan_counts_sequences_by_the_window_only_when_every_layer_has_one(tmp_path, name, arch, freed):
    """Phi-3-mini's 2047-token window is on every layer, so a sequence holds about 2047 tokens of
    blocks whatever its length; Gemma 2's global layers read every block, so nothing changes."""
    config_cls, fields = REAL[name]
    config, _ = hf_model(config_cls, fields)
    config.architectures = [arch]
    config.save_pretrained(tmp_path)
    plan = make_plan(str(tmp_path), 141.0, dtype="bfloat16", max_model_len=4096)
    blocks_per_seq = -(-4096 // plan["block_size"])
    if freed:
        assert plan["sliding_window"] == 2047
        assert plan["max_concurrent_seqs"] == plan["num_kv_blocks"] // (-(-2047 // plan["block_size"]) + 1)
        assert "sliding window of 2047 on every layer" in format_plan(plan)
    else:
        assert plan["sliding_window"] is None
        assert plan["max_concurrent_seqs"] == plan["num_kv_blocks"] // blocks_per_seq
        assert "sliding window" not in format_plan(plan)


def test_plan_counts_the_text_model_of_an_image_text_checkpoint(tmp_path):
    """gemma-3-4b-it's config.json as Google wrote it: text_config gives only what differs from
    Gemma3TextConfig's defaults (no head counts, no vocabulary). Pagoda serves its language model
    alone, so plan counts that (transformers' own language_model), and its KV, and says so."""
    import transformers as tf

    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}
    vision = {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "model_type": "siglip_vision_model",
              "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}
    google = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
              "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
              "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3", "text_config": text,
              "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "vision_config": vision}
    (tmp_path / "config.json").write_text(json.dumps(google))
    with torch.device("meta"):
        model = tf.Gemma3ForConditionalGeneration(tf.AutoConfig.from_pretrained(tmp_path))
    language = sum(p.numel() for p in model.model.language_model.parameters())
    everything = sum(p.numel() for p in model.parameters())
    plan = make_plan(str(tmp_path), 80.0, max_model_len=8192)
    assert plan["num_parameters"] == plan["num_active_parameters"] == language < everything
    assert 3.8e9 < language < 3.9e9 and everything > 4.2e9  # Google's 4B: 3.9 B of text, 0.4 B of SigLIP
    assert plan["dtype"] == "bfloat16" and plan["weight_bytes"] == language * 2
    assert plan["kv_bytes_per_token"] == 2 * 34 * 4 * 256 * 2  # K and V, 34 layers of 4 KV heads of 256
    assert plan["parameters_counted"].startswith("text model only")
    assert "text model only (vision tower and projector not served)" in format_plan(plan)


def test_plan_counts_the_text_model_of_mistral_small_3_1(tmp_path):
    """Mistral-Small-3.1-24B-Instruct-2503's config.json as published: a 24B Mistral (head_dim 128,
    not 5120 / 32; its own LM head) beside a Pixtral tower. plan counts the language model and its
    head (transformers' own modules), not the tower and projector."""
    import transformers as tf

    text = {"head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 32768,
            "max_position_embeddings": 131072, "model_type": "mistral", "num_attention_heads": 32,
            "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0,
            "sliding_window": None, "use_cache": True, "vocab_size": 131072}
    vision = {"head_dim": 64, "hidden_act": "silu", "hidden_size": 1024, "image_size": 1540, "intermediate_size": 4096,
              "model_type": "pixtral", "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14,
              "rope_theta": 10000.0}
    published = {"architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10,
                 "model_type": "mistral3", "multimodal_projector_bias": False, "projector_hidden_act": "gelu",
                 "spatial_merge_size": 2, "text_config": text, "torch_dtype": "bfloat16",
                 "transformers_version": "4.50.0.dev0", "vision_config": vision, "vision_feature_layer": -1}
    (tmp_path / "config.json").write_text(json.dumps(published))
    config = tf.AutoConfig.from_pretrained(tmp_path)
    config.tie_word_embeddings = False  # the checkpoint stores language_model.lm_head (transformers keeps it)
    with torch.device("meta"):
        model = tf.Mistral3ForConditionalGeneration(config)
    language = sum(p.numel() for p in model.model.language_model.parameters()) + model.lm_head.weight.numel()
    everything = sum(p.numel() for p in model.parameters())
    plan = make_plan(str(tmp_path), 80.0, max_model_len=8192)
    assert plan["num_parameters"] == language < everything
    assert 23.5e9 < language < 23.7e9 and everything > 24.0e9  # 23.6 B of text, 0.4 B of Pixtral
    assert plan["kv_bytes_per_token"] == 2 * 40 * 8 * 128 * 2  # K and V, 40 layers of 8 KV heads of 128
    assert plan["parameters_counted"].startswith("text model only")


def test_plan_counts_the_text_model_of_qwen2_5_vl_7b(tmp_path):
    """Qwen2.5-VL-7B-Instruct's config.json as published (transformers 4.4x: the text fields at the
    top level, M-RoPE in rope_scaling, a window that use_sliding_window leaves off): plan counts the
    Qwen2 language model with its qkv bias and LM head (transformers' own modules), full attention."""
    import transformers as tf

    vision = {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
              "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
              "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
              "tokens_per_second": 2, "temporal_patch_size": 2}
    published = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
                 "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
                 "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
                 "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
                 "intermediate_size": 18944, "max_position_embeddings": 128000, "max_window_layers": 28,
                 "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
                 "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.41.2",
                 "use_cache": True, "use_sliding_window": False, "vision_config": vision,
                 "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064}
    (tmp_path / "config.json").write_text(json.dumps(published))
    with torch.device("meta"):
        model = tf.Qwen2_5_VLForConditionalGeneration(tf.AutoConfig.from_pretrained(tmp_path))
    language = sum(p.numel() for p in model.model.language_model.parameters()) + model.lm_head.weight.numel()
    everything = sum(p.numel() for p in model.parameters())
    plan = make_plan(str(tmp_path), 80.0, max_model_len=8192)
    assert plan["num_parameters"] == language < everything
    assert language == 7_615_616_512 and everything > 8.2e9  # Qwen2.5-7B's count, and 0.67 B of ViT
    assert plan["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 2 and plan["sliding_window"] is None
    assert plan["parameters_counted"].startswith("text model only")
