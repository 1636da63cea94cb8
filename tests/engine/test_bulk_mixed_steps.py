"""The host path's numpy code against the row-by-row code it replaced, for the steps that admit
prompts beside decodes and the steps where requests finish: a mixed step's batch (normal, and
scheduled ahead with fed rows) stages the same inputs as the row-by-row builder, the block-table
mirror holds every request's blocks as rows shift and grow, a decode allocation that skips rows by
their room leaves the cache as per-request allocation does, step after step, requests that stop
together leave the running list as one finish_request each does, and rows are found among the
previous step's by identity."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pagoda.runtime import SamplingParams
from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.request import Request, RequestStatus
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.llm_engine import LLMEngine
from pagoda.runtime.worker.block_tables import BlockTables
from pagoda.runtime.worker.host_to_device import positions_in
from pagoda.runtime.worker.input_batch import BatchBuilder, StageLayout, StepBatch, _token_at, batch_order

from .conftest import make_prompts, make_shared_prefix_prompts
from .test_bulk_host_paths import _run


def _mixed_rows_by_row(self, sched, kv, ahead, pad_seqs, pad_tokens):
    """BatchBuilder._mixed_rows as it was, row by row (the reference)."""
    scheduled, decodes = batch_order(sched.scheduled)
    bs = self.block_size
    num_seqs = len(scheduled)
    # A step scheduled ahead is one decode token per request by construction.
    num_tokens = num_seqs if sched.ahead else sum(s.num_tokens for s in scheduled)
    padded = pad_seqs or num_seqs
    padded_tokens = pad_tokens or num_tokens + (padded - num_seqs)
    width = self.tables.sync([s.request for s in scheduled], kv)
    table = self.tables.table

    # Sampled rows first, on the host: whether they are all rows decides the layout.
    batch = StepBatch(num_tokens, num_seqs, padded, padded_tokens, 0, 0)
    logits_rows: list[int] = []
    seq_lens: list[int] = []
    row0 = 0
    mixed_ahead = sched.mixed_ahead
    for item in scheduled:
        r, start = item.request, item.request.num_computed_tokens + ahead + item.offset
        end = start + item.num_tokens
        seq_lens.append(end)
        if end == r.num_tokens + ahead + item.fed:
            logits_rows.append(row0 + item.num_tokens - 1)
            batch.sample_requests.append(r)
            if mixed_ahead:
                batch.sample_pending.append(int(item.fed))
        if r.wants_prompt_logprobs:
            # Row p predicts prompt token p + 1; take the ones not reported yet.
            first = max(start + 1, 1 + r.num_prompt_logprobs)
            last = min(end + 1, r.num_prompt_tokens)
            if first < last:
                batch.prompt_rows.append((r, row0 + first - 1 - start, first, last))
        row0 += item.num_tokens
    batch.max_query_len = max(s.num_tokens for s in scheduled)
    batch.num_decode_seqs = len(decodes)
    batch.max_seq_len = max(seq_lens)
    batch.sample_all_rows = len(logits_rows) == num_seqs == num_tokens
    layout = batch.layout = StageLayout(
        padded_tokens, padded, 0 if batch.sample_all_rows else len(logits_rows), num_seqs, width
    )
    st = self.buffers.next_stage()
    ids = st[layout.ids : layout.ids + padded_tokens]
    pos = st[layout.pos : layout.pos + padded_tokens]
    slots = st[layout.slots : layout.slots + padded_tokens]
    qsl = st[layout.qsl : layout.qsl + padded + 1]

    # The one-token rows lead (batch_order): row i is scheduled[i]; written as whole columns
    # (W4 admits prompts beside up to 1,024 of them, and the GPU waits for this step).
    nd = len(decodes)
    if nd:
        starts = [s.request.num_computed_tokens + ahead + s.offset for s in scheduled[:nd]]
        if ahead:
            ids[:nd] = 0  # placeholders for the in-flight tokens
        else:  # (0 too for a fed row: the runner copies its token in)
            ids[:nd] = [0 if s.fed else _token_at(s.request, start) for s, start in zip(scheduled[:nd], starts)]
            if mixed_ahead:
                batch.fed_rows = [(i, s.request) for i, s in enumerate(scheduled[:nd]) if s.fed]
        p = np.array(starts, dtype=np.int64)
        pos[:nd] = p
        slots[:nd] = table[self._rows[:nd], p // bs].astype(np.int64) * bs + p % bs
        qsl[: nd + 1] = self._rows[: nd + 1]
    row0 = nd
    qsl[0] = 0
    for i in range(nd, num_seqs):
        item = scheduled[i]
        r, n = item.request, item.num_tokens
        start = r.num_computed_tokens + ahead + item.offset
        p = np.arange(start, start + n)
        ids[row0 : row0 + n] = r.token_ids_slice(start, start + n)
        pos[row0 : row0 + n] = p
        slots[row0 : row0 + n] = table[i, p // bs].astype(np.int64) * bs + p % bs
        row0 += n
        qsl[i + 1] = row0
    st[layout.seq_lens : layout.seq_lens + num_seqs] = seq_lens
    self._pad(st, layout, num_tokens, num_seqs)
    if layout.num_logits:
        st[layout.logits : layout.logits + layout.num_logits] = logits_rows
    st[layout.table : layout.end].reshape(num_seqs, width)[:] = table[:num_seqs, :width]
    return batch


def _engine(path: str, **kwargs) -> LLMEngine:
    args = dict(model=path, block_size=8, max_model_len=128, device="cpu", max_num_seqs=8,
                max_num_batched_tokens=64)
    return LLMEngine(EngineArgs(**(args | kwargs)))


FIELDS = ("num_tokens", "num_seqs", "padded_seqs", "padded_tokens", "max_query_len", "max_seq_len",
          "num_decode_seqs", "sample_all_rows", "prompt_rows", "sample_pending")


@pytest.mark.parametrize("mixed_ahead", [True, False])
def test_numpy_mixed_steps_stage_what_the_row_by_row_builder_stages(tiny_models, monkeypatch, mixed_ahead):
    checked = {"ahead": 0, "fed": 0, "prompt_rows": 0}
    mixed_rows = BatchBuilder._mixed_rows

    def both(self, sched, kv, ahead, pad_seqs, pad_tokens):
        batch = mixed_rows(self, sched, kv, ahead, pad_seqs, pad_tokens)
        got = self.buffers.host_stages[self.buffers.turn].numpy()[: batch.layout.end].copy()
        for i, item in enumerate(batch_order(sched.scheduled)[0]):
            ids = kv.get_block_ids(item.request.request_id)
            assert self.tables.table[i, : len(ids)].tolist() == ids
        ref = _mixed_rows_by_row(self, sched, kv, ahead, pad_seqs, pad_tokens)
        want = self.buffers.host_stages[self.buffers.turn].numpy()[: ref.layout.end]
        assert ref.layout == batch.layout
        np.testing.assert_array_equal(got, want)
        for name in FIELDS:
            assert getattr(ref, name) == getattr(batch, name), name
        assert all(a is b for a, b in zip(ref.sample_requests, batch.sample_requests, strict=True))
        fed = [] if batch.fed_rows is None else list(zip(batch.fed_rows.tolist(), map(id, batch.fed_requests)))
        assert [(i, id(r)) for i, r in ref.fed_rows or []] == fed
        checked["ahead"] += sched.mixed_ahead
        checked["fed"] += bool(batch.fed_requests)
        checked["prompt_rows"] += bool(batch.prompt_rows)
        return batch

    monkeypatch.setattr(BatchBuilder, "_mixed_rows", both)
    path = tiny_models["llama"]
    prompts = make_prompts(lengths=[1, 5, 8, 9, 16, 17, 31, 40, 47, 64, 70, 90])
    for async_scheduling in (True, False):
        # Few blocks: requests are preempted and recomputed, so rows change owners often.
        _run(_engine(path, async_scheduling=async_scheduling, schedule_mixed_ahead=mixed_ahead,
                     num_kv_blocks=40), prompts)
        _run(_engine(path, async_scheduling=async_scheduling, schedule_mixed_ahead=mixed_ahead),
             make_shared_prefix_prompts())
        # Greedy without logprobs: nothing keeps a mixed step from being scheduled ahead.
        _run(_engine(path, async_scheduling=async_scheduling, schedule_mixed_ahead=mixed_ahead), prompts,
             lambda i: SamplingParams(temperature=0, max_tokens=10 + i, ignore_eos=True))
    assert checked["prompt_rows"] > 0
    if mixed_ahead:
        assert checked["ahead"] > 5 and checked["fed"] > 5


def test_block_table_mirror_follows_rows_that_shift_grow_and_return():
    """Random batches over a fixed set of requests: rows finish (those behind shift), come back
    past the end of a shorter batch (a list then sits in two rows), grow, and are new."""
    rng = random.Random(0)
    kv = KVCacheManager(4000, 4)
    requests = [Request(str(i), [5] * rng.randrange(1, 30), SamplingParams(max_tokens=50), None, 50, 4)
                for i in range(40)]
    for r in requests:
        assert kv.allocate_slots(r, r.num_tokens) is not None
        r.num_computed_tokens = r.num_tokens
    tables = BlockTables(64, 64)
    for _ in range(300):
        batch = rng.sample(requests, rng.randrange(1, 40))
        if rng.random() < 0.5:
            batch.sort(key=lambda r: int(r.request_id))
        for r in rng.sample(batch, min(len(batch), 5)):
            r.append_output_token(7)
            if kv.allocate_slots(r, 1) is not None:
                r.num_computed_tokens += 1
        width = tables.sync(batch, kv)
        want = [kv.get_block_ids(r.request_id) for r in batch]
        assert width == max(map(len, want))
        for i, ids in enumerate(want):
            assert tables.table[i, : len(ids)].tolist() == ids
            assert tables.row_len[i] == len(ids)
        if rng.random() < 0.05:  # preempted and readmitted: a new list for the same request
            r = rng.choice(requests)
            kv.free(r)
            assert kv.allocate_slots(r, r.num_tokens - 1) is not None
            r.num_computed_tokens = r.num_tokens - 1


def test_block_table_mirror_of_the_same_rows_sees_a_list_replaced_by_a_free():
    """The same requests in the same rows as the last sync keep their rows' lists (no lookup),
    unless a request was freed and allocated again since: its new list must be read. That includes
    a row past a shorter batch in between, whose request was replaced while it sat outside."""
    kv = KVCacheManager(400, 4)
    a, x = (Request(i, [5] * 9, SamplingParams(max_tokens=50), None, 50, 4) for i in "ax")
    for r in (a, x):
        assert kv.allocate_slots(r, r.num_tokens) is not None
        r.num_computed_tokens = r.num_tokens
    tables = BlockTables(8, 16)

    def check(batch):
        tables.sync(batch, kv)
        for i, r in enumerate(batch):
            ids = kv.get_block_ids(r.request_id)
            assert tables.table[i, : len(ids)].tolist() == ids and tables.row_len[i] == len(ids)

    check([a, x])
    for _ in range(6):  # the same rows, growing a block every fourth token
        for r in (a, x):
            r.append_output_token(7)
            assert kv.allocate_slots(r, 1) is not None
            r.num_computed_tokens += 1
        check([a, x])
    kv.free(x)  # preempted: a new list, other blocks, for the same request in the same row
    assert kv.allocate_slots(a, 0) is not None and kv.allocate_slots(Request("y", [1] * 8, SamplingParams(), None, 8, 4), 8)
    assert kv.allocate_slots(x, x.num_tokens - 1) is not None
    check([a, x])
    check([a])
    kv.free(x)
    assert kv.allocate_slots(Request("z", [1] * 8, SamplingParams(), None, 8, 4), 8)
    assert kv.allocate_slots(x, x.num_tokens - 1) is not None
    check([a])  # x replaced while outside the batch
    check([a, x])


def _kv_state(kv: KVCacheManager) -> tuple:
    pool = kv.block_pool
    return ({rid: [b.block_id for b in blocks] for rid, blocks in kv.req_to_blocks.items()},
            dict(kv.num_cached_blocks), list(pool.free_queue), {h: b.block_id for h, b in pool.cached.items()},
            [b.ref_cnt for b in pool.blocks])


@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_allocation_by_room_leaves_the_cache_as_per_request_allocation_step_after_step(block_size):
    """allocate_decode_slots, which skips a row while its tokens stay under its room_end, against
    allocate_slots per request, over whole decodes (blocks fill, are cached, run out), in one step
    and ahead (two tokens, one in flight), with a reserve."""
    for seed in range(4):
        rng = random.Random(seed)
        prompts = [[rng.randrange(5, 50) for _ in range(rng.randrange(1, 40))] for _ in range(10)]
        prompts += prompts[:3]  # shared prefixes: cached blocks hit and stay private
        runs = []
        for bulk in (True, False):
            kv = KVCacheManager(60 + 10 * seed, block_size)
            reqs = [Request(str(i), list(p), SamplingParams(max_tokens=200), None, 200, block_size)
                    for i, p in enumerate(prompts)]
            running, setup_rng = [], random.Random(seed)
            for r in reqs:
                blocks, num_computed = kv.get_computed_blocks(r)
                if kv.allocate_slots(r, r.num_tokens - num_computed, blocks) is None:
                    break
                r.num_computed_tokens = r.num_tokens
                r.append_output_token(setup_rng.randrange(5, 50))
                running.append(r)
            trace, step_rng = [], random.Random(seed)
            for _ in range(60):
                new, reserve = step_rng.choice([(1, 0), (2, 0), (2, 3)])
                if bulk:
                    ok = kv.allocate_decode_slots(running, new, reserve=reserve)
                else:
                    fits = sum(kv.num_new_blocks(r, new) for r in running) + reserve <= kv.block_pool.num_free_blocks
                    if fits:
                        for r in running:
                            assert kv.allocate_slots(r, new) is not None
                    ok = fits
                trace.append((ok, _kv_state(kv)))
                if not ok:
                    kv.free(running.pop())
                    continue
                for r in running:
                    r.num_computed_tokens += 1
                    r.append_output_token(step_rng.randrange(5, 50))
            runs.append(trace)
        assert runs[0] == runs[1]


def test_requests_that_stop_together_leave_the_scheduler_as_finishing_each_does():
    def setup():
        kv = KVCacheManager(500, 4)
        s = Scheduler(kv, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=100)
        for i in range(12):
            s.add_request(Request(str(i), [5 + i] * (3 + i), SamplingParams(max_tokens=50), None, 50, 4))
        s.schedule()
        return s

    rng = random.Random(3)
    for _ in range(20):
        a, b = setup(), setup()
        picks = sorted(rng.sample(range(12), rng.randrange(1, 12)), key=lambda _: rng.random())
        for s in (a, b):
            for i in picks:
                s.requests[str(i)].status = RequestStatus.FINISHED_LENGTH_CAPPED
        a._finish_stopped([a.requests[str(i)] for i in picks])
        for i in picks:
            r = b.requests[str(i)]
            b.finish_request(r, r.status)
        assert [r.request_id for r in a.running] == [r.request_id for r in b.running]
        assert sorted(a.requests) == sorted(b.requests)
        assert _kv_state(a.kv) == _kv_state(b.kv)


def test_positions_in_finds_rows_by_identity():
    rng = random.Random(1)
    within = [object() for _ in range(50)]
    for _ in range(40):
        items = rng.sample(within, rng.randrange(0, 50))
        if rng.random() < 0.5:
            items.sort(key=within.index)  # in order: the walk
        assert positions_in(items, within) == [within.index(x) for x in items]
    for items in ([object()], [within[3], object()], [within[3], within[1], object()]):
        with pytest.raises(KeyError):
            positions_in(items, within)
