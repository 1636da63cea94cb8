"""Quiet requests (EngineCoreRequest.quiet): the in-process LLM frontend lets the core hold back the
per-step records of a request that wants one final output, scans for no stop string and asks for no
logprobs. Its result must be the same as a request that got every record, including when it is
preempted, runs beside requests that are not quiet, or is aborted part way."""

from __future__ import annotations

from collections import Counter

from pagoda.runtime import SamplingParams
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.llm_engine import LLMEngine
from pagoda.runtime.frontend.processor import child_ids
from pagoda.runtime.sampling_params import RequestOutputKind

from .conftest import make_prompts

FINAL, CUMULATIVE = RequestOutputKind.FINAL_ONLY, RequestOutputKind.CUMULATIVE


def _engine(path: str, **kwargs) -> LLMEngine:
    args = dict(model=path, block_size=8, max_model_len=128, device="cpu", max_num_seqs=8)
    return LLMEngine(EngineArgs(**(args | kwargs)))


def _params(i: int, kind: RequestOutputKind) -> SamplingParams:
    kinds = [
        dict(temperature=0, max_tokens=14, ignore_eos=True),
        dict(temperature=0.8, seed=i, max_tokens=9, n=2),
        dict(temperature=0, max_tokens=11, stop=["e"]),  # a stop string: never quiet
        dict(temperature=0, max_tokens=6, logprobs=1),  # logprobs: never quiet
        dict(temperature=0, max_tokens=12, stop_token_ids=[9]),
    ]
    return SamplingParams(**kinds[i % len(kinds)], output_kind=kind)


def _count_records(engine: LLMEngine) -> Counter:
    """Records per core request id, counted as the core hands them over."""
    counts: Counter = Counter()
    core, orig = engine.engine_core, engine.engine_core.step

    def step(*a, **kw):
        records = orig(*a, **kw)
        counts.update(r.request_id for r in records)
        return records

    core.step = step
    return counts


def _run(engine: LLMEngine, prompts, kind: RequestOutputKind, abort_at: int | None = None) -> dict:
    for i, p in enumerate(prompts):
        engine.add_request(str(i), None, p, _params(i, kind))
    finished, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = [(c.token_ids, c.text, c.finish_reason, c.stop_reason)
                                            for c in out.outputs]
        steps += 1
        if steps == abort_at:
            engine.abort_request(["0", "1"])
    return finished


def test_quiet_results_equal_every_record_results(tiny_models):
    prompts = make_prompts(seed=41)[:10]
    # A small pool: requests are preempted and recomputed along the way. Mixed steps scheduled
    # ahead hold admissions back on a short pool (this one sees no preemption with them), so the
    # preempting schedule is asked for by name.
    small = dict(num_kv_blocks=16, schedule_mixed_ahead=False)
    loud_engine = _engine(tiny_models["llama"], **small)
    loud = _run(loud_engine, prompts, CUMULATIVE)
    engine = _engine(tiny_models["llama"], **small)
    counts = _count_records(engine)
    quiet = _run(engine, prompts, FINAL)
    assert quiet == loud
    assert loud_engine.scheduler.num_preemptions > 0 and engine.scheduler.num_preemptions > 0
    # The quiet ones (kinds 0, 1 and 4) had a record for their first token and one for their end;
    # the others one per token at least.
    for i in range(len(prompts)):
        completions = quiet[str(i)]
        for child, (token_ids, *_) in zip(child_ids(str(i), len(completions)), completions):
            if i % 5 in (0, 1, 4):
                assert 1 <= counts[child] <= min(2, len(token_ids)), (child, counts[child])
            else:
                assert counts[child] >= len(token_ids), (child, counts[child])
    assert sum(len(ids) for i in (0, 5) for ids, *_ in quiet[str(i)]) == 2 * 14  # long enough to hold back

def test_an_aborted_quiet_request_keeps_the_tokens_it_produced(tiny_models):
    prompts = make_prompts(seed=42)[:6]
    loud = _run(_engine(tiny_models["qwen2"]), prompts, CUMULATIVE, abort_at=5)
    quiet = _run(_engine(tiny_models["qwen2"]), prompts, FINAL, abort_at=5)
    assert quiet == loud
    for rid in ("0", "1"):
        assert all(reason == "abort" for _, _, reason, _ in quiet[rid])
        assert all(len(ids) > 1 for ids, _, _, _ in quiet[rid])  # more than the first token's record
