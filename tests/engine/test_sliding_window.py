"""A sliding window shorter than the prompt, end to end: token-identical to transformers in every
scheduling regime, and on a model whose every layer is local, blocks wholly under the window are
given back as the request moves on, so a pool too small for one full-length sequence serves many."""

from __future__ import annotations

import pytest

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.memory import plan_memory
from pagoda.runtime.tools.tiny_models import build_tiny_model

from .conftest import MAX_NEW_TOKENS, make_prompts, make_shared_prefix_prompts

WINDOW, BLOCK = 12, 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
SETUPS = {
    "all_at_once": dict(),
    "chunked_prefill": dict(max_num_batched_tokens=12),
    # 128-token sequences need 16 blocks each without the window; 8 hold one with it (12 + a
    # 12-token chunk), so 8 blocks serve 16 prompts, with preemption on the way.
    "small_pool": dict(num_kv_blocks=8, max_num_batched_tokens=12),
    # Mixed steps scheduled ahead (Scheduler._mixed_ahead): the window moves past the tokens in
    # flight, so a request holds no more blocks than when each step waits for the one before.
    "chunked_prefill_mixed_ahead": dict(max_num_batched_tokens=12, mixed_ahead=True),
    "small_pool_mixed_ahead": dict(num_kv_blocks=8, max_num_batched_tokens=12, mixed_ahead=True),
}


@pytest.fixture(scope="module")
def local_model(tmp_path_factory) -> str:
    """Mistral with a window of 12 on every layer, as transformers applies it."""
    root = tmp_path_factory.mktemp("swa")
    return str(build_tiny_model(root / "mistral_swa", "mistral", extra={"sliding_window": WINDOW}))


def generate(path, prompts, mixed_ahead=False, **kwargs):
    llm = LLM(path, block_size=BLOCK, max_model_len=128, device="cpu", schedule_mixed_ahead=mixed_ahead, **kwargs)
    engine, kv = llm.llm_engine, llm.llm_engine.kv_cache_manager
    launches = {"mixed_ahead": 0}
    launch = engine.runner.launch

    def counting(sched, kv_manager, previous=None):
        launches["mixed_ahead"] += sched.mixed_ahead
        return launch(sched, kv_manager, previous)

    engine.runner.launch = counting
    for i, p in enumerate(prompts):
        engine.add_request(str(i), None, p, GREEDY)
    held = {"any": 0, "decoding": 0}  # the most blocks one request held, overall and once decoding
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0].token_ids
        for r in engine.scheduler.running:  # the table spans the sequence; the live blocks do not
            held["any"] = max(held["any"], kv.num_live_blocks(r))
            if r.num_computed_tokens > r.num_prompt_tokens:  # a decode step was allocated since
                held["decoding"] = max(held["decoding"], kv.num_live_blocks(r))
    assert kv.block_pool.num_free_blocks == kv.num_blocks  # everything came back
    assert (launches["mixed_ahead"] > 0) == mixed_ahead, launches
    return llm, [outs[str(i)] for i in range(len(prompts))], held


@pytest.mark.parametrize("setup", list(SETUPS))
def test_window_shorter_than_the_prompt_matches_transformers(local_model, hf, setup):
    prompts = make_prompts()  # up to 90 tokens against a window of 12
    llm, got, held = generate(local_model, prompts, **SETUPS[setup])
    for i, (p, g) in enumerate(zip(prompts, got)):
        assert g == hf.greedy(local_model, p), f"prompt {i} (len {len(p)})"
    plan = llm.llm_engine.memory_plan
    assert plan.sliding_window == WINDOW
    # Decoding, a request holds the window's blocks plus one at each end (a 99-token sequence
    # would hold 13); prefilling, a chunk's worth more.
    assert held["decoding"] <= -(-WINDOW // BLOCK) + 1 == 3
    if "max_num_batched_tokens" in SETUPS[setup]:
        assert held["any"] <= -(-(WINDOW - 1 + 12) // BLOCK) + 1
    if setup.startswith("small_pool"):
        assert llm.llm_engine.stats().num_preemptions > 0


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_window_with_shared_prefixes(local_model, hf, prefix_caching):
    prompts = make_shared_prefix_prompts()
    _, got, _ = generate(local_model, prompts, enable_prefix_caching=prefix_caching, max_num_seqs=8)
    assert got == [hf.greedy(local_model, p) for p in prompts]


def test_full_attention_layers_keep_every_block(tiny_models):
    """Gemma 2 mixes local and global layers: a global layer reads every block, so none is freed,
    and the same small pool is refused."""
    prompts = make_prompts()[-3:]
    _, _, held = generate(tiny_models["gemma2"], prompts, max_num_batched_tokens=12)
    assert held["decoding"] == -(-(90 + MAX_NEW_TOKENS - 1) // BLOCK)
    with pytest.raises(ValueError, match="max_model_len=128"):
        LLM(tiny_models["gemma2"], block_size=BLOCK, max_model_len=128, device="cpu", num_kv_blocks=8)


def test_plan_counts_windowed_sequences_by_their_window():
    """Mistral-7B-v0.1: a 4096 window on every layer. A 32k sequence holds 257 blocks of 16, not 2048."""
    config = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "sliding_window": 4096}
    windowed = plan_memory(config, 2, 80 * 1024**3, 0.9, max_model_len=32768, max_num_batched_tokens=8192)
    full = plan_memory({**config, "sliding_window": None}, 2, 80 * 1024**3, 0.9, max_model_len=32768)
    assert windowed.num_kv_blocks == full.num_kv_blocks
    assert windowed.max_concurrent_seqs == windowed.num_kv_blocks // (4096 // 16 + 1)
    assert full.max_concurrent_seqs == full.kv_capacity_tokens // 32768
    assert windowed.max_concurrent_seqs > 7 * full.max_concurrent_seqs
    assert windowed.max_blocks_per_seq == -(-(4095 + 8192) // 16) + 1 and windowed.sliding_window == 4096
