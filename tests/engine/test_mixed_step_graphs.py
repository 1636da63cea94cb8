"""The mixed-step (piecewise) CUDA-graph path on the CPU: token buckets, padding of mixed steps to
them, attention over the real rows only, and the cudagraph_mode switch. Capture and replay need a
GPU (e2e/gpu_correctness.py compares them with transformers there); what they run is decided here."""

from __future__ import annotations

import argparse

import pytest
import torch

from pagoda.kernels.paged_attention_ref import paged_attention_ref
from pagoda.kernels.rotary_ref import rotary_embedding_ref
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.layers.attention import Attention
from pagoda.runtime.worker.attention_context import AttentionContext, attention_context
from pagoda.runtime.worker.piecewise_graphs import MixedStepGraphs, mixed_capture_sizes, padded_tokens

from .conftest import make_prompts


def test_mixed_capture_sizes():
    sizes = mixed_capture_sizes(512)
    assert sizes[:3] == [8, 16, 24] and sizes[31] == 256 and sizes[32] == 272 and sizes[-1] == 512
    assert all(b - a == 8 for a, b in zip(sizes[:31], sizes[1:32]))
    assert all(b - a == 16 for a, b in zip(sizes[31:], sizes[32:]))
    assert mixed_capture_sizes(20) == [8, 16, 20]  # the budget itself is the last bucket
    assert mixed_capture_sizes(4) == [4]


@pytest.mark.parametrize("tokens, want", [(2, 8), (8, 8), (9, 16), (255, 256), (257, 272), (512, 512)])
def test_padded_tokens_is_the_smallest_bucket_that_fits(tokens, want):
    assert padded_tokens(tokens, mixed_capture_sizes(512)) == want


def test_padded_tokens_beyond_the_largest_bucket():
    assert padded_tokens(513, mixed_capture_sizes(512)) is None  # a big step runs eagerly
    assert padded_tokens(3, []) is None


def test_attention_reads_and_writes_only_the_real_rows():
    """A step padded to a bucket: the rows past ctx.num_tokens belong to no sequence. They must
    not be written to the cache, and the real rows' output equals the unpadded attention."""
    torch.manual_seed(0)
    heads, kv_heads, dim, block = 4, 2, 16, 8
    attn = Attention(heads, dim, kv_heads, dim**-0.5)
    attn.k_cache = torch.zeros(4, block, kv_heads, dim)
    attn.v_cache = torch.zeros(4, block, kv_heads, dim)
    n, rows = 5, 8  # two sequences: a decode with 2 cached tokens, then a 4-token prefill chunk
    q, k, v = torch.randn(rows, heads, dim), torch.randn(rows, kv_heads, dim), torch.randn(rows, kv_heads, dim)
    attn.k_cache[0, :2] = torch.randn(2, kv_heads, dim)
    attn.v_cache[0, :2] = torch.randn(2, kv_heads, dim)
    positions = torch.tensor([2, 0, 1, 2, 3, 0, 0, 0])
    slots = torch.tensor([2, 8, 9, 10, 11, 12, 13, 14])  # padding slots point at real cache rows
    cos_sin = torch.randn(16, dim)
    ctx = AttentionContext(slot_mapping=slots, block_tables=torch.tensor([[0], [1]], dtype=torch.int32),
                           seq_lens=torch.tensor([3, 4], dtype=torch.int32),
                           query_start_loc=torch.tensor([0, 1, 5], dtype=torch.int32), max_query_len=4,
                           max_seq_len=4, num_decode_seqs=1, num_tokens=n)
    before = attn.k_cache.clone()
    with attention_context(ctx):
        out = attn.attend(q, k, v, positions, cos_sin)
    assert out.shape == (rows, heads * dim)
    assert torch.equal(out[n:], torch.zeros(rows - n, heads * dim))
    written = before.clone().flatten(0, 1)
    changed = (attn.k_cache.flatten(0, 1) != written).any(-1).any(-1).nonzero().flatten().tolist()
    assert changed == [2, 8, 9, 10, 11]  # the real rows' slots only, not 12..14
    # The same step unpadded, through the reference.
    q_rot, _ = rotary_embedding_ref(positions[:n], q[:n], k[:n], cos_sin)
    want = paged_attention_ref(q_rot, attn.k_cache, attn.v_cache, ctx.block_tables, ctx.seq_lens,
                               ctx.query_start_loc, attn.scale)
    torch.testing.assert_close(out[:n], want.reshape(n, -1))


def _record_runs(monkeypatch) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    real_run = MixedStepGraphs.run

    def run(self, size, ctx):
        runs.append((size, ctx.num_tokens))
        return real_run(self, size, ctx)

    monkeypatch.setattr(MixedStepGraphs, "run", run)
    return runs


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "gemma2"])
def test_mixed_steps_take_the_padded_path_and_match_transformers(family, tiny_models, hf, monkeypatch):
    """A small token budget chunks the prompts, so prefill chunks share steps with decodes; every
    such step is padded to a token bucket, and the greedy tokens still equal transformers'. The
    MoE model routes the padding rows too, Gemma 2 has sliding windows and soft-capping."""
    path = tiny_models[family]
    prompts = make_prompts(lengths=[3, 21, 9, 30, 5])
    runs = _record_runs(monkeypatch)
    llm = LLM(path, block_size=8, max_model_len=64, device="cpu", max_num_seqs=8, max_num_batched_tokens=20)
    runner = llm.llm_engine.runner
    assert runner.mixed_sizes == [8, 16, 20]
    outs = llm.generate(prompt_token_ids=prompts,
                        sampling_params=SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert runs, "no step took the mixed-step path"
    assert all(size in runner.mixed_sizes and real <= size for size, real in runs)
    assert any(real < size for size, real in runs), "no step was padded"
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf.greedy(path, p, max_new_tokens=8)


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "NONE"])
def test_cudagraph_mode_turns_mixed_graphs_off(mode, tiny_models, monkeypatch):
    runs = _record_runs(monkeypatch)
    llm = LLM(tiny_models["qwen2"], block_size=8, max_model_len=64, device="cpu", max_num_seqs=8,
              max_num_batched_tokens=20, cudagraph_mode=mode)
    runner = llm.llm_engine.runner
    assert runner.mixed_sizes == [] and runner.mixed_graphs is None
    assert (runner.graph_sizes == []) == (mode == "NONE")
    llm.generate(prompt_token_ids=make_prompts(lengths=[3, 21, 9]),
                 sampling_params=SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert runs == []


def test_cudagraph_mode_is_vllms_flag():
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    args = EngineArgs.from_cli_args(parser.parse_args(
        ["--compilation-config.cudagraph_mode", "FULL_DECODE_ONLY", "--max-mixed-graph-tokens", "1k"]), model="m")
    assert args.cudagraph_mode == "FULL_DECODE_ONLY" and args.max_mixed_graph_tokens == 1000
    with pytest.raises(SystemExit):
        parser.parse_args(["--cudagraph-mode", "PIECEWISE_SOMETIMES"])


def test_mixed_capture_sizes_beyond_512():
    sizes = mixed_capture_sizes(16384)
    assert sizes[:48] == mixed_capture_sizes(512)  # the small buckets do not move
    assert sizes[48:56] == [576, 640, 704, 768, 832, 896, 960, 1024]
    assert sizes[-1] == 16384 and len(sizes) == 88
    # Past 512, a padded step throws away at most an eighth of its rows.
    for tokens in range(513, 16385, 7):
        assert (padded_tokens(tokens, sizes) - tokens) * 8 <= tokens
    assert mixed_capture_sizes(3000)[-2:] == [2816, 3000]  # the budget itself closes the list
