"""Tensor parallelism on the CPU: world size 2 over gloo is token-identical to world size 1 and to
transformers; each rank holds and reads only its shard; bad sizes fail clearly; no worker outlives
its engine."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.layers.parallel_state import TensorParallelGroup, check_head_split, tensor_parallel
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.llama import LlamaForCausalLM
from pagoda.runtime.tools.tiny_models import build_tiny_model
from pagoda.runtime.worker.distributed.executor import check_tensor_parallel
from pagoda.runtime.worker.model_loader import iter_safetensors, load_model

from .conftest import MAX_NEW_TOKENS, make_prompts

pytestmark = pytest.mark.timeout(180)  # a stuck collective must fail the test, never hang CI

LENGTHS = [1, 3, 8, 9, 17, 33, 47, 64]
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
# Three sequences at a time and 24 tokens a step: requests join as others finish (continuous
# batching), long prompts are chunked, and decode steps mix with prefill chunks.
ENGINE = dict(block_size=8, max_model_len=128, device="cpu", max_num_seqs=3, max_num_batched_tokens=24)


@pytest.fixture(scope="module")
def models(tiny_models, tmp_path_factory) -> dict[str, str]:
    """llama (2 KV heads: one per rank), qwen2 (qkv bias, tied embeddings), a one-KV-head llama,
    whose KV head both ranks replicate, and qwen3_moe, whose experts' inter dim each rank halves."""
    kv1 = build_tiny_model(tmp_path_factory.mktemp("tp") / "llama_kv1", "llama", num_key_value_heads=1)
    return {"llama": tiny_models["llama"], "qwen2": tiny_models["qwen2"], "llama_kv1": str(kv1),
            "qwen3_moe": tiny_models["qwen3_moe"]}


def child_pids() -> set[int]:
    me, children = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                children.add(int(entry.name))
    return children


def generate(llm: LLM, prompts, params=GREEDY):
    return llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)


@pytest.mark.parametrize("case", ["llama", "qwen2", "llama_kv1", "qwen3_moe"])
def test_tp2_matches_tp1_and_transformers(models, hf, case):
    path = models[case]
    prompts = make_prompts(seed=7, lengths=LENGTHS)
    before = child_pids()
    with LLM(path, tensor_parallel_size=2, **ENGINE) as llm:
        runner = llm.llm_engine.runner
        workers = llm.llm_engine.engine_core.executor.workers.procs
        assert len(workers) == 1 and child_pids() - before == {workers[0].pid}
        attn = runner.model.model.layers[0].self_attn
        assert (attn.num_heads, attn.num_kv_heads) == (2, 1)  # 4 heads; 2 (or 1, replicated) KV heads
        assert runner.kv_cache.shape[-2] == 1
        got = [o.outputs[0].token_ids for o in generate(llm, prompts)]
    assert all(p.poll() is not None for p in workers) and child_pids() <= before

    single = LLM(path, **ENGINE)
    want_tp1 = [o.outputs[0].token_ids for o in generate(single, prompts)]
    want_hf = [hf.greedy(path, p) for p in prompts]
    for i, (g, w1, wh) in enumerate(zip(got, want_tp1, want_hf)):
        assert g == w1 == wh, f"prompt {i} (len {len(prompts[i])}): tp=2 {g}, tp=1 {w1}, transformers {wh}"


def test_tp2_logprobs_match_tp1(models):
    """Prompt and sample logprobs take extra LM-head calls, which the worker must mirror."""
    path = models["qwen2"]
    prompts = make_prompts(seed=8, lengths=[5, 30, 12])
    params = [
        SamplingParams(temperature=0.0, max_tokens=4, logprobs=3, prompt_logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=6),
        SamplingParams(temperature=0.0, max_tokens=5, prompt_logprobs=1),
    ]
    with LLM(path, tensor_parallel_size=2, **ENGINE) as llm:
        got = generate(llm, prompts, params)
    want = generate(LLM(path, **ENGINE), prompts, params)

    def flat(entries):
        items = [(tok, lp) for entry in entries if entry is not None for tok, lp in sorted(entry.items())]
        return [(tok, lp.rank) for tok, lp in items], torch.tensor([lp.logprob for _, lp in items])

    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for mine, theirs in (
            (g.prompt_logprobs, w.prompt_logprobs),
            (g.outputs[0].logprobs, w.outputs[0].logprobs),
        ):
            (ids, values), (want_ids, want_values) = flat(mine or []), flat(theirs or [])
            assert ids == want_ids
            # Same math, summed in another order across ranks: equal to fp32 rounding.
            torch.testing.assert_close(values, want_values, rtol=0, atol=1e-4)
    assert got[0].prompt_logprobs and got[0].outputs[0].logprobs


def test_workers_stop_when_the_engine_is_dropped(models):
    before = child_pids()
    llm = LLM(models["llama"], tensor_parallel_size=2, **ENGINE)
    (worker,) = llm.llm_engine.engine_core.executor.workers.procs
    assert generate(llm, [[5, 6, 7]])[0].outputs[0].token_ids
    del llm
    gc.collect()
    assert worker.wait(timeout=30) is not None
    assert child_pids() <= before


def test_failed_start_leaves_no_workers(models, tmp_path):
    """A checkpoint that lacks a tensor fails on every rank; the error comes back, the workers go."""
    path = Path(build_tiny_model(tmp_path / "broken", "llama"))
    shard = next(
        f for f in sorted(path.glob("*.safetensors")) if "model.norm.weight" in safe_open(f, "pt").keys()
    )
    tensors = load_file(shard)
    del tensors["model.norm.weight"]
    save_file(tensors, shard, metadata={"format": "pt"})
    before = child_pids()
    with pytest.raises(ValueError, match="lacks weights for.*model.norm.weight"):
        LLM(str(path), tensor_parallel_size=2, **ENGINE)
    gc.collect()
    assert child_pids() <= before


# ---- sharded weights, in-process (no collectives are needed to build and load a shard) ----


class RecordingSlice:
    """A safetensors slice that counts the elements each read returns."""

    def __init__(self, inner, name: str, reads: dict[str, int]):
        self.inner, self.name, self.reads = inner, name, reads

    def get_shape(self):
        return self.inner.get_shape()

    def get_dtype(self):
        return self.inner.get_dtype()

    def __getitem__(self, index):
        tensor = self.inner[index]
        self.reads[self.name] = self.reads.get(self.name, 0) + tensor.numel()
        return tensor


def full_checkpoint(path: str) -> dict[str, torch.Tensor]:
    return dict(iter_safetensors(Path(path)))


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_reads_and_holds_only_its_shard(models, rank):
    path = models["qwen2"]  # qkv bias and tied embeddings: every kind of parameter
    cfg = ModelConfig.from_path(Path(path))
    full = full_checkpoint(path)
    with tensor_parallel(TensorParallelGroup(rank=rank, size=2)):
        model = LlamaForCausalLM(cfg)
    reads: dict[str, int] = {}
    lazy = ((name, RecordingSlice(sl, name, reads)) for name, sl in iter_safetensors(Path(path), lazy=True))
    with torch.no_grad():
        model.load_weights(lazy)

    replicated = {n for n in full if "norm" in n}
    for name, tensor in full.items():
        share = tensor.numel() if name in replicated else tensor.numel() // 2
        assert reads[name] == share, f"{name}: read {reads[name]} of {tensor.numel()} elements"

    def half(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return t.chunk(2, dim)[rank]

    layer, p = model.model.layers[1], "model.layers.1."
    qkv = torch.cat([half(full[p + f"self_attn.{x}_proj.weight"]) for x in "qkv"])
    qkv_bias = torch.cat([half(full[p + f"self_attn.{x}_proj.bias"]) for x in "qkv"])
    gate_up = torch.cat([half(full[p + "mlp.gate_proj.weight"]), half(full[p + "mlp.up_proj.weight"])])
    torch.testing.assert_close(layer.self_attn.qkv_proj.weight, qkv, rtol=0, atol=0)
    torch.testing.assert_close(layer.self_attn.qkv_proj.bias, qkv_bias, rtol=0, atol=0)
    torch.testing.assert_close(layer.self_attn.o_proj.weight, half(full[p + "self_attn.o_proj.weight"], 1))
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight, gate_up, rtol=0, atol=0)
    torch.testing.assert_close(layer.mlp.down_proj.weight, half(full[p + "mlp.down_proj.weight"], 1))
    torch.testing.assert_close(model.model.embed_tokens.weight, half(full["model.embed_tokens.weight"]))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(layer.input_layernorm.weight, full[p + "input_layernorm.weight"])


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_holds_its_slice_of_every_expert(models, rank):
    """Experts split by their inter dim: gate and up rows, down columns; the router is replicated."""
    path = models["qwen3_moe"]
    cfg = ModelConfig.from_path(Path(path))
    full = full_checkpoint(path)
    with tensor_parallel(TensorParallelGroup(rank=rank, size=2)):
        model = load_model(cfg, torch.device("cpu"))
    moe, p = model.model.layers[2].mlp, "model.layers.2.mlp."
    for e in range(6):
        gate, up = (full[f"{p}experts.{e}.{n}_proj.weight"].chunk(2)[rank] for n in ("gate", "up"))
        torch.testing.assert_close(moe.w13[e], torch.cat([gate, up]), rtol=0, atol=0)
        down = full[f"{p}experts.{e}.down_proj.weight"].chunk(2, 1)[rank]
        torch.testing.assert_close(moe.w2[e], down, rtol=0, atol=0)
    torch.testing.assert_close(moe.gate.weight, full[p + "gate.weight"], rtol=0, atol=0)
    assert not hasattr(model.model.layers[1].mlp, "w13")  # mlp_only_layers=[1]: dense


def test_replicated_kv_heads_and_dummy_weights_do_not_depend_on_the_size(models):
    """One KV head over two ranks: both hold it. Dummy weights are the same model at any size."""
    cfg = ModelConfig.from_path(Path(models["llama_kv1"]))
    whole = load_model(cfg, torch.device("cpu"), "dummy", seed=3)
    w = whole.model.layers[0].self_attn.qkv_proj.weight
    q, k, v = w.split([4 * cfg.head_dim, cfg.head_dim, cfg.head_dim])
    down = whole.model.layers[0].mlp.down_proj.weight
    for rank in (0, 1):
        with tensor_parallel(TensorParallelGroup(rank=rank, size=2)):
            shard = load_model(cfg, torch.device("cpu"), "dummy", seed=3)
        expected = torch.cat([q.chunk(2)[rank], k, v])
        torch.testing.assert_close(shard.model.layers[0].self_attn.qkv_proj.weight, expected, rtol=0, atol=0)
        torch.testing.assert_close(shard.model.layers[0].mlp.down_proj.weight, down.chunk(2, 1)[rank])
        vocab = whole.lm_head.weight.chunk(2)[rank]
        torch.testing.assert_close(shard.lm_head.weight, vocab, rtol=0, atol=0)


# ---- errors ----


def test_size_that_does_not_divide_the_heads_is_refused(models):
    before = child_pids()
    with pytest.raises(
        ValueError, match=r"tensor_parallel_size=3 does not divide the model's 4 attention heads"
    ):
        LLM(models["llama"], tensor_parallel_size=3, **ENGINE)
    assert child_pids() <= before


def test_head_split_rules():
    check_head_split(4, 2, 2)
    check_head_split(4, 1, 4)  # one KV head, replicated on four ranks
    check_head_split(32, 8, 8)
    check_head_split(64, 8, 4)
    with pytest.raises(ValueError, match="3 KV heads"):
        check_head_split(6, 3, 2)
    with pytest.raises(ValueError, match="must be >= 1"):
        EngineArgs(model="x", tensor_parallel_size=0)


def test_more_ranks_than_gpus_and_unsupported_devices_are_refused(models):
    cfg = ModelConfig.from_path(Path(models["llama"]))
    with pytest.raises(ValueError, match="tensor_parallel_size=4 needs 4 GPUs, but 2 are visible"):
        check_tensor_parallel(cfg, 4, torch.device("cuda"), num_gpus=2)
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        check_tensor_parallel(cfg, 2, torch.device("cuda", 1), num_gpus=8)
    check_tensor_parallel(cfg, 2, torch.device("cuda"), num_gpus=2)
    with pytest.raises(ValueError, match="needs device cuda or cpu, not 'mps'"):
        LLM(models["llama"], tensor_parallel_size=2, **{**ENGINE, "device": "mps"})


def test_serve_flag():
    import argparse

    from pagoda.runtime.frontend.server.cli import add_arguments, engine_args_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert "--tensor-parallel-size" in parser.format_help()
    args = parser.parse_args(["some/model", "--tensor-parallel-size", "2"])
    assert engine_args_from(args).tensor_parallel_size == 2
    assert engine_args_from(parser.parse_args(["some/model"])).tensor_parallel_size == 1
