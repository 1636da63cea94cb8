"""Workloads are drawn exactly as BENCHMARKS.md says, and the roofline reproduces its figures."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from pagoda.runtime.tools.bench import workloads
from pagoda.runtime.tools.bench.roofline import (
    W1_PUBLISHED_ROOFLINE,
    W2_PUBLISHED_FLOOR_MS,
    decode_floor_ms,
    offline_roofline,
    published_w1_prompt_lens,
)


def spec_draw(num_requests: int) -> list[list[int]]:
    """BENCHMARKS.md, W1, word for word: random.Random(0), one request after another, the prompt
    length is randint(128, 1024), then each token id is randrange(10, 30000)."""
    rng = random.Random(0)
    prompts = []
    for _ in range(num_requests):
        n = rng.randint(128, 1024)
        prompts.append([rng.randrange(10, 30000) for _ in range(n)])
    return prompts


def test_w1_and_w4_follow_the_spec_draw():
    w1 = workloads.w1_requests()
    assert len(w1) == 256 and all(r.output_len == 256 for r in w1)
    assert [r.prompt_token_ids for r in w1] == spec_draw(256)
    assert sum(len(r.prompt_token_ids) for r in w1) == 143240
    w4 = workloads.w4_requests()
    assert len(w4) == 1024
    assert [r.prompt_token_ids for r in w4] == spec_draw(1024)
    assert all(128 <= len(r.prompt_token_ids) <= 1024 for r in w4)
    assert all(10 <= t < 30000 for r in w4 for t in r.prompt_token_ids)
    assert [r.prompt_token_ids for r in workloads.w1_requests()] == [r.prompt_token_ids for r in w1]


def test_w2_and_w3_requests():
    w2 = workloads.w2_request()
    assert len(w2.prompt_token_ids) == 128 and w2.output_len == 256
    w3 = workloads.serving_requests()
    assert len(w3) == 512
    # Prompts follow W1 (same draw), then the output lengths come from the same generator.
    assert [r.prompt_token_ids for r in w3] == spec_draw(512)
    assert all(64 <= r.output_len <= 512 for r in w3)
    rng = random.Random(0)
    for _ in range(512):
        n = rng.randint(128, 1024)
        for _ in range(n):
            rng.randrange(10, 30000)
    assert [r.output_len for r in w3] == [rng.randint(64, 512) for _ in range(512)]


def test_roofline_reproduces_the_published_figures():
    w1 = workloads.LLAMA_3_1_8B
    # The published 11,975 tok/s is this method on lengths drawn back to back (no ids in between).
    published = offline_roofline(w1, published_w1_prompt_lens(), 256)
    assert published.output_tokens_per_s == pytest.approx(W1_PUBLISHED_ROOFLINE, abs=1.0)
    # W1 as specified (ids drawn after each length) has fewer prompt tokens, so a higher limit.
    actual = offline_roofline(w1, [len(r.prompt_token_ids) for r in workloads.w1_requests()], 256)
    assert actual.prompt_tokens == 143240 and actual.output_tokens == 65536
    assert actual.output_tokens_per_s == pytest.approx(12352.7, abs=1.0)
    assert decode_floor_ms(w1) == pytest.approx(W2_PUBLISHED_FLOOR_MS, abs=0.005)


@pytest.mark.parametrize("name", ["w1", "w4", "w5"])
def test_roofline_parameter_count_matches_transformers(name):
    """The parameter count behind the roofline against the real model class, built on `meta`."""
    config = AutoConfig.for_model(**workloads.MODEL_CONFIGS[name])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in model.parameters())  # tied embeddings are counted once
    roof = offline_roofline(workloads.MODEL_CONFIGS[name], [128], 1)
    assert roof.num_params == expected
    assert roof.weight_bytes == 2 * expected


def test_w5_roofline_counts_active_parameters_and_touched_experts():
    """W5: W1's requests on Qwen3-30B-A3B. Prefill at 2 FLOPs per active parameter (3.35B of
    30.5B); each decode step of 256 sequences touches all but ~1e-5 of the 128 experts per layer,
    so it reads nearly every weight; the active-only bound (one token's 8 experts) is far higher."""
    w5 = workloads.MODEL_CONFIGS["w5"]
    assert workloads.WORKLOADS["W5"] is workloads.w1_requests and workloads.WORKLOAD_MODEL["W5"] == "w5"
    lens = [len(r.prompt_token_ids) for r in workloads.w1_requests()]
    roof = offline_roofline(w5, lens, 256)
    assert roof.num_params == 30_532_122_624 and roof.num_active_params == 3_353_032_704
    assert roof.prefill_s == pytest.approx(2 * roof.num_active_params * 143240 / 780e12)
    assert roof.experts_touched_per_layer == pytest.approx(128.0, abs=1e-4)
    assert roof.decode_step_weight_bytes == pytest.approx(roof.weight_bytes, rel=1e-6)
    assert roof.output_tokens_per_s == pytest.approx(11012, abs=2)
    assert roof.active_only_output_tokens_per_s > 2 * roof.output_tokens_per_s
    small = offline_roofline(w5, lens[:1], 256)  # one sequence touches 8 experts per layer
    assert small.experts_touched_per_layer == pytest.approx(8.0)
    assert small.decode_step_weight_bytes == 2 * roof.num_active_params


def test_fp8_roofline_reads_one_byte_weights_and_kv():
    """W1 with --quantization fp8 --kv-cache-dtype fp8: a decode step reads what W2's FP8 floor
    reads (the projections at one byte plus row scales, embeddings and LM head at two), the KV
    cache at one byte per element, and prefill runs at twice the bf16 ceiling; for W5 the experts a
    step leaves untouched are taken off at one byte."""
    w1 = workloads.LLAMA_3_1_8B
    lens = [len(r.prompt_token_ids) for r in workloads.w1_requests()]
    bf16 = offline_roofline(w1, lens, 256)
    fp8 = offline_roofline(w1, lens, 256, fp8_weights=True, kv_dtype_bytes=1)
    assert fp8.decode_step_weight_bytes / 4.25e12 * 1e3 == pytest.approx(decode_floor_ms(w1, fp8=True))
    assert 1.8 < decode_floor_ms(w1, fp8=True) < 2.2  # BENCHMARKS.md: about 1.9 ms
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.prefill_s == pytest.approx(bf16.prefill_s / 2)
    assert 1.5 < fp8.output_tokens_per_s / bf16.output_tokens_per_s < 2.0
    w5 = workloads.MODEL_CONFIGS["w5"]
    one = offline_roofline(w5, lens[:1], 256, fp8_weights=True)  # 8 of 128 experts per layer
    full = offline_roofline(w5, lens, 256, fp8_weights=True)
    sparse_layers = w5["num_hidden_layers"]
    untouched = sparse_layers * 120 * 3 * w5["hidden_size"] * w5["moe_intermediate_size"]
    assert full.decode_step_weight_bytes - one.decode_step_weight_bytes == pytest.approx(untouched, rel=1e-4)
    assert one.active_only_output_tokens_per_s == pytest.approx(one.output_tokens_per_s)


def test_synthetic_model_folders(tmp_path):
    w4 = workloads.model_folder("w4", tmp_path / "w4")
    config = AutoConfig.from_pretrained(w4)
    assert config.model_type == "qwen2" and config.hidden_size == 896 and config.tie_word_embeddings
    # AutoTokenizer (what the engine loads) covers every id the random weights may emit.
    tokenizer = AutoTokenizer.from_pretrained(w4)
    assert len(tokenizer) == config.vocab_size == 151936
    assert tokenizer.eos_token_id == 151643
    assert tokenizer.decode([151935, 17]) == "t151935t17"
    assert workloads.model_folder("w4", tmp_path / "w4") == w4  # reused, not rebuilt

    w1 = workloads.model_folder("w1", tmp_path / "w1")
    tokenizer = AutoTokenizer.from_pretrained(w1)
    assert len(tokenizer) == AutoConfig.from_pretrained(w1).vocab_size == 128256
    assert tokenizer.convert_ids_to_tokens([128009]) == ["<|eot_id|>"]
    # For Llama-family folders the text of a prompt re-encodes to its ids (the serving bench's
    # text fallback relies on it).
    ids = workloads.w1_requests()[0].prompt_token_ids
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids


def test_gpu_busy_counts_overlaps_once():
    from pagoda.runtime.tools.bench.gpu_busy import union_seconds

    ns = 1_000_000_000
    assert union_seconds([]) == 0
    assert union_seconds([(0, ns), (2 * ns, 3 * ns)]) == 2.0
    assert union_seconds([(2 * ns, 3 * ns), (0, ns), (ns // 2, 2 * ns + ns // 2)]) == 3.0
