"""The cut between the engine core and the frontend: the core holds no tokenizer and emits token
ids only; text, stop strings and outputs are made by the frontend, off the engine's step thread."""

from __future__ import annotations

import threading

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from pagoda.runtime.core.engine_core import EngineCore
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.async_engine import AsyncEngine
from pagoda.runtime.frontend.detokenizer import IncrementalDetokenizer
from pagoda.runtime.frontend.llm_engine import LLMEngine
from pagoda.runtime.sampling_params import RequestOutputKind, SamplingParams

from .conftest import make_prompts


def _holds_tokenizer(obj, seen: set[int], depth: int = 0) -> bool:
    if isinstance(obj, (PreTrainedTokenizerBase, Tokenizer)):
        return True
    if depth > 3 or id(obj) in seen or isinstance(obj, (str, bytes, int, float)):
        return False
    seen.add(id(obj))
    values = getattr(obj, "__dict__", {}).values() if not isinstance(obj, (list, tuple, dict)) else (
        obj.values() if isinstance(obj, dict) else obj)
    return any(_holds_tokenizer(v, seen, depth + 1) for v in list(values)[:64])


def test_the_core_holds_no_tokenizer_and_emits_ids(tiny_models):
    engine = LLMEngine(EngineArgs(str(tiny_models["llama"]), device="cpu", max_model_len=64))
    core = engine.engine_core
    assert isinstance(core, EngineCore)
    assert not _holds_tokenizer(core, set())
    assert _holds_tokenizer(engine, set())  # the search does find one where there is one
    prompt = make_prompts(seed=5, lengths=[6])[0]
    engine.add_request("r", None, prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    records = []
    while core.has_unfinished_requests():
        records += core.step()
    assert [len(r.new_token_ids) for r in records] == [1, 1, 1]
    assert records[-1].finish_reason == "length"
    assert all(not any(isinstance(v, str) for v in r.new_token_ids) for r in records)


async def test_the_engine_thread_does_no_detokenization(tiny_models, monkeypatch):
    threads: set[str] = set()
    for name in ("update", "get_text", "flush"):
        original = getattr(IncrementalDetokenizer, name)

        def spy(self, *a, _original=original, **kw):
            threads.add(threading.current_thread().name)
            return _original(self, *a, **kw)

        monkeypatch.setattr(IncrementalDetokenizer, name, spy)
    args = EngineArgs(str(tiny_models["llama"]), device="cpu", max_model_len=64)
    client = AsyncEngine.from_engine_args(args)
    client.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=["\x00never"],
                                output_kind=RequestOutputKind.DELTA)
        stream = await client.add_request("r", None, make_prompts(seed=6, lengths=[7])[0], params)
        outputs = [o async for o in stream]
        assert sum(len(o.outputs[0].token_ids) for o in outputs) == 12
    finally:
        await client.shutdown()
    assert threads and "pagoda-engine" not in threads  # all of it on the event loop's thread
