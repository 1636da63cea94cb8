"""LLM(runner="pooling").embed against transformers: every pooling type, batches of mixed lengths,
chunked prefill, preemption, prefix caching, and the per-request normalize and truncation."""

from __future__ import annotations

import pytest
import torch

from pagoda.runtime import LLM, EmbeddingRequestOutput, PoolingParams, PoolingRequestOutput, SamplingParams

from .conftest import make_inputs

TOL = 2e-5  # float32 on both sides; only summation order differs
LENGTHS = [1, 2, 7, 8, 9, 16, 17, 31, 45, 64]


def engine(path: str, **kwargs) -> LLM:
    return LLM(path, **{"runner": "pooling", "device": "cpu", "dtype": "float32", "block_size": 8, **kwargs})


def close(got, expected) -> bool:
    return torch.allclose(torch.as_tensor(got, dtype=torch.float32), expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("fixture,pooling,normalize", [("st_mean", "MEAN", True), ("bare_last", "LAST", True),
                                                      ("st_last_raw", "LAST", False)])
def test_a_batch_of_mixed_lengths_matches_transformers(request, hf_embed, fixture, pooling, normalize):
    path = request.getfixturevalue(fixture)
    inputs = make_inputs(LENGTHS)
    llm = engine(path)
    assert llm.llm_engine.pooler_config.pooling_type == pooling
    assert llm.llm_engine.pooler_config.normalize is normalize
    outputs = llm.embed(prompt_token_ids=inputs, use_tqdm=False)
    assert all(isinstance(o, EmbeddingRequestOutput) for o in outputs)
    for ids, out in zip(inputs, outputs):
        assert out.prompt_token_ids == ids and out.finished
        assert out.outputs.hidden_size == 64
        assert close(out.outputs.embedding, hf_embed.embed(path, ids, pooling, normalize)), len(ids)
    if normalize:
        assert all(abs(torch.tensor(o.outputs.embedding).norm().item() - 1) < 1e-5 for o in outputs)


@pytest.mark.parametrize("fixture,pooling", [("st_mean", "MEAN"), ("bare_last", "LAST")])
def test_chunked_prefill_splits_long_inputs_and_pools_across_chunks(request, hf_embed, fixture, pooling):
    path = request.getfixturevalue(fixture)
    inputs = make_inputs([100, 3, 57, 12], seed=4)
    llm = engine(path, max_num_batched_tokens=24, max_num_seqs=4)
    steps = []
    original = llm.llm_engine.engine_core.scheduler.schedule

    def spy():
        out = original()
        steps.append({s.request.request_id: s.num_tokens for s in out.scheduled})
        return out

    llm.llm_engine.engine_core.scheduler.schedule = spy
    outputs = llm.embed(prompt_token_ids=inputs, use_tqdm=False)
    assert max(sum(s.values()) for s in steps) <= 24
    assert sum("0" in s for s in steps) >= 5  # the 100-token input ran in at least 5 chunks
    for ids, out in zip(inputs, outputs):
        assert close(out.outputs.embedding, hf_embed.embed(path, ids, pooling)), len(ids)


def test_a_prompt_preempted_between_chunks_is_pooled_once(st_mean, hf_embed):
    # Prefill-only requests rarely preempt (the oldest finishes in the step that admits another),
    # so preempt one by hand between its chunks, as the scheduler does when the pool runs dry.
    ids = make_inputs([40], seed=5)[0]
    llm = engine(st_mean, max_num_batched_tokens=16)
    engine_ = llm.llm_engine
    engine_.add_request("p", None, ids, PoolingParams())
    engine_.step()
    engine_.step()
    scheduler = engine_.engine_core.scheduler
    [request] = scheduler.running
    assert request.num_computed_tokens == 32  # two chunks summed so far
    scheduler.running.remove(request)
    scheduler._preempt(request)
    outputs = []
    while engine_.has_unfinished_requests():
        outputs += engine_.step()
    [out] = outputs
    assert request.num_preemptions == 1
    assert close(out.outputs.data, hf_embed.embed(st_mean, ids, "MEAN"))
    assert engine_.kv_cache_manager.block_pool.num_free_blocks == engine_.kv_cache_manager.num_blocks


def test_last_pooling_uses_the_prefix_cache_and_stays_exact(bare_last, hf_embed):
    prefix = make_inputs([40], seed=6)[0]
    inputs = [prefix + tail for tail in make_inputs([1, 5, 9], seed=7)] + [prefix[:17]]
    llm = engine(bare_last)
    first = llm.embed(prompt_token_ids=inputs[:1], use_tqdm=False)
    rest = llm.embed(prompt_token_ids=inputs[1:], use_tqdm=False)
    kv = llm.llm_engine.kv_cache_manager
    assert kv.enable_caching and kv.prefix_cache_hits == 40 + 40 + 16  # whole cached blocks of the 3 later ones
    for ids, out in zip(inputs, first + rest):
        assert close(out.outputs.embedding, hf_embed.embed(bare_last, ids, "LAST"))


def test_mean_and_cls_pooling_run_without_prefix_caching(st_mean, bare_last, hf_embed):
    prefix = make_inputs([32], seed=8)[0]
    inputs = [prefix + [7, 8, 9], prefix + [10]]
    for path, kind in ((st_mean, "MEAN"), (bare_last, "CLS")):
        llm = engine(path, pooler_config=f'{{"pooling_type": "{kind}"}}')
        assert not llm.llm_engine.kv_cache_manager.enable_caching
        outputs = llm.embed(prompt_token_ids=inputs, use_tqdm=False)
        for ids, out in zip(inputs, outputs):
            assert close(out.outputs.embedding, hf_embed.embed(path, ids, kind)), kind


def test_encode_normalize_and_truncation_per_request(st_mean, hf_embed):
    llm = engine(st_mean)
    ids = make_inputs([30], seed=9)[0]
    [raw] = llm.encode(prompt_token_ids=[ids], pooling_params=PoolingParams(normalize=False), use_tqdm=False)
    assert isinstance(raw, PoolingRequestOutput) and raw.outputs.data.dtype == torch.float32
    assert close(raw.outputs.data, hf_embed.embed(st_mean, ids, "MEAN", normalize=False))
    [cut] = llm.embed(prompt_token_ids=[ids], truncate_prompt_tokens=10, use_tqdm=False)
    assert cut.prompt_token_ids == ids[-10:]
    assert close(cut.outputs.embedding, hf_embed.embed(st_mean, ids[-10:], "MEAN"))


def test_text_prompts_are_tokenized_as_transformers_does(st_mean, hf_embed):
    from transformers import AutoTokenizer

    texts = ["def parse(text):", "return the n-th Fibonacci number", "x"]
    outputs = engine(st_mean).embed(texts, use_tqdm=False)
    tokenizer = AutoTokenizer.from_pretrained(st_mean)
    for text, out in zip(texts, outputs):
        ids = tokenizer(text).input_ids
        assert out.prompt == text and out.prompt_token_ids == ids
        assert close(out.outputs.embedding, hf_embed.embed(st_mean, ids, "MEAN"))


def test_the_wrong_runner_is_refused(st_mean, bare_last):
    pooling = engine(st_mean)
    with pytest.raises(ValueError, match="pooling runner"):
        pooling.generate(["hello"], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="pooling runner"):
        pooling.chat([{"role": "user", "content": "hi"}])
    generating = LLM(st_mean, runner="generate", device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="runner='pooling'"):
        generating.embed(["hello"])
    with pytest.raises(ValueError, match="generates text"):
        generating.llm_engine.add_request("x", None, [5, 6], PoolingParams())
    with pytest.raises(ValueError, match="makes embeddings"):
        pooling.llm_engine.add_request("x", None, [5, 6], SamplingParams())


def test_inputs_the_engine_cannot_pool_are_refused(st_mean):
    llm = engine(st_mean, max_model_len=32)
    with pytest.raises(ValueError, match="empty"):
        llm.embed(prompt_token_ids=[[]], use_tqdm=False)
    with pytest.raises(ValueError, match="maximum context length is 32"):
        llm.embed(prompt_token_ids=[list(range(5, 38))], use_tqdm=False)
    [full] = llm.embed(prompt_token_ids=[list(range(5, 37))], use_tqdm=False)  # the whole context: no room
    assert len(full.prompt_token_ids) == 32  # is needed for an output token


@pytest.mark.timeout(180)  # a stuck collective must fail the test, never hang CI
def test_tensor_parallel_pooling_matches_transformers(st_mean, hf_embed):
    # Two gloo ranks: the workers build the same head-less model and never run the LM head.
    inputs = make_inputs([3, 17, 40], seed=15)
    with engine(st_mean, tensor_parallel_size=2, max_num_batched_tokens=24, max_model_len=128) as llm:
        outputs = llm.embed(prompt_token_ids=inputs, use_tqdm=False)
    for ids, out in zip(inputs, outputs):
        assert close(out.outputs.embedding, hf_embed.embed(st_mean, ids, "MEAN"))


def test_the_gpu_warm_up_runs_on_a_pooling_engine(bare_last, hf_embed):
    # The engine warms up with generation requests on CUDA; a pooling engine pools them and forgets.
    from pagoda.runtime.core.warmup import warm_up

    llm = engine(bare_last, max_model_len=256, max_num_batched_tokens=64)
    warm_up(llm.llm_engine.engine_core)
    kv = llm.llm_engine.kv_cache_manager
    assert kv.block_pool.num_free_blocks == kv.num_blocks and not llm.llm_engine.runner.pooler.partial
    ids = make_inputs([20], seed=16)[0]
    [out] = llm.embed(prompt_token_ids=[ids], use_tqdm=False)
    assert close(out.outputs.embedding, hf_embed.embed(bare_last, ids, "LAST"))
