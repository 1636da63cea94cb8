"""Start-up warm-up: a few synthetic requests through the real scheduler, runner and sampler, so
that the Triton specializations and cuBLAS plans a server will need are built before the first
user request, not during it (runtime/worker/compile_watch.py says why that matters).

The requests cover what varies a kernel's specialization from step to step: token and sequence
counts of 1, of multiples of 16 and of neither, prefills with and without cached context (chunked
and prefix-cache hits), and the sampler's paths (greedy, top-k/top-p/min-p, seeded, logprobs,
penalties). Afterwards nothing of them is left but evictable prefix-cache blocks, which hold the
right KV for their tokens, and the engine's counters start from zero.
"""

from __future__ import annotations

import logging
import random
import time

from pagoda.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

PROMPT_LENS = (1, 7, 16, 33, 64, 128, 250)
MAX_TOKENS = 4


def warm_up_requests(vocab_size: int, max_model_len: int, budget: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(0)
    samplings = [
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=50, top_p=0.9, min_p=0.05, max_tokens=MAX_TOKENS, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=1, logprobs=2, max_tokens=MAX_TOKENS, ignore_eos=True),
        SamplingParams(temperature=0.8, presence_penalty=0.5, repetition_penalty=1.1, max_tokens=MAX_TOKENS,
                       ignore_eos=True),
    ]
    limit = max(1, min(max_model_len - MAX_TOKENS, budget))
    prompts = [[rng.randrange(vocab_size) for _ in range(min(n, limit))] for n in PROMPT_LENS]
    # Prefix-cache hits (cached context before the new tokens), and a prompt longer than one
    # step's budget where it fits (chunked prefill).
    shared = prompts[-1]
    prompts += [shared[: min(len(shared), 64)] + [rng.randrange(vocab_size) for _ in range(9)]]
    long_len = min(budget + 17, max_model_len - MAX_TOKENS)
    if long_len > budget:
        prompts.append([rng.randrange(vocab_size) for _ in range(long_len)])
    return [(p, samplings[i % len(samplings)]) for i, p in enumerate(prompts)]


def warm_up(core) -> float:
    """Run the warm-up on `core` (an EngineCore with no requests yet); returns its seconds."""
    from pagoda.runtime.core.engine_core import EngineCoreRequest

    start = time.perf_counter()
    cfg = core.model_config
    for i, (prompt, params) in enumerate(warm_up_requests(cfg.vocab_size, cfg.max_model_len,
                                                          core.max_num_batched_tokens)):
        core.add_request(EngineCoreRequest(f"warmup-{i}", prompt, params, None, params.max_tokens,
                                           time.monotonic(), parent_id=f"warmup-{i}"))
    while core.has_unfinished_requests():
        core.step()
    kv = core.kv_cache_manager
    kv.prefix_cache_queries = kv.prefix_cache_hits = 0
    core.scheduler.num_preemptions = 0
    core.prompt_tokens = core.generation_tokens = 0
    seconds = time.perf_counter() - start
    logger.info("warm-up: %d requests in %.2f s", len(PROMPT_LENS) + 2, seconds)
    return seconds
