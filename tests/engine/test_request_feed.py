"""LLM.generate hands its requests to the engine a few steps ahead of the scheduler
(frontend/request_feed.py): the steps and the outputs are those of adding every request first, and
a prompt that fails late in the list takes the call's other requests out of the engine with it."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.frontend import request_feed
from pagoda.runtime.frontend.request_feed import RequestFeed

from .conftest import make_prompts

# 30 prompts of 3-40 tokens against a 32-token budget: the lead (3 budgets) holds a few of them.
PROMPTS = make_prompts(seed=5, lengths=[3 + (7 * i) % 38 for i in range(30)])
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _llm(path: str) -> LLM:
    return LLM(path, block_size=8, max_model_len=64, device="cpu", max_num_seqs=32, max_num_batched_tokens=32,
               num_kv_blocks=400)


def _generate_recording_steps(llm: LLM, prompts) -> tuple[list, list[tuple[int, int]], int]:
    """Outputs, each launch's (tokens, rows), and the requests the engine held at the first launch."""
    engine = llm.llm_engine
    runner, launch = engine.runner, engine.runner.launch
    steps, held = [], []

    def record(sched, kv, *previous):
        steps.append((sched.total_num_tokens, len(sched.scheduled)))
        held.append(len(engine.scheduler.requests))
        return launch(sched, kv, *previous)

    runner.launch = record
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    finally:
        del runner.launch
    return [o.outputs[0].token_ids for o in outs], steps, held[0]


def test_requests_go_in_ahead_of_the_scheduler_and_the_steps_are_the_same(tiny_models, monkeypatch):
    fed = _generate_recording_steps(_llm(tiny_models["qwen2"]), PROMPTS)
    monkeypatch.setattr(request_feed, "LEAD_STEPS", 10**6)  # every request before the first step
    upfront = _generate_recording_steps(_llm(tiny_models["qwen2"]), PROMPTS)
    assert upfront[2] == len(PROMPTS)
    assert fed[2] < len(PROMPTS) // 2  # the feed held most prompts back at the first launch
    assert fed[1] == upfront[1]  # the same tokens and rows, step by step
    assert fed[0] == upfront[0]
    assert sum(n for n, _ in fed[1]) == sum(map(len, PROMPTS)) + len(PROMPTS) * (GREEDY.max_tokens - 1)


def test_a_bad_prompt_late_in_the_list_ends_the_call_and_leaves_nothing_behind(tiny_models):
    llm = _llm(tiny_models["qwen2"])
    engine, kv = llm.llm_engine, llm.llm_engine.kv_cache_manager
    vocab = engine.model_config.vocab_size
    bad = PROMPTS[:-1] + [[5, 6, vocab]]
    with pytest.raises(ValueError, match="prompt token ids must be in"):
        llm.generate([{"prompt_token_ids": p} for p in bad], GREEDY, use_tqdm=False)
    assert not engine.engine_core.has_unfinished_requests()
    assert not engine.output_processor.states
    assert kv.block_pool.num_free_blocks == kv.num_blocks
    again = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:4]], GREEDY, use_tqdm=False)
    fresh = _llm(tiny_models["qwen2"]).generate([{"prompt_token_ids": p} for p in PROMPTS[:4]], GREEDY,
                                                use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in fresh]


def _waiting(*lengths: int) -> deque:
    return deque(SimpleNamespace(prompt_token_ids=[0] * n, num_computed_tokens=0) for n in lengths)


def test_the_feed_tops_the_queue_up_to_its_lead_and_doubles_it_when_a_step_drains_it():
    waiting = _waiting()
    added = []

    def add(n):
        added.append(n)
        waiting.append(SimpleNamespace(prompt_token_ids=[0] * n, num_computed_tokens=0))
        return n

    feed = RequestFeed([10] * 40, add, waiting, budget_tokens=10)
    feed.top_up()
    assert len(added) == 3  # 3 budgets of 10
    waiting.popleft()
    feed.top_up()
    assert len(added) == 4 and feed.lead == 30
    waiting.clear()  # a step took every waiting request (cached prefixes take less of the budget)
    feed.top_up()
    assert feed.lead == 60 and len(added) == 10
    feed.top_up()  # the lead is met: nothing more
    assert len(added) == 10 and not feed.done


def test_without_a_known_budget_every_request_goes_in_at_once():
    added = []
    feed = RequestFeed(range(7), lambda i: added.append(i) or 1, (), budget_tokens=None)
    feed.top_up()
    assert added == list(range(7)) and feed.done
