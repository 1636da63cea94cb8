"""The overlapped step: a step's records turned into outputs during the next step, lazy
detokenization, final-only outputs and the decode fast path of the KV manager, each checked
against the path it replaces."""

from __future__ import annotations

from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.request import Request
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.llm_engine import LLMEngine
from pagoda.runtime.sampling_params import RequestOutputKind, SamplingParams

from .conftest import make_prompts

LENGTHS = [3, 9, 17, 30]


def _engine(path: str, **kwargs) -> LLMEngine:
    args = dict(model=path, block_size=8, max_model_len=96, device="cpu", max_num_seqs=8)
    return LLMEngine(EngineArgs(**(args | kwargs)))


def _run(engine: LLMEngine, params: list[SamplingParams], final_only: bool = False):
    """Every output per request id in arrival order, and the step each came back in."""
    for i, (p, sp) in enumerate(zip(make_prompts(seed=3, lengths=LENGTHS), params)):
        if final_only:
            sp = sp.clone(output_kind=RequestOutputKind.FINAL_ONLY)
        engine.add_request(str(i), None, p, sp)
    seen: dict[str, list] = {}
    step = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen.setdefault(out.request_id, []).append((step, out))
        step += 1
    return seen


def test_streamed_outputs_match_transformers_and_grow_in_order(tiny_models, hf):
    path = tiny_models["llama"]
    engine = _engine(path)
    params = [SamplingParams(temperature=0, max_tokens=6 + i, ignore_eos=True) for i in range(len(LENGTHS))]
    seen = _run(engine, params)
    tok = engine.tokenizer
    for i, prompt in enumerate(make_prompts(seed=3, lengths=LENGTHS)):
        outs = [o for _, o in seen[str(i)]]
        want = hf.greedy(path, prompt, max_new_tokens=6 + i, min_new_tokens=6 + i)
        assert outs[-1].finished and outs[-1].outputs[0].token_ids == want
        assert outs[0].outputs[0].token_ids == want[:1]  # the first token is reported at once
        counts = [len(o.outputs[0].token_ids) for o in outs]
        assert counts == list(range(1, len(want) + 1))  # one output per token, none lost or repeated
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert outs[-1].outputs[0].text == tok.decode(want, skip_special_tokens=True)
        assert all(outs[-1].outputs[0].text.startswith(o.outputs[0].text) for o in outs)


def test_final_only_gives_the_same_results(tiny_models):
    path = tiny_models["qwen2"]
    params = [SamplingParams(temperature=0, max_tokens=7, ignore_eos=True) for _ in LENGTHS]
    streamed = _run(_engine(path), params)
    final = _run(_engine(path), params, final_only=True)
    assert set(final) == set(streamed)
    for rid, outs in final.items():
        assert len(outs) == 1 and outs[0][1].finished  # nothing but the final output
        a, b = outs[0][1].outputs[0], streamed[rid][-1][1].outputs[0]
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)


def test_lazy_text_equals_the_eager_stop_string_path(tiny_models):
    """Without stop strings the text is decoded when read; a stop string that never matches
    forces decoding every step. Both must give the same text, streamed and final."""
    path = tiny_models["mistral"]
    lazy = [SamplingParams(temperature=0, max_tokens=9, ignore_eos=True) for _ in LENGTHS]
    eager = [
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, stop=["\x00never"]) for _ in LENGTHS
    ]
    a, b = _run(_engine(path), lazy), _run(_engine(path), eager)
    for rid in a:
        texts_a = [o.outputs[0].text for _, o in a[rid]]
        texts_b = [o.outputs[0].text for _, o in b[rid]]
        assert texts_a[-1] == texts_b[-1]
        # The stop-string path holds back len(stop) - 1 characters while streaming; the lazy
        # path holds back nothing, so each streamed lazy text extends the eager one.
        assert all(x.startswith(y) for x, y in zip(texts_a, texts_b))


def test_abort_while_outputs_are_deferred(tiny_models):
    engine = _engine(tiny_models["llama"])
    for i, p in enumerate(make_prompts(seed=4, lengths=[5, 12])):
        engine.add_request(str(i), None, p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    engine.step()  # prefills: their records wait for the next step
    engine.step()  # second tokens: the first ones come out, the second ones wait
    assert engine._records
    engine.abort_request("0")
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    zero = [o for o in outs if o.request_id == "0"]
    # The tokens the core already made are not lost: the abort's output holds both.
    assert [o.finished for o in zero] == [False] * (len(zero) - 1) + [True]
    assert zero[-1].outputs[0].finish_reason == "abort" and len(zero[-1].outputs[0].token_ids) == 2
    one = [o for o in outs if o.request_id == "1"]
    assert one[-1].finished and len(one[-1].outputs[0].token_ids) == 20


def test_decode_fast_path_allocates_like_the_full_path():
    """Per decode token, allocate_slots with the shortcut and without it leave the same blocks
    and the same cached hashes."""
    params = SamplingParams(temperature=0, max_tokens=40)

    def run(fast: bool):
        kv = KVCacheManager(num_blocks=32, block_size=4, enable_caching=True)
        r = Request("r", list(range(10, 17)), params, None, 40, 4)
        kv.allocate_slots(r, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        trace = []
        for t in range(20):
            r.append_output_token(100 + t)
            if fast:
                kv.allocate_slots(r, 1)
            else:  # the full path, without the shortcut
                kv._allocate(r, 1, [])
            r.num_computed_tokens += 1
            blocks = kv.req_to_blocks["r"]
            trace.append(
                ([b.block_id for b in blocks], [b.block_hash for b in blocks], kv.num_cached_blocks["r"])
            )
        return trace

    fast, full = run(True), run(False)
    assert fast == full
    assert len(fast[-1][0]) == 7 and fast[-1][2] == 6  # 27 tokens: 7 blocks, 6 of them full and cached
