"""Step deltas across the process boundary rebuild exactly the engine's own cumulative outputs."""

from __future__ import annotations

import pickle

from pagoda.runtime.core.engine import LLMEngine
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.engine_deltas import DeltaEncoder, OutputAssembler
from pagoda.runtime.sampling_params import SamplingParams


def _view(out) -> dict:
    """Everything the HTTP layer reads of a RequestOutput."""
    return {
        "request_id": out.request_id,
        "prompt": out.prompt,
        "prompt_token_ids": list(out.prompt_token_ids),
        "prompt_logprobs": out.prompt_logprobs,
        "finished": out.finished,
        "num_cached_tokens": out.num_cached_tokens,
        "first_scheduled_time": out.metrics.first_scheduled_time,
        "outputs": [(c.index, c.text, list(c.token_ids), c.logprobs, c.cumulative_logprob, c.finish_reason,
                     c.stop_reason) for c in out.outputs],
    }


def test_deltas_rebuild_the_engines_outputs(tiny_dir):
    engine = LLMEngine.from_engine_args(EngineArgs(tiny_dir, max_model_len=128, device="cpu",
                                                   max_num_batched_tokens=32, max_num_seqs=8))
    tok = engine.tokenizer
    # A stop string that greedy decoding will meet: two characters from the middle of its output.
    engine.add_request("probe", None, tok("Hello there").input_ids,
                       SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    probe = None
    while engine.has_unfinished_requests():
        probe = engine.step() or probe
    text = probe[-1].outputs[0].text
    stop = next(text[i:i + 2] for i in range(8, len(text) - 1) if "\ufffd" not in text[i:i + 2])
    requests = {
        "plain": ("Hello there", SamplingParams(max_tokens=12, temperature=0)),
        "n2-logprobs": ("a b c", SamplingParams(n=2, max_tokens=9, temperature=1.0, seed=3, logprobs=3,
                                                 ignore_eos=True)),
        # 40 prompt tokens in 32-token steps: prompt logprobs arrive over two chunks.
        "prompt-logprobs": ("x" * 40, SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=2)),
        "stop": ("Hello there", SamplingParams(max_tokens=30, temperature=0, stop=[stop], ignore_eos=True)),
        "aborted": ("Hello there", SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)),
    }
    encoder, assembler = DeltaEncoder(), OutputAssembler()
    for rid, (prompt, params) in requests.items():
        ids = tok(prompt).input_ids
        engine.add_request(rid, prompt, ids, params, arrival_time=1.0)
        assembler.add(rid, prompt, ids, params, 1.0)
    seen, finished, steps, last = set(), set(), 0, {}
    while engine.has_unfinished_requests():
        steps += 1
        if steps == 6:
            engine.abort_request("aborted")
        outputs = engine.step()
        deltas = pickle.loads(pickle.dumps(encoder.encode(outputs)))  # as they cross the socket
        rebuilt = assembler.apply(deltas, now=2.0)
        assert [_view(o) for o in rebuilt] == [_view(o) for o in outputs]
        seen.update(o.request_id for o in outputs)
        finished.update(o.request_id for o in outputs if o.finished)
        last.update((o.request_id, o) for o in rebuilt)
    assert finished == seen == set(requests)
    assert len(assembler) == 0 and not encoder._sent  # nothing is kept for finished requests
    # The cases this covers did happen: a stop string, an abort, chunked prompt logprobs, n=2.
    assert last["stop"].outputs[0].stop_reason == stop
    assert last["aborted"].outputs[0].finish_reason == "abort"
    assert len(last["prompt-logprobs"].prompt_logprobs) == len(last["prompt-logprobs"].prompt_token_ids)
    assert [len(c.logprobs) for c in last["n2-logprobs"].outputs] == [9, 9]


def test_forgotten_requests_are_dropped(tiny_dir):
    engine = LLMEngine.from_engine_args(EngineArgs(tiny_dir, max_model_len=64, device="cpu"))
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    encoder, assembler = DeltaEncoder(), OutputAssembler()
    for rid in ("kept", "left"):
        engine.add_request(rid, None, [5, 6, 7], params)
        assembler.add(rid, None, [5, 6, 7], params, 0.0)
    assembler.forget("left")  # its client went away; the engine's outputs for it are not wanted
    got = []
    while engine.has_unfinished_requests():
        got += assembler.apply(encoder.encode(engine.step()), now=0.0)
    assert {o.request_id for o in got} == {"kept"} and got[-1].finished
    assert len(got[-1].outputs[0].token_ids) == 3
