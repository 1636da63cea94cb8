"""Start-up warm-up: the Triton specializations and cuBLAS plans a server will need are built
before the first user request, not during it (runtime/worker/compile_watch.py says why that
matters: on the H200 one missed decode-kernel variant put a 1 s stall into W3's TTFT p99).

Two parts:
- Synthetic requests through the real scheduler, runner and sampler, arriving one per step while
  the earlier ones decode. So the steps meet what varies a kernel's specialization from step to
  step: token and sequence counts of 1, of multiples of 16 and of neither, mixed steps with any
  number of decode rows in front (which moves the alignment of the prefill kernel's sliced
  pointers), prefills with cached context (a prefix-cache hit, a chunked prompt), and the
  sampler's paths (greedy, top-k/top-p/min-p, seeded, logprobs, penalties).
- The decode attention kernel at every split count and tile it can be launched with (each is a
  kernel of its own: NUM_SPLITS and the tile are constexprs), per distinct attention layer.
- The prefill attention kernel at every tile its launch may choose by context length (heads of
  64: paged_attention_prefill.launches), with its per-sequence pointers at each 16-byte alignment
  a mixed step's decode rows can leave them.

Afterwards nothing of the requests is left but evictable prefix-cache blocks, which hold the right
KV for their tokens, and the engine's counters start from zero.
"""

from __future__ import annotations

import logging
import random
import time

import torch

from pagoda.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

PROMPT_LENS = (1, 7, 16, 33, 64, 128, 250, 17, 3, 48, 5, 96)
MAX_TOKENS = 8


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
    # A prefix-cache hit (cached context before the new tokens: it arrives after the 250-token
    # prompt was computed), and a prompt longer than one step's budget where it fits (chunked).
    shared = prompts[PROMPT_LENS.index(250)]
    prompts.append(shared[: min(len(shared), 64)] + [rng.randrange(vocab_size) for _ in range(9)])
    long_len = min(budget + 17, max_model_len - MAX_TOKENS)
    if long_len > budget:
        prompts.append([rng.randrange(vocab_size) for _ in range(long_len)])
    return [(p, samplings[i % len(samplings)]) for i, p in enumerate(prompts)]


def warm_up(core) -> float:
    """Run the warm-up on `core` (an EngineCore with no requests yet); returns its seconds."""
    from pagoda.runtime.core.engine_core import EngineCoreRequest

    start = time.perf_counter()
    cfg = core.model_config
    pending = warm_up_requests(cfg.vocab_size, cfg.max_model_len, core.max_num_batched_tokens)
    count = len(pending)
    i = 0
    while pending or core.has_unfinished_requests():
        if pending:  # one arrival per step, beside the decodes of the earlier ones
            prompt, params = pending.pop(0)
            core.add_request(EngineCoreRequest(f"warmup-{i}", prompt, params, None, params.max_tokens,
                                               time.monotonic(), parent_id=f"warmup-{i}"))
            i += 1
        core.step()
    runner = getattr(core.executor, "runner", None)
    kernels = 0
    if runner is not None and core.device.type == "cuda":
        dtype, width = getattr(torch, cfg.dtype), runner.buffers.max_blocks
        kernels = warm_up_decode_kernels(runner.model, dtype, width) + warm_up_prefill_kernels(runner.model, dtype, width)
    kv = core.kv_cache_manager
    kv.prefix_cache_queries = kv.prefix_cache_hits = 0
    core.scheduler.num_preemptions = 0
    core.prompt_tokens = core.generation_tokens = 0
    seconds = time.perf_counter() - start
    logger.info("warm-up: %d requests and %d attention-kernel launches in %.2f s", count, kernels, seconds)
    return seconds


def warm_up_decode_kernels(model, dtype, table_width: int) -> int:
    """Launch the decode attention kernel once at every split count (powers of two up to
    MAX_SPLITS) and both tiles, per distinct layer (heads, window, soft-cap, cache dtype), on
    one-token rows (queries in the compute dtype) that read block 0 of the real cache and write a
    scratch output.

    The block table has the runner's width (InputBuffers.max_blocks): its row stride is a kernel
    argument, and Triton specializes an integer argument on being 1 or a multiple of 16. A
    one-column table (stride 1) built a variant no step ever runs, and left the real one to compile
    on the first step that met it (seen on the H200 at 1,024 seats: the thin tile)."""
    from pagoda.kernels import paged_attention_decode as dec
    from pagoda.kernels import pdl

    launches = 0
    for layer in distinct_layers(model):
        k_cache = layer.k_cache
        dev, es = k_cache.device, k_cache.element_size()
        tiles = {dec.choose_tile(0, es, dev, layer.head_dim), dec.choose_tile(1 << 30, es, dev, layer.head_dim)}
        # pdl.flag is what the launch asks: on at two rows means off past MAX_ROWS, a second kernel
        for num_seqs, most_splits in warm_row_counts(k_cache.shape[2], dev, pdl.flag(k_cache, 2)):
            q = torch.zeros(num_seqs, layer.num_heads, layer.head_dim, dtype=dtype, device=dev)
            tables = torch.zeros(num_seqs, table_width, dtype=torch.int32, device=dev)
            seq_lens = torch.ones(num_seqs, dtype=torch.int32, device=dev)
            qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device=dev)
            splits = 1
            while splits <= most_splits:
                for block_n, warps, stages in tiles:
                    dec.paged_attention_decode(q, k_cache, layer.v_cache, tables, seq_lens, qsl, layer.scale,
                                               sliding_window=layer.sliding_window, softcap=layer.softcap,
                                               num_splits=splits, block_n=block_n, num_warps=warps,
                                               num_stages=stages)
                    launches += 1
                splits *= 2
    return launches


def distinct_layers(model):
    """One attention layer of each kind that launches its own kernels (heads, window, soft-cap,
    cache dtype and shape), leaving out layers without a cache."""
    seen = set()
    for layer in model.attention_layers():
        k_cache = layer.k_cache
        key = (layer.num_heads, layer.head_dim, layer.num_kv_heads, layer.sliding_window, layer.softcap,
               k_cache.dtype, tuple(k_cache.shape[1:]))
        if k_cache.numel() and key not in seen:
            seen.add(key)
            yield layer


# A mixed step hands the prefill kernel its sequences' rows of seq_lens, query_start_loc and the
# block table from the d-th on, d being its decode rows: int32 pointers that sit on a 16-byte
# boundary or not by d mod 4 (and the table's width), and Triton builds a kernel per alignment.
PREFILL_OFFSETS = (0, 1, 2, 3)


def warm_up_prefill_kernels(model, dtype, table_width: int) -> int:
    """Launch the prefill attention kernel at every tile paged_attention_prefill.launches gives a
    layer, per distinct layer, with its per-sequence rows starting at each of PREFILL_OFFSETS: one
    query token that reads position 0 of block 0 of the real cache into a scratch output. Where a
    layer has one tile, the warm-up requests' steps met it already."""
    from pagoda.kernels import paged_attention_prefill as pre

    launches = 0
    for layer in distinct_layers(model):
        k_cache = layer.k_cache
        configs = pre.launches(layer.head_dim, dtype, k_cache.device)
        if len(configs) < 2:
            continue
        dev = k_cache.device
        for d in PREFILL_OFFSETS:
            q = torch.zeros(d + 1, layer.num_heads, layer.head_dim, dtype=dtype, device=dev)
            tables = torch.zeros(d + 1, table_width, dtype=torch.int32, device=dev)[d:]
            seq_lens = torch.ones(d + 1, dtype=torch.int32, device=dev)[d:]
            qsl = torch.arange(d + 2, dtype=torch.int32, device=dev)[d:]
            for cfg in configs:
                pre.paged_attention_prefill(q, k_cache, layer.v_cache, tables, seq_lens, qsl, layer.scale,
                                            sliding_window=layer.sliding_window, softcap=layer.softcap,
                                            max_query_len=1, **cfg)
                launches += 1
    return launches


def warm_row_counts(num_kv_heads: int, device: torch.device, pdl_on: bool) -> list[tuple[int, int]]:
    """(rows, most split counts) the decode warm-up launches at. With programmatic dependent launch
    on, PDL is a constexpr of the kernel that holds only up to pdl.MAX_ROWS rows, so a step of more
    sequences is another specialization: warmed at MAX_ROWS + 1 rows, up to the most slices
    choose_num_splits gives that many sequences. Without these, an eager decode launch (a mixed
    step's decode rows) of five or more sequences, the longest past 512 tokens, took two slices with
    PDL off and built its kernel in a user's step: the compile watch logged it on the H100 in
    e2e/gpu_correctness.py (GROUP=7, NUM_SPLITS=2, results/narrow-heads-93740eb/)."""
    from pagoda.kernels import paged_attention_decode as dec
    from pagoda.kernels import pdl

    counts = [(2, dec.MAX_SPLITS)]
    if pdl_on:
        rows = pdl.MAX_ROWS + 1
        counts.append((rows, dec.choose_num_splits(rows, num_kv_heads, 1 << 30, device)))
    return counts
