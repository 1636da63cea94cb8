"""Start-up: models, dtypes, the memory arithmetic and its refusal, and request validation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.memory import check_fits, count_parameters, kv_bytes_per_token, plan_memory
from pagoda.runtime.tools.tiny_models import FAMILIES

from .conftest import make_prompts


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_matches_transformers(tiny_models, hf, family):
    path = tiny_models[family]
    config = json.loads(open(f"{path}/config.json").read())
    model = hf.model(path)
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())
    # K and V, per layer, per KV head (2), per dim (16).
    assert kv_bytes_per_token(config, 2) == 2 * config["num_hidden_layers"] * 2 * 16 * 2


def test_memory_plan_arithmetic_and_refusal():
    config = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    }
    assert count_parameters(config) == 8_030_261_248  # Llama-3.1-8B
    plan = plan_memory(config, 2, 141 * 10**9, 0.9, max_model_len=8192, activation_bytes=2 * 1024**3)
    assert plan.kv_bytes_per_token == 131072
    assert (
        plan.num_kv_blocks
        == (plan.usable_bytes - plan.weight_bytes - plan.activation_bytes) // plan.block_bytes
    )
    assert plan.max_concurrent_seqs == plan.kv_capacity_tokens // 8192 and plan.fits
    check_fits(plan)
    small = plan_memory(config, 2, 24 * 1024**3, 0.7, max_model_len=131072)
    assert not small.fits
    with pytest.raises(ValueError, match="max_model_len=131072") as err:
        check_fits(small)
    assert "gpu_memory_utilization" in str(err.value)


def test_engine_refuses_a_pool_too_small_for_one_sequence(tiny_models):
    with pytest.raises(ValueError, match="max_model_len=128.*Lower max_model_len"):
        LLM(tiny_models["llama"], block_size=8, max_model_len=128, num_kv_blocks=15, device="cpu")


def test_memory_plan_is_exposed(tiny_models):
    llm = LLM(tiny_models["qwen2"], block_size=8, max_model_len=64, max_num_seqs=4, device="cpu")
    plan = llm.llm_engine.memory_plan
    assert plan.num_kv_blocks == 4 * 64 // 8 and plan.kv_capacity_tokens == 256
    assert plan.weight_bytes == count_parameters(llm.llm_engine.model_config.hf_config) * 4
    assert llm.llm_engine.stats().kv_capacity_tokens == 256


def test_unsupported_architecture_lists_supported(tiny_models, tmp_path):
    path = tmp_path / "gpt2ish"
    shutil.copytree(tiny_models["llama"], path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM.*MistralForCausalLM.*Qwen2ForCausalLM"
    ):
        LLM(str(path), device="cpu")


def test_request_validation(tiny_models):
    llm = LLM(tiny_models["llama"], block_size=8, max_model_len=64, device="cpu")
    engine = llm.llm_engine
    with pytest.raises(ValueError, match="60 prompt tokens \\+ 16 max_tokens = 76.*max_model_len=64"):
        engine.add_request("a", None, [7] * 60, SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("b", None, [], SamplingParams())
    with pytest.raises(ValueError, match="max_model_len=200"):
        LLM(tiny_models["llama"], max_model_len=2000, device="cpu")
    # max_tokens=None runs up to max_model_len.
    out = llm.generate(
        prompt_token_ids=[[7] * 60],
        sampling_params=SamplingParams(max_tokens=None, ignore_eos=True),
        use_tqdm=False,
    )
    assert len(out[0].outputs[0].token_ids) == 4 and out[0].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_weights(tiny_models, hf, dtype):
    path = tiny_models["qwen2"]
    llm = LLM(path, dtype=dtype, block_size=8, max_model_len=128, device="cpu")
    runner = llm.llm_engine.runner
    assert {p.dtype for p in runner.model.parameters()} == {getattr(torch, dtype)}
    assert runner.kv_cache.dtype == getattr(torch, dtype)
    prompts = make_prompts(seed=30)[:4]
    out = llm.generate(
        prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=6), use_tqdm=False
    )
    # Half precision need not match fp32 token for token; the first greedy token nearly always does.
    agree = sum(o.outputs[0].token_ids[0] == hf.greedy(path, p)[0] for o, p in zip(out, prompts))
    assert agree >= 3


def test_dummy_weights_need_only_config(tiny_models, tmp_path):
    path = tmp_path / "dummy"
    path.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tiny_models['llama3']}/{name}", path / name)
    llm = LLM(str(path), load_format="dummy", block_size=8, max_model_len=64, device="cpu")
    out = llm.generate(["hello"], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_text_prompts_chat_and_order(tiny_models, hf):
    path = tiny_models["qwen2"]
    llm = LLM(path, block_size=8, max_model_len=256, device="cpu")
    tok = llm.get_tokenizer()
    prompts = ["def step(self):", "x", "class Scheduler:\n    def schedule(self):\n        return"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    for o, p in zip(outs, prompts):
        assert o.prompt_token_ids == tok.encode(p)
        assert o.outputs[0].token_ids == hf.greedy(path, tok.encode(p), max_new_tokens=6)
        assert o.outputs[0].text == tok.decode(o.outputs[0].token_ids, skip_special_tokens=True)
    messages = [{"role": "user", "content": "hi there"}]
    chat = llm.chat(messages, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert chat.prompt_token_ids == list(want)
    assert chat.outputs[0].token_ids == hf.greedy(path, list(want), max_new_tokens=5)
    # A repeated prompt reuses its cached blocks.
    again = llm.generate([prompts[2]] * 2, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert again[0].num_cached_tokens > 0


def test_transformers_4_rope_config_reads_the_same(tiny_models, tmp_path):
    """Older checkpoints keep rope_theta and rope_scaling at the top level instead of rope_parameters."""
    from pagoda.runtime.model_config import ModelConfig

    new = ModelConfig.from_path(Path(tiny_models["llama3"]))
    path = tmp_path / "v4"
    path.mkdir()
    config = json.loads(Path(tiny_models["llama3"], "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    (path / "config.json").write_text(json.dumps(config))
    old = ModelConfig.from_path(path)
    assert (old.rope_theta, old.rope_scaling["rope_type"]) == (new.rope_theta, "llama3") == (500000.0, "llama3")
    assert old.rope_scaling["factor"] == new.rope_scaling["factor"] == 8.0


def test_max_num_seqs_defaults_by_gpu_memory(tiny_models, monkeypatch):
    """1024 seats on a GPU of 70 GiB or more, 256 elsewhere (vLLM's defaults); a given value wins."""
    from types import SimpleNamespace

    from pagoda.runtime.core import engine_core as engine_module

    assert engine_module.default_max_num_seqs(torch.device("cpu")) == 256
    for gib, want in ((80, 1024), (40, 256)):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device, gib=gib: SimpleNamespace(total_memory=gib * 2**30))
        assert engine_module.default_max_num_seqs(torch.device("cuda", 0)) == want
    llm = LLM(model=str(tiny_models["llama"]), device="cpu")
    assert llm.llm_engine.args.max_num_seqs == 256
    assert llm.llm_engine.scheduler.max_num_seqs == 256
    assert LLM(model=str(tiny_models["llama"]), device="cpu", max_num_seqs=7).llm_engine.scheduler.max_num_seqs == 7
