"""The persistent-buffer path: what one step writes into the device buffers, and that padded
decode batches give the very tokens of the unpadded eager path, greedy and sampled alike."""

from __future__ import annotations

import pytest

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.llm_engine import LLMEngine

from .conftest import make_prompts


def _engine(path: str, **kwargs) -> LLMEngine:
    args = dict(model=path, block_size=8, max_model_len=64, device="cpu", max_num_seqs=8)
    return LLMEngine(EngineArgs(**(args | kwargs)))


def _expected_inputs(engine: LLMEngine) -> list[tuple[int, int, int, int, list[int]]]:
    """(token, position, slot, seq_len, block ids) of each running request's next decode token."""
    kv, bs = engine.kv_cache_manager, 8
    rows = []
    for r in engine.scheduler.running:
        pos = r.num_computed_tokens
        blocks = kv.get_block_ids(r.request_id)
        rows.append((r.all_token_ids[pos], pos, blocks[pos // bs] * bs + pos % bs, pos + 1, blocks))
    return rows


def test_a_padded_decode_step_fills_the_buffers(tiny_models):
    # Synchronous scheduling: otherwise the step launched ahead has rewritten the buffers by now.
    engine = _engine(tiny_models["llama"], async_scheduling=False)
    for i, p in enumerate(make_prompts(lengths=[7, 8, 16])):  # block boundaries at 8 and 16
        engine.add_request(str(i), None, p, SamplingParams(temperature=0, max_tokens=4))
    engine.step()  # the three prefills
    engine.scheduler.schedule = _schedule_then_record(engine)
    engine.step()  # one decode each; 3 sequences pad to the bucket of 4
    want = engine.recorded
    b = engine.runner.buffers
    n = len(want)
    assert n == 3
    assert b.input_ids[:n].tolist() == [w[0] for w in want]
    assert b.positions[:n].tolist() == [w[1] for w in want]
    assert b.slot_mapping[:n].tolist() == [w[2] for w in want]
    assert b.seq_lens[:n].tolist() == [w[3] for w in want]
    for i, w in enumerate(want):
        assert b.block_tables[i, : len(w[4])].tolist() == w[4]
    # The padding row: token 0 at position 0, no cache write, no context, one query row.
    assert (b.input_ids[n].item(), b.positions[n].item(), b.slot_mapping[n].item()) == (0, 0, -1)
    assert b.seq_lens[n].item() == 0
    assert b.query_start_loc[:5].tolist() == [0, 1, 2, 3, 4]


def _schedule_then_record(engine: LLMEngine):
    schedule = engine.scheduler.schedule

    def wrapped():
        out = schedule()
        engine.recorded = _expected_inputs(engine)
        return out

    return wrapped


def test_a_mixed_step_samples_only_the_rows_that_end_a_sequence(tiny_models, hf):
    path = tiny_models["mistral"]
    # Synchronous: the buffers then hold the step just run, not the step scheduled ahead of it.
    engine = _engine(path, max_num_batched_tokens=10, async_scheduling=False)
    prompts = make_prompts(lengths=[3, 20])
    for i, p in enumerate(prompts):
        engine.add_request(str(i), None, p, SamplingParams(temperature=0, max_tokens=5))
    engine.step()  # prompt 0 whole (3 tokens) + 7 tokens of prompt 1
    engine.step()  # prompt 0 decodes (row 0), prompt 1 continues with 9 tokens: no logits
    b = engine.runner.buffers
    assert b.query_start_loc[:3].tolist() == [0, 1, 10]
    assert b.logits_indices[:1].tolist() == [0]
    outputs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outputs[o.request_id] = o.outputs[0].token_ids
    for i, p in enumerate(prompts):
        assert outputs[str(i)] == hf.greedy(path, p, max_new_tokens=5)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=8),
        SamplingParams(temperature=0.8, top_p=0.9, top_k=40, min_p=0.02, max_tokens=8),
        SamplingParams(temperature=1.0, seed=11, max_tokens=8),
    ],
    ids=["greedy", "unseeded", "seeded"],
)
def test_padded_decode_gives_the_tokens_of_the_eager_path(tiny_models, params):
    path = tiny_models["llama3"]
    prompts = make_prompts(seed=2, lengths=[1, 5, 8, 9, 15, 17, 24, 30, 2, 11, 6])
    runs = []
    for eager in (True, False):
        # 11 prompts under max_num_seqs=12: the buckets 1, 2, 4, 8, 12 pad every decode batch.
        llm = LLM(path, block_size=8, max_model_len=64, device="cpu", max_num_seqs=12,
                  enforce_eager=eager, seed=3)
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        runs.append([o.outputs[0].token_ids for o in outs])
    assert runs[0] == runs[1]
    assert all(len(t) == 8 for t in runs[0])


def test_logprobs_do_not_depend_on_padding_rows(tiny_models):
    """The sampler sees only the real rows: a padded batch reports the eager batch's logprobs."""
    runs = []
    for eager in (True, False):
        engine = _engine(tiny_models["llama"], max_num_seqs=4, enforce_eager=eager)
        for i, p in enumerate(make_prompts(lengths=[5, 9, 3])):  # 3 sequences pad to 4
            engine.add_request(str(i), None, p, SamplingParams(temperature=0, max_tokens=3, logprobs=2))
        outs = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                outs[o.request_id] = o.outputs[0]
        runs.append({k: (o.token_ids, [{t: e.logprob for t, e in lp.items()} for lp in o.logprobs])
                     for k, o in outs.items()})
    assert runs[0].keys() == {"0", "1", "2"}
    for k in runs[0]:
        assert runs[0][k][0] == runs[1][k][0]
        for a, b in zip(runs[0][k][1], runs[1][k][1]):
            assert a.keys() == b.keys()
            assert all(a[t] == pytest.approx(b[t], abs=1e-5) for t in a)


def test_a_mixed_step_puts_its_one_token_rows_first(tiny_models):
    from pagoda.runtime.core.scheduler import SchedulerOutput

    engine = _engine(tiny_models["llama"], async_scheduling=False)
    prompts = make_prompts(lengths=[7, 12, 9])
    for i, p in enumerate(prompts[:2]):
        engine.add_request(str(i), None, p, SamplingParams(temperature=0, max_tokens=4))
    engine.step()  # both prefills: the two requests now decode
    engine.add_request("2", None, prompts[2], SamplingParams(temperature=0, max_tokens=4))
    running = engine.scheduler.schedule()
    assert [s.num_tokens for s in running.scheduled] == [1, 1, 9]
    mixed = SchedulerOutput(scheduled=[running.scheduled[2], *running.scheduled[:2]])  # prefill first
    batch = engine.runner.builder.build(mixed, engine.kv_cache_manager, None)
    b = engine.runner.buffers
    assert batch.num_decode_seqs == 2
    assert b.query_start_loc[:4].tolist() == [0, 1, 2, 11]
    assert b.positions[:3].tolist() == [7, 12, 0]
    assert [r.request_id for r in batch.sample_requests] == ["0", "1", "2"]
