"""Async scheduling: a step launched before the previous step's tokens are read (a decode step
after a decode step, or a mixed step that admits, prefills and decodes) gives the very same
tokens, stops and finish reasons as synchronous scheduling, and loses no KV block."""

from __future__ import annotations

import pytest

from pagoda.runtime import SamplingParams
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.llm_engine import LLMEngine

from .conftest import make_prompts


def _engine(path: str, async_scheduling: bool, mixed_ahead: bool = False, **kwargs) -> LLMEngine:
    """mixed_ahead: mixed steps scheduled ahead too (--schedule-mixed-ahead), off by default."""
    args = dict(model=path, block_size=8, max_model_len=128, device="cpu", max_num_seqs=8,
                async_scheduling=async_scheduling, schedule_mixed_ahead=mixed_ahead)
    return LLMEngine(EngineArgs(**(args | kwargs)))


def _params(i: int, stop_token: int) -> SamplingParams:
    """A mix of what changes how a request samples and stops, varied by request."""
    kinds = [
        dict(temperature=0, max_tokens=12, ignore_eos=True),
        dict(temperature=0.8, seed=i, max_tokens=9, min_tokens=4),
        dict(temperature=0, max_tokens=15, stop_token_ids=[stop_token]),
        dict(temperature=1.0, seed=100 + i, top_k=20, top_p=0.9, max_tokens=7, n=2),
        dict(temperature=0, max_tokens=6, logprobs=2),
    ]
    return SamplingParams(**kinds[i % len(kinds)])


def _run(engine: LLMEngine, prompts, stop_token: int, abort_at: int | None = None):
    for i, p in enumerate(prompts):
        engine.add_request(str(i), None, p, _params(i, stop_token))
    finished, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        steps += 1
        if steps == abort_at:
            engine.abort_request(["2", "4"])
        for r in engine.scheduler.running:  # waste stays under a block, slots in flight included
            assert 0 <= engine.kv_cache_manager.num_wasted_slots(r) < 8
    kv = engine.kv_cache_manager
    assert kv.block_pool.num_free_blocks == kv.num_blocks and not kv.req_to_blocks
    return {
        rid: [(c.token_ids, c.finish_reason, c.stop_reason) for c in out.outputs]
        for rid, out in sorted(finished.items())
    }


def _count_ahead_launches(engine: LLMEngine) -> list[int]:
    launches = [0]
    launch = engine.runner.launch

    def counting(sched, kv, previous=None):
        launches[0] += sched.ahead or sched.mixed_ahead
        return launch(sched, kv, previous)

    engine.runner.launch = counting
    return launches


def _count_launch_kinds(engine: LLMEngine) -> dict[str, int]:
    """Launches by kind: decode ahead, mixed ahead (with and without prompt rows), synchronous."""
    kinds = {"decode_ahead": 0, "mixed_ahead": 0, "mixed_ahead_prefill": 0, "sync": 0}
    launch = engine.runner.launch

    def counting(sched, kv, previous=None):
        if sched.ahead:
            kinds["decode_ahead"] += 1
        elif sched.mixed_ahead:
            kinds["mixed_ahead"] += 1
            kinds["mixed_ahead_prefill"] += any(not item.fed for item in sched.scheduled)
        else:
            kinds["sync"] += 1
        return launch(sched, kv, previous)

    engine.runner.launch = counting
    return kinds


@pytest.mark.parametrize("mixed_ahead", [False, True])
def test_async_scheduling_gives_the_synchronous_tokens(tiny_models, mixed_ahead):
    prompts = make_prompts(seed=31)[:10]
    # A stop token the greedy requests actually produce: the 4th token of request 2's sync run.
    probe = _engine(tiny_models["llama"], False)
    probe.add_request("p", None, prompts[2], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    while probe.has_unfinished_requests():
        outs = probe.step()
        if outs and outs[-1].finished:
            stop_token = outs[-1].outputs[0].token_ids[3]
    sync = _run(_engine(tiny_models["llama"], False, max_num_seqs=16), prompts, stop_token)
    engine = _engine(tiny_models["llama"], True, mixed_ahead, max_num_seqs=16)
    launches = _count_ahead_launches(engine)
    assert _run(engine, prompts, stop_token) == sync
    assert launches[0] > 10  # the ahead path ran, not just the fallback
    assert sync["2"][0][1:] == ("stop", stop_token)  # a row scheduled ahead was dropped


@pytest.mark.parametrize("mixed_ahead", [False, True])
def test_requests_waiting_for_a_seat_get_the_same_tokens(tiny_models, mixed_ahead):
    # Ten requests (twelve sequences) through four seats: admissions alternate with steps ahead.
    prompts = make_prompts(seed=34)[:10]
    sync = _run(_engine(tiny_models["mistral"], False, max_num_seqs=4), prompts, stop_token=9)
    engine = _engine(tiny_models["mistral"], True, mixed_ahead, max_num_seqs=4)
    launches = _count_ahead_launches(engine)
    assert _run(engine, prompts, stop_token=9) == sync
    assert launches[0] > 5


@pytest.mark.parametrize("mixed_ahead", [False, True])
def test_a_short_pool_preempts_the_same_way(tiny_models, mixed_ahead):
    # 18 blocks of 8 slots for 6 requests that grow past them: preemptions, and steps ahead that
    # do not fit and fall back to a synchronous schedule without holding blocks early.
    prompts = make_prompts(seed=35, lengths=[20, 9, 17, 30, 12, 25])
    sync_engine = _engine(tiny_models["llama"], False, num_kv_blocks=18)
    sync = _run(sync_engine, prompts, stop_token=11)
    engine = _engine(tiny_models["llama"], True, mixed_ahead, num_kv_blocks=18)
    launches = _count_ahead_launches(engine)
    assert _run(engine, prompts, stop_token=11) == sync
    assert sync_engine.scheduler.num_preemptions > 0 and engine.scheduler.num_preemptions > 0
    assert launches[0] > 0


@pytest.mark.parametrize("mixed_ahead", [False, True])
def test_abort_while_a_step_is_in_flight(tiny_models, mixed_ahead):
    prompts = make_prompts(seed=32)[:8]
    sync = _run(_engine(tiny_models["qwen2"], False), prompts, stop_token=7, abort_at=3)
    engine = _engine(tiny_models["qwen2"], True, mixed_ahead)
    launches = _count_ahead_launches(engine)
    got = _run(engine, prompts, stop_token=7, abort_at=3)
    assert launches[0] > 0
    assert got["2"][0][1] == got["4"][0][1] == "abort"
    # Requests not aborted are untouched by the abort.
    assert {k: v for k, v in got.items() if k not in ("2", "4")} == {
        k: v for k, v in sync.items() if k not in ("2", "4")
    }


def test_no_ahead_step_when_sampling_needs_history(tiny_models):
    engine = _engine(tiny_models["llama"], True, max_num_seqs=2)
    launches = _count_ahead_launches(engine)
    for i, p in enumerate(make_prompts(seed=33)[:2]):
        engine.add_request(str(i), None, p, SamplingParams(temperature=0, max_tokens=8, repetition_penalty=1.3))
    while engine.has_unfinished_requests():
        engine.step()
    assert launches[0] == 0  # penalties read the host history: never ahead


def test_a_step_ahead_that_does_not_fit_takes_no_block(tiny_models):
    engine = _engine(tiny_models["llama"], False, num_kv_blocks=20)  # the test schedules by hand
    for i, p in enumerate(make_prompts(seed=36, lengths=[7, 7, 7])):
        engine.add_request(str(i), None, p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()  # prefills: 7 tokens computed, one sampled, each in its first block
    kv, scheduler = engine.kv_cache_manager, engine.scheduler
    current = scheduler.schedule()  # decode of position 7: still the first block
    kv.block_pool.get_new_blocks(kv.block_pool.num_free_blocks - 2)  # leave 2 free; 3 are needed
    before = {r.request_id: len(kv.req_to_blocks[r.request_id]) for r in scheduler.running}
    assert scheduler.schedule_ahead(current) is None
    assert {r.request_id: len(kv.req_to_blocks[r.request_id]) for r in scheduler.running} == before
    assert all(r.num_in_flight_tokens == 0 for r in scheduler.running)


def test_long_prefill_token_threshold_caps_chunks_and_keeps_tokens(tiny_models):
    """A capped prefill chunk spreads a long prompt over more steps while the decodes beside it
    keep running, and every request still gets the tokens of the uncapped engine."""
    prompts = make_prompts(3, lengths=(5, 90, 7, 60))
    path = tiny_models["llama"]
    expected = _run(_engine(path, True), prompts, stop_token=7)
    capped = _engine(path, True, long_prefill_token_threshold=16)
    chunks = []
    launch = capped.runner.launch

    def recording(sched, kv, previous=None):
        chunks.append([item.num_tokens for item in sched.scheduled])
        return launch(sched, kv, previous)

    capped.runner.launch = recording
    assert _run(capped, prompts, stop_token=7) == expected
    assert max(max(step) for step in chunks) == 16
    # The 90-token prompt took at least 6 chunks, and decodes ran in the steps beside them.
    assert sum(1 for step in chunks if 16 in step and 1 in step) >= 3


def test_full_seats_that_only_length_can_free_keep_every_decode_step_ahead(tiny_models):
    """W4's shape: more requests than seats, ignore_eos, one length. While every seat is taken and
    only a length stop can free one, a normal schedule would admit nobody, so the steps stay
    ahead (the GPU never waits for the host) except where a wave ends; the tokens are the
    synchronous ones. With requests an EOS could end, the alternation stays (the test above)."""
    prompts = make_prompts(seed=36)[:10]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

    def run(async_scheduling: bool):
        engine = _engine(tiny_models["qwen2"], async_scheduling, max_num_seqs=4)
        kinds = []
        launch = engine.runner.launch

        def counting(sched, kv, previous=None):
            if sched.total_num_tokens == len(sched.scheduled):
                kinds.append(sched.ahead or sched.mixed_ahead)
            return launch(sched, kv, previous)

        engine.runner.launch = counting
        for i, p in enumerate(prompts):
            engine.add_request(str(i), None, p, params)
        finished = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out.outputs[0].token_ids
        return finished, kinds

    sync, _ = run(False)
    got, kinds = run(True)
    assert got == sync
    # Three waves of four seats (10 requests): a synchronous decode step only where one ends.
    assert kinds.count(False) <= 4 and kinds.count(True) >= 20, kinds


def test_admissions_and_prefill_chunks_are_scheduled_ahead(tiny_models):
    """More requests than seats, prompts longer than the step budget: steps ahead admit requests,
    continue prefill chunks and feed the decodes sampled in flight, and the tokens (seeded
    sampling and stop tokens included) are the synchronous run's."""
    prompts = make_prompts(seed=37, lengths=[40, 9, 33, 70, 12, 25, 51, 18, 7, 44])
    kwargs = dict(max_num_seqs=4, max_num_batched_tokens=32)
    sync = _run(_engine(tiny_models["llama"], False, **kwargs), prompts, stop_token=11)
    engine = _engine(tiny_models["llama"], True, mixed_ahead=True, **kwargs)
    kinds = _count_launch_kinds(engine)
    assert _run(engine, prompts, stop_token=11) == sync
    assert kinds["mixed_ahead_prefill"] >= 5, kinds
    # Every launch but the first (nothing in flight yet) and the rare fallback overlaps the one before.
    assert kinds["sync"] <= 3, kinds


def test_mixed_steps_ahead_off_keeps_them_synchronous(tiny_models):
    prompts = make_prompts(seed=38, lengths=[30, 9, 21])
    engine = _engine(tiny_models["llama"], True, mixed_ahead=False, max_num_batched_tokens=16)
    kinds = _count_launch_kinds(engine)
    got = _run(engine, prompts, stop_token=11)
    assert kinds["mixed_ahead"] == 0 and kinds["sync"] >= 3, kinds
    assert got == _run(_engine(tiny_models["llama"], False, max_num_batched_tokens=16), prompts, stop_token=11)
