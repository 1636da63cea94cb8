"""FP8 checkpoints in both formats vLLM reads (quant_method fp8, compressed-tensors float-quantized)
and --quantization fp8, on the CPU, where FP8 weights are dequantized at load.

The references. compressed-tensors: transformers' own loader, which decompresses through the
compressed-tensors package (CompressedTensorsConfig(dequantize=True)). quant_method fp8: transformers
5 reads `fp8` as its FineGrainedFP8 (DeepSeek's weight_scale_inv, block-wise) and drops vLLM's
weight_scale tensors, so its output is wrong for these checkpoints; the reference there is
transformers' model of the original checkpoint with each projection set to q * weight_scale.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.quantization.scheme import UnsupportedQuantization
from pagoda.runtime.worker.model_loader import load_model

from .conftest import make_prompts
from .fp8_checkpoints import dequantize, dequantized_reference, quantize, write_fp8_checkpoint
from .test_logits_parity import ATOL, engine_logits

# compressed-tensors is a runtime dependency (pyproject.toml), so `make test` always has it; a
# developer venv made before it was added lacks it, and these cases then say so instead of failing.
NEEDS_CT = pytest.mark.skipif(importlib.util.find_spec("compressed_tensors") is None,
                              reason="pip install compressed-tensors (a runtime dependency of pyproject.toml)")
FORMATS = [("fp8", True, False), ("fp8", False, True), ("compressed-tensors", True, False),
           ("compressed-tensors", False, True)]  # (format, per-channel weights, static activations)


def cases(rows, fmt_of=lambda row: row[0]):
    return [pytest.param(*row, marks=NEEDS_CT) if fmt_of(row) == "compressed-tensors" else row for row in rows]


def reference(src: Path, dst: Path, fmt: str):
    if fmt == "fp8":
        return dequantized_reference(src, dst)
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    return AutoModelForCausalLM.from_pretrained(
        dst, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)).eval()


@pytest.fixture(scope="module")
def checkpoints(tiny_models, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fp8")
    src = Path(tiny_models["llama"])
    made = {}
    for fmt, per_channel, static in FORMATS:
        dst = root / f"{fmt}-{'channel' if per_channel else 'tensor'}-{'static' if static else 'dynamic'}"
        made[fmt, per_channel, static] = write_fp8_checkpoint(src, dst, fmt, per_channel=per_channel, static=static)
    return made


def test_checkpoint_holds_fp8_weights_with_the_formats_scales(checkpoints):
    from safetensors.torch import load_file

    tensors = load_file(checkpoints["compressed-tensors", True, False] / "model.safetensors")
    w = tensors["model.layers.0.mlp.down_proj.weight"]
    scale = tensors["model.layers.0.mlp.down_proj.weight_scale"]
    assert w.dtype == torch.float8_e4m3fn and scale.shape == (w.shape[0], 1)
    # every row's largest element sits on e4m3's largest value, 448
    assert torch.equal(w.float().abs().amax(dim=1), torch.full((w.shape[0],), 448.0))


@pytest.mark.parametrize("fmt,per_channel,static", cases(FORMATS))
def test_fp8_checkpoint_logits_match_transformers(tiny_models, checkpoints, fmt, per_channel, static):
    src, dst = Path(tiny_models["llama"]), checkpoints[fmt, per_channel, static]
    rng = random.Random(5)
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in (40, 44)]
    got = engine_logits(str(dst), seqs)
    model = reference(src, dst, fmt)
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            want = model(torch.tensor([seq])).logits[0]
        err = (got[s] - want).abs().max()
        assert err <= ATOL, f"sequence {s}: off by {err:.2e}"


@pytest.mark.parametrize("fmt", ["fp8", pytest.param("compressed-tensors", marks=NEEDS_CT)])
def test_fp8_checkpoint_greedy_output_matches_transformers(tiny_models, checkpoints, fmt):
    src, dst = Path(tiny_models["llama"]), checkpoints[fmt, True, False]
    model = reference(src, dst, fmt)
    assert_greedy_matches(dst, model)


def assert_greedy_matches(dst, model) -> None:
    """The engine's greedy output on checkpoint dst, in fp32, equals transformers' model's."""
    from pagoda.runtime import LLM, SamplingParams

    prompts = make_prompts(3, [3, 9, 17, 33])
    llm = LLM(str(dst), dtype="float32", block_size=8, num_kv_blocks=64, max_model_len=128, device="cpu")
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=10,
                                                                                   ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                                  min_new_tokens=10)[0, len(prompt):].tolist()
        assert list(out.outputs[0].token_ids) == want


def test_online_quantization_is_per_channel_fp8_of_the_bf16_weights(tiny_models):
    """--quantization fp8 on a plain checkpoint: each projection becomes its per-channel FP8 round
    trip (dequantized on the CPU), while embeddings, norms and the LM head stay as they were."""
    path = Path(tiny_models["llama"])
    cfg = ModelConfig.from_path(path, "float32")
    plain = load_model(cfg, torch.device("cpu"))
    fp8 = load_model(cfg, torch.device("cpu"), quantization="fp8")
    w = plain.model.layers[1].mlp.gate_up_proj.weight
    q, scale = quantize(w, per_channel=True)
    assert torch.equal(fp8.model.layers[1].mlp.gate_up_proj.weight, dequantize(q, scale))
    assert not torch.equal(fp8.model.layers[1].mlp.gate_up_proj.weight, w)
    assert torch.equal(fp8.lm_head.weight, plain.lm_head.weight)
    assert torch.equal(fp8.model.embed_tokens.weight, plain.model.embed_tokens.weight)


def _with_quantization(tiny_models, tmp_path, quantization_config: dict) -> Path:
    src = Path(tiny_models["llama"])
    dst = tmp_path / "model"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("quantization_config,named", cases([
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
     "block-wise FP8"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "'gptq'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                                           "symmetric": True}}}}, "pack-quantized"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                           "block_structure": [128, 128], "symmetric": True}}}},
     "8-bit float by block"),
], lambda row: row[0]["quant_method"]))
def test_unsupported_scheme_fails_at_load_naming_it(tiny_models, tmp_path, quantization_config, named):
    path = _with_quantization(tiny_models, tmp_path, quantization_config)
    with pytest.raises(UnsupportedQuantization) as caught:
        load_model(ModelConfig.from_path(path), torch.device("cpu"))
    message = str(caught.value)
    assert named in message
    assert "compressed-tensors float-quantized" in message or "supported" in message


def test_quantization_and_kv_cache_dtype_knobs():
    import argparse

    from pagoda.runtime.engine_args import EngineArgs

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    args = EngineArgs.from_cli_args(parser.parse_args(["--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3"]),
                                    model="m")
    assert (args.quantization, args.kv_cache_dtype) == ("fp8", "fp8_e4m3")
    with pytest.raises(SystemExit):
        parser.parse_args(["--quantization", "int4"])
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineArgs(model="m", kv_cache_dtype="fp16")
    with pytest.raises(ValueError, match="quantization"):
        EngineArgs(model="m", quantization="awq")


def test_fp8_kv_cache_reads_checkpoint_scales_and_stays_close(tiny_models, tmp_path):
    """--kv-cache-dtype fp8 with a checkpoint that ships k_scale/v_scale: a one-byte cache, the
    scales in every attention layer, and prompt logprobs close to the full-precision cache's."""
    from pagoda.runtime import LLM, SamplingParams

    dst = write_fp8_checkpoint(Path(tiny_models["llama"]), tmp_path / "kv", "fp8", kv_scales=True)
    prompts = make_prompts(4, [40, 57])
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    logprobs = {}
    for kv in ("auto", "fp8"):
        llm = LLM(str(dst), dtype="float32", block_size=8, num_kv_blocks=64, max_model_len=128, device="cpu",
                  kv_cache_dtype=kv)
        runner = llm.llm_engine.runner
        if kv == "fp8":
            assert runner.kv_cache.dtype == torch.float8_e4m3fn
            layer = runner.model.attention_layers()[1]
            assert layer.k_scale != 1.0 and layer.v_scale != 1.0
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        logprobs[kv] = torch.tensor([out.prompt_logprobs[i][p[i]].logprob for p, out in zip(prompts, outs)
                                     for i in range(1, len(p))])
    diff = (logprobs["fp8"] - logprobs["auto"]).abs()
    # e4m3 keeps 3 mantissa bits: a few hundredths of a nat on average on this tiny random model
    assert 0 < diff.mean() < 0.06 and diff.max() < 0.3, (diff.mean(), diff.max())


def test_plan_counts_fp8_bytes_as_the_checkpoint_holds_them(checkpoints, tiny_models):
    """`pagoda plan` on an FP8 checkpoint: its weight bytes are the checkpoint's own (projections at
    one byte plus a float32 scale per row, the rest as stored); an FP8 cache holds a byte per
    element; --quantization fp8 on the plain checkpoint counts the same weights."""
    from safetensors import safe_open

    from pagoda.runtime.plan import make_plan

    dst = checkpoints["compressed-tensors", True, False]
    with safe_open(dst / "model.safetensors", framework="pt") as f:
        stored = sum(f.get_tensor(k).nbytes for k in f.keys())
    fp8 = make_plan(str(dst), 1.0, kv_cache_dtype="fp8")
    assert fp8["weight_bytes"] == stored and fp8["weight_dtype"] == "fp8"
    plain = make_plan(tiny_models["llama"], 1.0)  # float32 weights and cache
    assert fp8["kv_bytes_per_token"] * 4 == plain["kv_bytes_per_token"]
    assert fp8["num_kv_blocks"] > plain["num_kv_blocks"]
    assert make_plan(tiny_models["llama"], 1.0, quantization="fp8")["weight_bytes"] == stored


@NEEDS_CT
def test_plan_counts_a_layer_the_checkpoint_leaves_unquantized_as_stored(tiny_models, tmp_path):
    """The scheme's ignore list, as the loader reads it: a projection the checkpoint keeps in its
    own dtype counts at that dtype (a count that took every projection as FP8 would be short)."""
    from safetensors import safe_open

    from pagoda.runtime.memory import count_weight_bytes
    from pagoda.runtime.plan import make_plan

    kept = "model.layers.1.mlp.down_proj"
    dst = write_fp8_checkpoint(Path(tiny_models["llama"]), tmp_path / "fp8", "compressed-tensors",
                               ignore=("lm_head", kept), keep=(kept,))
    with safe_open(dst / "model.safetensors", framework="pt") as f:
        stored = sum(f.get_tensor(k).nbytes for k in f.keys())
        kept_bytes = f.get_tensor(f"{kept}.weight").nbytes
    plan = make_plan(str(dst), 1.0)
    assert plan["weight_bytes"] == stored
    every_projection_fp8 = count_weight_bytes(ModelConfig.from_path(dst).hf_config, 4, fp8=True)
    assert stored > every_projection_fp8 and kept_bytes > stored - every_projection_fp8


def test_pagoda_plan_cli_takes_the_fp8_flags(tiny_models, capsys):
    from pagoda.runtime.cli import main

    code = main(["plan", tiny_models["llama"], "--gpu-memory-gib", "1", "--quantization", "fp8",
                 "--kv-cache-dtype", "fp8", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["weight_dtype"] == "fp8" and result["kv_cache_dtype"] == "fp8"


def test_operator_plan_args_carry_the_fp8_settings(tiny_models):
    """A ModelServer's engine.quantization and engine.kvCacheDtype reach the loader's `pagoda plan`."""
    import argparse

    from pagoda.operator.builders.loader_job import plan_args
    from pagoda.operator.spec import ModelServer
    from pagoda.runtime import plan

    body = {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer",
            "metadata": {"name": "m", "namespace": "ml", "uid": "u", "generation": 1},
            "spec": {"model": {"uri": "hf://org/m"}, "engine": {"quantization": "fp8", "kvCacheDtype": "fp8"}}}
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    args = parser.parse_args(plan_args(ModelServer.from_body(body), tiny_models["llama"]))
    assert (args.quantization, args.kv_cache_dtype) == ("fp8", "fp8")


@NEEDS_CT
@pytest.mark.parametrize("per_channel,static", [(True, False), (False, True)])
def test_fp8_matmul_path_matches_transformers_fake_quantized_forward(tiny_models, checkpoints, monkeypatch,
                                                                     per_channel, static):
    """The GPU's path, run on the CPU (torch 2.13 has torch._scaled_mm with row-wise scales there):
    weights stay FP8 and each linear input is quantized (per token, or by the static input_scale)
    before torch._scaled_mm. transformers' compressed-tensors forward without dequantize=True
    fake-quantizes the same inputs, so the two agree to fp32 rounding."""
    from transformers import AutoModelForCausalLM

    from pagoda.runtime.quantization import fp8_linear

    monkeypatch.setattr(fp8_linear, "has_fp8_matmul", lambda device: True)
    dst = checkpoints["compressed-tensors", per_channel, static]
    rng = random.Random(6)
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in (40, 44)]
    got = engine_logits(str(dst), seqs)
    model = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    dequantized = reference(Path(tiny_models["llama"]), dst, "compressed-tensors")
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            want = model(torch.tensor([seq])).logits[0]
            weights_only = dequantized(torch.tensor([seq])).logits[0]
        assert (got[s] - want).abs().max() <= ATOL
        assert (got[s] - weights_only).abs().max() > 10 * ATOL  # the activations were quantized


@pytest.mark.parametrize("fmt,static", cases([("compressed-tensors", False), ("fp8", True)]),
                         ids=["per-token", "static"])
def test_fp8_norms_quantize_their_layers_input_as_the_unfused_pair(checkpoints, monkeypatch, fmt, static):
    """On the FP8 matmul path each decoder layer's input_layernorm and post_attention_layernorm are
    linked to qkv_proj and gate_up_proj, and hand them the norm's output already quantized (per
    token, or by the static input_scale); the logits equal those of the norm, then the layer's own
    quantization, bit for bit (the same arithmetic, one kernel less on the GPU)."""
    from pagoda.kernels import ops
    from pagoda.runtime.quantization import fp8_linear

    monkeypatch.setattr(fp8_linear, "has_fp8_matmul", lambda device: True)
    dst = checkpoints[fmt, not static, static]
    quantized_inputs = []
    matmul = fp8_linear._matmul

    def counting(layer, q, *rest):
        quantized_inputs.append(q.shape)
        return matmul(layer, q, *rest)

    monkeypatch.setattr(fp8_linear, "_matmul", counting)
    cfg = ModelConfig.from_path(dst, "float32", 256)
    model = load_model(cfg, torch.device("cpu"))
    for layer in model.model.layers:
        assert layer.input_layernorm.quantize_for is layer.self_attn.qkv_proj
        assert layer.post_attention_layernorm.quantize_for is layer.mlp.gate_up_proj
    assert model.model.norm.quantize_for is None  # the final norm feeds the bf16 LM head
    assert "quantize_for" not in dict(model.named_modules()).get("model.layers.0.input_layernorm")._modules
    rng = random.Random(7)
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in (40, 44)]
    fused = engine_logits(str(dst), seqs)
    monkeypatch.setattr(ops, "FUSED_NORM_QUANT", False)
    unfused = engine_logits(str(dst), seqs)
    assert quantized_inputs and all(torch.equal(a, b) for a, b in zip(fused, unfused))
