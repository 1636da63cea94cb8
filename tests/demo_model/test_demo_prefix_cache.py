"""Prefix caching on real prompts: files that open with the same long import header.

The second and later requests must find the header's full blocks in the cache, say so (per
request and in the engine's counters), and still produce exactly the tokens of an engine with
caching off, which are transformers' tokens.
"""

from __future__ import annotations

import os

BLOCK_SIZE = 16
MAX_TOKENS = 16


def shared_prefix(prompts: list[list[int]]) -> int:
    return len(os.path.commonprefix(prompts))


def test_prefix_cache_hits_on_shared_header(make_engine, engine_runner, tokenizer, hf_greedy, header_prompts):
    from pagoda.runtime.sampling_params import SamplingParams

    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in header_prompts]
    common = shared_prefix(prompts)
    assert common >= 8 * BLOCK_SIZE, f"the header should span many blocks, it has {common} tokens"
    cached_blocks_tokens = BLOCK_SIZE * (common // BLOCK_SIZE)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    tokens = {}
    for caching in (True, False):
        engine = make_engine(enable_prefix_caching=caching, block_size=BLOCK_SIZE)
        # The first request fills the cache; the others, scheduled together, reuse it.
        outputs = engine_runner(engine, prompts[:1], params) + engine_runner(engine, prompts[1:], params)
        stats = engine.stats()
        tokens[caching] = [o.outputs[0].token_ids for o in outputs]
        if caching:
            assert outputs[0].num_cached_tokens == 0
            for output in outputs[1:]:
                assert output.num_cached_tokens >= cached_blocks_tokens, (
                    f"{output.num_cached_tokens} cached tokens; the shared header fills "
                    f"{common // BLOCK_SIZE} blocks ({cached_blocks_tokens} tokens)"
                )
            assert stats.prefix_cache_hits >= (len(prompts) - 1) * cached_blocks_tokens
            assert stats.prefix_cache_queries >= stats.prefix_cache_hits
        else:
            assert all(o.num_cached_tokens == 0 for o in outputs)
            assert stats.prefix_cache_hits == 0

    assert tokens[True] == tokens[False]
    assert tokens[False] == [hf_greedy(prompt, MAX_TOKENS)[0] for prompt in prompts]
