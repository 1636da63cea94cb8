"""The host path's bulk code against the per-request code it replaced: a decode step built with
numpy over whole columns stages the same inputs as the row-by-row builder, the block-table mirror
holds every request's blocks, allocating a decode step's slots in one pass leaves the KV cache as
per-request allocation does, the scheduler's inlined EOS/length stops end requests as
_check_stop does, token for token, and a step without logprobs gets the records (and counters)
the general record builder gives."""

from __future__ import annotations

import random

import numpy as np

from pagoda.runtime import SamplingParams
from pagoda.runtime.core.engine_core import EngineCore
from pagoda.runtime.core.kv.block_hash import hash_full_blocks
from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.request import Request
from pagoda.runtime.core.scheduler import ScheduledRequest, SchedulerOutput
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.llm_engine import LLMEngine
from pagoda.runtime.worker.input_batch import BatchBuilder

from .conftest import make_prompts, make_shared_prefix_prompts


def _engine(path: str, **kwargs) -> LLMEngine:
    args = dict(model=path, block_size=8, max_model_len=128, device="cpu", max_num_seqs=8)
    return LLMEngine(EngineArgs(**(args | kwargs)))


def _params(i: int) -> SamplingParams:
    kinds = [
        dict(temperature=0, max_tokens=20, ignore_eos=True),
        dict(temperature=0.8, seed=i, max_tokens=13),
        dict(temperature=1.0, seed=i, max_tokens=11, n=2),
        dict(temperature=0, max_tokens=9, logprobs=1, prompt_logprobs=1),
    ]
    return SamplingParams(**kinds[i % len(kinds)])


def _run(engine: LLMEngine, prompts, params=_params) -> dict:
    for i, p in enumerate(prompts):
        engine.add_request(str(i), None, p, params(i))
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = [(c.token_ids, c.finish_reason) for c in out.outputs]
    return finished


def _check_decode_steps(monkeypatch) -> list[int]:
    """Every decode step the numpy path builds is built again row by row; both must stage the
    same array and describe the same batch. Also checks the table mirror against the KV manager."""
    checked = [0]
    decode_rows = BatchBuilder._decode_rows

    def both(self, requests, kv, ahead, pad_seqs, pad_tokens):
        batch = decode_rows(self, requests, kv, ahead, pad_seqs, pad_tokens)
        if batch is None:
            return None
        got = self.buffers.host_stages[self.buffers.turn].numpy()[: batch.layout.end].copy()
        sched = SchedulerOutput([ScheduledRequest(r, 1) for r in requests], ahead=bool(ahead))
        ref = self._mixed_rows(sched, kv, ahead, pad_seqs, pad_tokens)
        want = self.buffers.host_stages[self.buffers.turn].numpy()[: ref.layout.end]
        assert ref.layout == batch.layout
        np.testing.assert_array_equal(got, want)
        for name in ("num_tokens", "num_seqs", "padded_seqs", "padded_tokens", "max_query_len", "max_seq_len",
                     "num_decode_seqs", "sample_all_rows", "prompt_rows"):
            assert getattr(ref, name) == getattr(batch, name), name
        assert all(a is b for a, b in zip(ref.sample_requests, batch.sample_requests, strict=True))
        for i, r in enumerate(requests):
            ids = kv.get_block_ids(r.request_id)
            assert self.tables.table[i, : len(ids)].tolist() == ids
        checked[0] += 1
        return batch

    monkeypatch.setattr(BatchBuilder, "_decode_rows", both)
    return checked


def test_numpy_decode_steps_stage_what_the_row_by_row_builder_stages(tiny_models, monkeypatch):
    checked = _check_decode_steps(monkeypatch)
    path = tiny_models["llama"]
    prompts = make_prompts(lengths=[1, 5, 8, 9, 16, 17, 31, 40, 47, 64])
    for async_scheduling in (True, False):
        # Few blocks: requests are preempted and recomputed, so rows change owners often.
        _run(_engine(path, async_scheduling=async_scheduling, num_kv_blocks=40), prompts)
        _run(_engine(path, async_scheduling=async_scheduling), make_shared_prefix_prompts())
    assert checked[0] > 50


def _requests(seed: int, kv: KVCacheManager) -> list[Request]:
    """Running requests at random points of their decode, with their slots allocated."""
    rng = random.Random(seed)
    out = []
    for i in range(12):
        prompt = [rng.randrange(5, 500) for _ in range(rng.randrange(1, 40))]
        r = Request(str(i), prompt, SamplingParams(max_tokens=100), None, 100, kv.block_size)
        assert kv.allocate_slots(r, len(prompt)) is not None
        r.num_computed_tokens = len(prompt)
        for _ in range(rng.randrange(0, 20)):
            r.append_output_token(rng.randrange(5, 500))
            assert kv.allocate_slots(r, 1) is not None
            r.num_computed_tokens += 1
        r.append_output_token(rng.randrange(5, 500))  # sampled, not yet computed
        out.append(r)
    return out


def _kv_state(kv: KVCacheManager) -> tuple:
    pool = kv.block_pool
    return ({rid: [b.block_id for b in blocks] for rid, blocks in kv.req_to_blocks.items()},
            dict(kv.num_cached_blocks), list(pool.free_queue), {h: b.block_id for h, b in pool.cached.items()},
            [b.ref_cnt for b in pool.blocks])


def test_one_pass_decode_allocation_leaves_the_cache_as_per_request_allocation(tmp_path):
    for seed in range(6):
        for num_blocks in (200, 60):  # plenty, and short (then all or none)
            bulk, single = KVCacheManager(num_blocks, 4), KVCacheManager(num_blocks, 4)
            try:
                a, b = _requests(seed, bulk), _requests(seed, single)
            except AssertionError:
                continue  # this draw does not fit the small pool at all
            assert _kv_state(bulk) == _kv_state(single)
            ok = bulk.allocate_decode_slots(a, 2)
            fits = sum(single.num_new_blocks(r, 2) for r in b) <= single.block_pool.num_free_blocks
            if fits:
                for r in b:
                    assert single.allocate_slots(r, 2) is not None
            assert ok == fits
            assert _kv_state(bulk) == _kv_state(single)


def test_inlined_eos_and_length_stops_end_requests_as_check_stop(tiny_models):
    path = tiny_models["llama"]
    prompts = make_prompts(lengths=[3, 9, 17, 30])
    # An EOS id the tiny model actually emits: the most common token of a first greedy run.
    probe = _engine(path)
    outs = _run(probe, prompts)
    tokens = [t for completions in outs.values() for ids, _ in completions for t in ids]
    eos = max(set(tokens), key=tokens.count)

    def run(inline: bool) -> dict:
        engine = _engine(path)
        engine.processor.eos_token_id = eos
        add = engine.engine_core.scheduler.add_request

        def add_request(request):
            if not inline:
                request.simple_stops = False  # every row through Scheduler._check_stop
            add(request)

        engine.engine_core.scheduler.add_request = add_request
        for i, p in enumerate(prompts):
            engine.add_request(str(i), None, p, SamplingParams(temperature=0.9, seed=i, max_tokens=12, n=2))
        finished = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = [(c.token_ids, c.finish_reason, c.stop_reason)
                                                for c in out.outputs]
        return finished

    inline, reference = run(True), run(False)
    assert inline == reference
    reasons = {reason for completions in inline.values() for _, reason, _ in completions}
    assert reasons == {"stop", "length"}  # both stops were met


def test_plain_step_records_are_the_general_builders(tiny_models, monkeypatch):
    """EngineCore._plain_outputs (a step without logprobs) against _outputs' general loop, given a
    logprobs map that names no request (so that loop runs and finds none): the same records, the
    same prompt and generation token counts, over prefills, decodes, finishes and preemptions."""
    plain, checked = EngineCore._plain_outputs, [0]

    def both(self, updated):
        counts = (self.prompt_tokens, self.generation_tokens)
        got = plain(self, updated)
        after = (self.prompt_tokens, self.generation_tokens)
        self.prompt_tokens, self.generation_tokens = counts
        want = EngineCore._outputs(self, updated, {"no such request": None}, {})
        assert got == want and type(got[0]) is type(want[0]) if got else got == want
        assert (self.prompt_tokens, self.generation_tokens) == after
        checked[0] += bool(got)
        return got

    monkeypatch.setattr(EngineCore, "_plain_outputs", both)
    prompts = make_prompts(lengths=[1, 5, 8, 9, 16, 17, 31, 40])
    engine = _engine(tiny_models["qwen2"], num_kv_blocks=30)  # short: some are preempted
    for i, p in enumerate(prompts):
        engine.add_request(str(i), None, p, SamplingParams(temperature=0.8, seed=i, max_tokens=12, n=1 + i % 2))
    while engine.has_unfinished_requests():
        engine.step()
    assert checked[0] > 10 and engine.engine_core.scheduler.num_preemptions > 0


def test_prompt_blocks_hashed_at_admission_hit_the_cache_as_hashed_on_arrival(tiny_models, monkeypatch):
    """The engine core's requests hash their prompt blocks when first scheduled (defer_hashes),
    not on arrival: the same hashes, the same prefix-cache queries and hits, the same tokens, with
    preemptions (their requests come back already hashed) and n > 1 siblings."""
    from pagoda.runtime.core.scheduler import Scheduler

    def run(eager: bool):
        if eager:
            add = Scheduler.add_request

            def hashed_on_arrival(self, request):
                request._update_block_hashes()
                assert request.block_hashes or request.num_tokens < request.block_size
                add(self, request)

            monkeypatch.setattr(Scheduler, "add_request", hashed_on_arrival)
        engine = _engine(tiny_models["llama"], num_kv_blocks=40)
        hashes = {}
        admit = engine.engine_core.scheduler.kv.get_computed_blocks

        def seen(request):
            hashes[request.request_id] = list(request.block_hashes)
            return admit(request)

        engine.engine_core.scheduler.kv.get_computed_blocks = seen
        out = _run(engine, make_shared_prefix_prompts() + make_prompts(lengths=[9, 17, 33, 40]))
        monkeypatch.undo()
        kv = engine.kv_cache_manager
        return out, hashes, (kv.prefix_cache_queries, kv.prefix_cache_hits), engine.scheduler.num_preemptions

    deferred, eager = run(False), run(True)
    assert deferred == eager
    assert deferred[2][1] > 0 and deferred[3] > 0  # the cache was hit, and requests were preempted


def test_block_hashes_grown_token_by_token_are_the_hashes_of_the_whole_sequence():
    """Output blocks hashed one at a time as decode tokens fill them (the one-digest path), and
    blocks that straddle the prompt's end or come several at once (the general path), give the
    chained digests of hashing every token at once."""
    for prompt_len, salt in ((3, b""), (16, b""), (37, b"s"), (64, b"s")):
        r = Request("r", list(range(100, 100 + prompt_len)), SamplingParams(max_tokens=200), None, 200, 16,
                    cache_salt=salt)
        for t in range(90):
            if t == 40:
                r.output_token_ids += [7] * 20  # several blocks at once (as after a preemption)
                r._update_block_hashes()
            r.append_output_token(1000 + t)
            tokens = r.all_token_ids
            full = len(tokens) // 16 * 16
            assert r.block_hashes == hash_full_blocks(None, tokens[:full], 16, salt)
