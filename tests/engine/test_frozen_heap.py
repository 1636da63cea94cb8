"""LLM.generate runs with the heap frozen and young collections spaced out (frontend/llm.py's
frozen_heap), and leaves the collector as it found it, also when the caller froze it."""

from __future__ import annotations

import gc

from pagoda.runtime import SamplingParams
from pagoda.runtime.frontend.llm import LLM

from .conftest import make_prompts


def test_generate_hands_the_collector_back_as_it_found_it(tiny_models):
    llm = LLM(tiny_models["qwen2"], block_size=8, max_model_len=64, device="cpu", max_num_seqs=4)
    seen = []
    step = llm.llm_engine.step

    def watch():
        seen.append((gc.get_freeze_count() > 0, gc.get_threshold()))
        return step()

    llm.llm_engine.step = watch
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    first = llm.generate([{"prompt_token_ids": p} for p in make_prompts()[:3]], params, use_tqdm=False)
    assert seen and all(frozen and t[0] >= 20000 for frozen, t in seen)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    gc.freeze()  # the caller's own freeze stays
    try:
        again = llm.generate([{"prompt_token_ids": p} for p in make_prompts()[:3]], params, use_tqdm=False)
        assert gc.get_freeze_count() > 0 and gc.get_threshold() == before
    finally:
        gc.unfreeze()
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in again]
