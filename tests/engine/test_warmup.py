"""The start-up warm-up (runtime/core/warmup.py) runs on the GPU only; here it is run on the CPU
engine directly, to show it leaves the engine as it found it: no request, no block held, counters
at zero, and the next requests' output unchanged."""

from __future__ import annotations

import pytest
import torch

from pagoda.runtime.core.warmup import warm_up, warm_up_requests
from pagoda.runtime.frontend.llm import LLM
from pagoda.runtime.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from pagoda.runtime.tools.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("warm") / "llama")


def _generate(llm):
    prompts = [{"prompt_token_ids": [3, 4, 5, 6, 7] * k} for k in (1, 3, 9)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_warm_up_leaves_the_engine_as_it_was(model_dir):
    kwargs = dict(model=str(model_dir), max_model_len=512, max_num_batched_tokens=96, num_kv_blocks=128,
                  enforce_eager=True)
    plain = LLM(**kwargs)
    expected = _generate(plain)
    warmed = LLM(**kwargs)
    core = warmed.llm_engine.engine_core
    assert warm_up(core) > 0
    stats = core.stats()
    assert (stats.num_running, stats.num_waiting, stats.prompt_tokens, stats.generation_tokens) == (0, 0, 0, 0)
    assert stats.prefix_cache_queries == stats.num_preemptions == 0
    assert core.kv_cache_manager.usage() == 0.0
    assert _generate(warmed) == expected


def test_warm_up_covers_the_specialization_classes():
    reqs = warm_up_requests(vocab_size=1000, max_model_len=4096, budget=2048)
    lens = [len(p) for p, _ in reqs]
    # token counts of 1, of multiples of 16 and of neither; one prompt longer than a step's budget
    assert 1 in lens and any(n % 16 == 0 for n in lens) and any(n % 16 not in (0, 1) for n in lens)
    assert max(lens) > 2048
    # a prompt that shares a cached prefix with an earlier one
    assert any(reqs[-2][0][:64] == p[:64] for p, _ in reqs[:-2])
    kinds = {(p.temperature == 0, p.logprobs is not None, p.needs_history) for _, p in reqs}
    assert len(kinds) >= 4
    assert all(0 <= t < 1000 for p, _ in reqs for t in p)


def test_decode_kernels_warm_up_at_every_split_count(model_dir):
    """The launches the warm-up makes are valid ones (here under the interpreter): every
    power-of-two split count up to MAX_SPLITS, with each tile, once per distinct layer."""
    from pagoda.kernels import paged_attention_decode as dec
    from pagoda.runtime.core.warmup import warm_up_decode_kernels

    llm = LLM(model=str(model_dir), max_model_len=256, num_kv_blocks=32, enforce_eager=True)
    runner = llm.llm_engine.engine_core.executor.runner
    model = runner.model
    layer = model.attention_layers()[0]
    tiles = {dec.choose_tile(0, layer.k_cache.element_size(), layer.k_cache.device, layer.head_dim),
             dec.choose_tile(1 << 30, layer.k_cache.element_size(), layer.k_cache.device, layer.head_dim)}
    splits = dec.MAX_SPLITS.bit_length()  # 1, 2, 4, ..., MAX_SPLITS
    real = dec.paged_attention_decode
    strides = []

    def recording(query, k_cache, v_cache, block_tables, *args, **kwargs):
        strides.append(block_tables.stride())
        return real(query, k_cache, v_cache, block_tables, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dec, "paged_attention_decode", recording)
        assert warm_up_decode_kernels(model, torch.float32, runner.buffers.max_blocks) == splits * len(tiles)
    # the steps' block tables are rows of this buffer: the same strides, so the same specialization
    assert set(strides) == {runner.buffers.block_tables.stride()}
    # choose_num_splits only ever picks one of the counts warmed up
    counts = {dec.choose_num_splits(s, h, n, layer.k_cache.device) for s in (1, 3, 64) for h in (1, 2, 8)
              for n in (1, 300, 5000, 100000)}
    assert counts <= {1 << i for i in range(splits)} and len(counts) > 2


def test_decode_warm_up_covers_the_rows_past_pdls_limit():
    """With PDL on, the kernel's PDL constexpr is off past pdl.MAX_ROWS rows: a second set of
    launches at MAX_ROWS + 1 rows must reach every split count choose_num_splits gives them."""
    from pagoda.kernels import paged_attention_decode as dec
    from pagoda.kernels import pdl
    from pagoda.runtime.core.warmup import warm_row_counts

    cpu = torch.device("cpu")
    assert warm_row_counts(8, cpu, pdl_on=False) == [(2, dec.MAX_SPLITS)]
    counts = warm_row_counts(2, cpu, pdl_on=True)
    assert counts[0] == (2, dec.MAX_SPLITS)
    rows, most = counts[1]
    assert rows == pdl.MAX_ROWS + 1
    for seqs in range(rows, 200):
        for n in (1, 600, 5000, 100000):
            assert dec.choose_num_splits(seqs, 2, n, cpu) <= most
    assert most > 1  # a long context at five sequences does take slices


def test_prefill_kernels_warm_up_at_each_tile_and_alignment(model_dir):
    """Where the prefill launch may choose between tiles (heads of 64 on a GPU), the warm-up
    launches each tile with the per-sequence rows at every 16-byte alignment a mixed step's decode
    rows can leave them, once per distinct layer. Run here under the interpreter with two small
    tiles standing in for the GPU's."""
    from pagoda.kernels import paged_attention_prefill as pre
    from pagoda.runtime.core.warmup import PREFILL_OFFSETS, warm_up_prefill_kernels

    llm = LLM(model=str(model_dir), max_model_len=256, num_kv_blocks=32, enforce_eager=True)
    runner = llm.llm_engine.engine_core.executor.runner
    model = runner.model
    tiles = [dict(block_m=16, block_n=16, num_warps=1, num_stages=1),
             dict(block_m=32, block_n=16, num_warps=1, num_stages=1)]
    real = pre.paged_attention_prefill
    seen = []

    def recording(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *args, **kwargs):
        out = real(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *args, **kwargs)
        assert torch.isfinite(out[-1]).all()  # the one query token (the rows before it stand for decodes)
        seen.append((kwargs["block_m"], seq_lens.data_ptr() % 16, query_start_loc.data_ptr() % 16,
                     block_tables.stride()))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pre, "paged_attention_prefill", recording)
        assert warm_up_prefill_kernels(model, torch.float32, runner.buffers.max_blocks) == 0  # one CPU tile
        mp.setattr(pre, "launches", lambda *a: tiles)
        n = warm_up_prefill_kernels(model, torch.float32, runner.buffers.max_blocks)
    assert n == len(tiles) * len(PREFILL_OFFSETS) == len(seen)  # the tiny model's layers are all alike
    for tile in tiles:
        mine = [s for s in seen if s[0] == tile["block_m"]]
        assert {s[1] for s in mine} == {0, 4, 8, 12} and {s[2] for s in mine} == {0, 4, 8, 12}
    assert {s[3] for s in seen} == {runner.buffers.block_tables.stride()}
