"""Test group 1: greedy output is token-identical to transformers in every scheduling regime."""

from __future__ import annotations

import pytest

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.tools.tiny_models import FAMILIES

from .conftest import MAX_NEW_TOKENS, make_prompts, make_shared_prefix_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)

SETUPS = {
    "all_at_once": dict(),
    "max_num_seqs_2": dict(max_num_seqs=2),
    "chunked_prefill": dict(max_num_batched_tokens=12),
    # 128 / 8 = 16 blocks hold one full-length sequence; 18 cannot hold 16 prompts at once.
    "preemption": dict(num_kv_blocks=18),
}


def run(path: str, prompts: list[list[int]], **kwargs):
    llm = LLM(path, block_size=8, max_model_len=128, device="cpu", **kwargs)
    outputs = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outputs]


def assert_matches_hf(hf, path, prompts, got):
    want = [hf.greedy(path, p) for p in prompts]
    for i, (w, g) in enumerate(zip(want, got)):
        assert g == w, f"prompt {i} (len {len(prompts[i])}): engine {g} != transformers {w}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("setup", list(SETUPS))
def test_greedy_matches_transformers(tiny_models, hf, family, setup):
    path = tiny_models[family]
    prompts = make_prompts()
    llm, got = run(path, prompts, **SETUPS[setup])
    assert_matches_hf(hf, path, prompts, got)
    stats = llm.llm_engine.stats()
    if setup == "preemption":
        assert stats.num_preemptions > 0
    assert stats.num_running == stats.num_waiting == 0
    assert (
        llm.llm_engine.kv_cache_manager.block_pool.num_free_blocks == llm.llm_engine.memory_plan.num_kv_blocks
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_shared_prefixes(tiny_models, hf, family, prefix_caching):
    path = tiny_models[family]
    prompts = make_shared_prefix_prompts()
    # Two waves (max_num_seqs=8): the second reuses blocks the first left cached in the LRU.
    llm, got = run(path, prompts, enable_prefix_caching=prefix_caching, max_num_seqs=8)
    assert_matches_hf(hf, path, prompts, got)
    stats = llm.llm_engine.stats()
    if prefix_caching:
        assert stats.prefix_cache_hits > 0
        assert stats.prefix_cache_queries >= stats.prefix_cache_hits
    else:
        assert stats.prefix_cache_hits == 0
