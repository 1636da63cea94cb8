"""Test group 3: every block comes back after finish or abort; waste stays under a block each."""

from __future__ import annotations

from pagoda.runtime import LLM, SamplingParams

from .conftest import make_prompts


def test_blocks_return_after_finish_and_abort(tiny_models):
    llm = LLM(
        tiny_models["mistral"],
        block_size=8,
        max_model_len=128,
        device="cpu",
        num_kv_blocks=40,
        max_num_seqs=6,
    )
    engine = llm.llm_engine
    kv = engine.kv_cache_manager
    prompts = make_prompts(seed=21)
    for i, p in enumerate(prompts):
        n = 2 if i % 5 == 0 else 1
        engine.add_request(str(i), None, p, SamplingParams(temperature=0.8, seed=i, n=n, max_tokens=12))
    finished = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        steps += 1
        if steps == 4:
            engine.abort_request(["3", "7", "no-such-request"])
        if steps == 9:
            engine.abort_request("15")
        # Waste: allocated slots not yet filled, under one block per running sequence.
        for r in engine.scheduler.running:
            assert 0 <= kv.num_wasted_slots(r) < kv.block_size
        used = sum(len(kv.req_to_blocks.get(r.request_id, [])) for r in engine.scheduler.running)
        shared = sum(b.ref_cnt - 1 for b in kv.block_pool.blocks if b.ref_cnt > 1)
        assert kv.num_blocks - kv.block_pool.num_free_blocks == used - shared
    assert set(finished) == {str(i) for i in range(len(prompts))}
    for rid, out in finished.items():
        reasons = {c.finish_reason for c in out.outputs}
        if rid in ("3", "7"):
            assert reasons == {"abort"}
        elif rid != "15":  # 15 may have finished before its abort came
            assert reasons <= {"length", "stop"}
    assert kv.block_pool.num_free_blocks == kv.num_blocks
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks)
    assert not kv.req_to_blocks
    stats = engine.stats()
    assert stats.num_running == stats.num_waiting == 0 and stats.kv_cache_usage == 0.0
    assert stats.generation_tokens > 0 and stats.prompt_tokens > 0


def test_request_metrics_are_ordered(tiny_models):
    llm = LLM(tiny_models["llama"], block_size=8, max_model_len=128, device="cpu")
    out = llm.generate(
        prompt_token_ids=make_prompts(seed=22)[:3],
        sampling_params=SamplingParams(max_tokens=5),
        use_tqdm=False,
    )
    for o in out:
        m = o.metrics
        assert (
            m.arrival_time
            <= m.first_scheduled_time
            <= m.first_token_time
            <= m.last_token_time
            <= m.finished_time
        )
