"""FP8 mixture-of-experts checkpoints (Mixtral, Qwen3-MoE) in both formats vLLM reads, and
--quantization fp8 on a bf16 MoE checkpoint, on the CPU, where FP8 experts are dequantized at load.

The references, as for the dense FP8 tests (test_fp8_checkpoints.py). compressed-tensors:
transformers' own loader, which decompresses the experts through the compressed-tensors package
(CompressedTensorsConfig(dequantize=True)) into its stacked expert tensors. quant_method fp8:
transformers 5 reads `fp8` as its block-wise FineGrainedFP8 and drops these weight_scale tensors, so
the reference there is transformers' model of the original checkpoint with every projection and
every expert matrix set to q * weight_scale (fp8_checkpoints.dequantized_reference).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.quantization.scheme import UnsupportedQuantization
from pagoda.runtime.worker.model_loader import load_model

from .fp8_checkpoints import dequantize, quantize, write_fp8_checkpoint
from .test_fp8_checkpoints import NEEDS_CT, assert_greedy_matches, cases, reference
from .test_logits_parity import ATOL, engine_logits

FAMILIES = ("mixtral", "qwen3_moe")
# (format, per-channel weights, static activations): llm-compressor's FP8-dynamic recipe (channel,
# per token) and vLLM's per-tensor fp8 with static scales, then the other two combinations
FORMATS = [("compressed-tensors", True, False), ("fp8", False, True), ("compressed-tensors", False, True),
           ("fp8", True, False)]
EXPERT_W1 = {"mixtral": "model.layers.0.block_sparse_moe.experts.1.w1", "qwen3_moe": "model.layers.0.mlp.experts.1.gate_proj"}


@pytest.fixture(scope="module")
def moe_checkpoints(tiny_models, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fp8-moe")
    made = {}
    for family in FAMILIES:
        for fmt, per_channel, static in FORMATS:
            dst = root / f"{family}-{fmt}-{'channel' if per_channel else 'tensor'}-{'static' if static else 'dynamic'}"
            made[family, fmt, per_channel, static] = write_fp8_checkpoint(
                Path(tiny_models[family]), dst, fmt, per_channel=per_channel, static=static)
    return made


def test_checkpoint_holds_fp8_experts_with_the_formats_scales(moe_checkpoints):
    from safetensors.torch import load_file

    for family in FAMILIES:
        channel = load_file(moe_checkpoints[family, "compressed-tensors", True, False] / "model.safetensors")
        tensor = load_file(moe_checkpoints[family, "fp8", False, True] / "model.safetensors")
        w1 = EXPERT_W1[family]
        assert channel[f"{w1}.weight"].dtype == torch.float8_e4m3fn
        assert channel[f"{w1}.weight_scale"].shape == (channel[f"{w1}.weight"].shape[0], 1)
        assert tensor[f"{w1}.weight_scale"].shape == (1,) and tensor[f"{w1}.input_scale"].shape == (1,)
        router = w1.split(".experts.")[0] + ".gate.weight"
        assert channel[router].dtype == torch.float32 and f"{router[:-7]}.weight_scale" not in channel


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fmt,per_channel,static", cases(FORMATS))
def test_fp8_moe_checkpoint_logits_match_transformers(tiny_models, moe_checkpoints, family, fmt, per_channel,
                                                      static):
    src, dst = Path(tiny_models[family]), moe_checkpoints[family, fmt, per_channel, static]
    rng = random.Random(8)
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in (40, 44)]
    got = engine_logits(str(dst), seqs)
    model = reference(src, dst, fmt)
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            want = model(torch.tensor([seq])).logits[0]
        err = (got[s] - want).abs().max()
        assert err <= ATOL, f"sequence {s}: off by {err:.2e}"
    from transformers import AutoModelForCausalLM

    with torch.no_grad():  # the FP8 round trip shows: not the original weights' logits
        original = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()(torch.tensor([seqs[0]]))
    assert (got[0] - original.logits[0]).abs().max() > 100 * ATOL


@pytest.mark.parametrize("family,fmt", cases([("mixtral", "fp8"), ("qwen3_moe", "compressed-tensors")],
                                             lambda row: row[1]))
def test_fp8_moe_greedy_output_matches_transformers(tiny_models, moe_checkpoints, family, fmt):
    per_channel = fmt == "compressed-tensors"
    src, dst = Path(tiny_models[family]), moe_checkpoints[family, fmt, per_channel, not per_channel]
    model = reference(src, dst, fmt)
    assert_greedy_matches(dst, model)


def test_online_quantization_quantizes_every_expert_per_channel(tiny_models):
    """--quantization fp8 on a bf16/fp32 MoE checkpoint: every expert's gate, up and down become
    their per-channel FP8 round trips (dequantized on the CPU); the router stays as it was."""
    cfg = ModelConfig.from_path(Path(tiny_models["mixtral"]), "float32")
    plain = load_model(cfg, torch.device("cpu"))
    fp8 = load_model(cfg, torch.device("cpu"), quantization="fp8")
    for name in ("w13", "w2"):
        w = getattr(plain.model.layers[1].mlp, name)
        for e in range(w.shape[0]):
            q, scale = quantize(w[e], per_channel=True)
            assert torch.equal(getattr(fp8.model.layers[1].mlp, name)[e], dequantize(q, scale))
    assert not torch.equal(fp8.model.layers[1].mlp.w2, plain.model.layers[1].mlp.w2)
    assert torch.equal(fp8.model.layers[1].mlp.gate.weight, plain.model.layers[1].mlp.gate.weight)


@pytest.mark.parametrize("fmt,per_channel,static", cases([("fp8", False, True), ("compressed-tensors", True, False)]))
def test_fp8_experts_stay_fp8_on_an_fp8_gpu_with_the_checkpoints_scales(moe_checkpoints, monkeypatch, fmt,
                                                                        per_channel, static):
    """The GPU's loading, run on the CPU (has_fp8_matmul patched): the experts keep the checkpoint's
    e4m3 bytes, each expert matrix's scale on its rows (gate and up their own, per tensor or per
    channel), and one static input scale per GEMM, the largest over the experts and over gate and up
    (vLLM's). The block's forward (W8A8, torch reference on the CPU) equals fused_moe_fp8_ref on
    those tensors, and weight-only (ops.MOE_FP8_W8A8 off) the dequantized experts' output."""
    from safetensors.torch import load_file

    from pagoda.kernels import ops
    from pagoda.kernels.fused_moe_ref import fused_moe_fp8_ref, fused_moe_ref
    from pagoda.runtime.quantization import fp8_linear

    monkeypatch.setattr(fp8_linear, "has_fp8_matmul", lambda device: True)
    dst = moe_checkpoints["mixtral", fmt, per_channel, static]
    model = load_model(ModelConfig.from_path(dst, "float32", 256), torch.device("cpu"))
    tensors = load_file(dst / "model.safetensors")
    block = model.model.layers[0].mlp
    assert block.w13.dtype == block.w2.dtype == torch.float8_e4m3fn
    prefix = "model.layers.0.block_sparse_moe.experts"
    inter = block.inter
    for e in range(block.num_experts):
        for part, rows in (("w1", slice(0, inter)), ("w3", slice(inter, 2 * inter))):
            assert torch.equal(block.w13[e, rows].view(torch.uint8), tensors[f"{prefix}.{e}.{part}.weight"].view(torch.uint8))
            want = tensors[f"{prefix}.{e}.{part}.weight_scale"].reshape(-1).expand(inter)
            assert torch.equal(block.w13_weight_scale[e, rows], want)
        assert torch.equal(block.w2_weight_scale[e], tensors[f"{prefix}.{e}.w2.weight_scale"].reshape(-1).expand(
            block.w2.shape[1]))
    if static:
        for name, parts in (("w13_input_scale", ("w1", "w3")), ("w2_input_scale", ("w2",))):
            want = max(float(tensors[f"{prefix}.{e}.{p}.input_scale"]) for e in range(block.num_experts) for p in parts)
            assert float(getattr(block, name)) == want
    x = torch.randn(7, block.w13.shape[2])
    weights, ids = ops.moe_route(block.gate(x), block.top_k, block.renormalize)
    w8a8 = fused_moe_fp8_ref(x, block.w13, block.w2, block.w13_weight_scale, block.w2_weight_scale, weights, ids,
                             activations=block.fp8.activations, a13_scale=getattr(block, "w13_input_scale", None),
                             a2_scale=getattr(block, "w2_input_scale", None))
    torch.testing.assert_close(block(x), w8a8, rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(ops, "MOE_FP8_W8A8", False)
    dequantized = (block.w13.float() * block.w13_weight_scale[..., None], block.w2.float() * block.w2_weight_scale[..., None])
    weight_only = fused_moe_ref(x, *dequantized, weights, ids)
    torch.testing.assert_close(block(x), weight_only, rtol=1e-5, atol=1e-5)
    assert (w8a8 - weight_only).abs().max() > 1e-4  # the activations were quantized


def _with_config(src: Path, dst: Path, edit) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_block_wise_fp8_moe_checkpoint_fails_at_load_naming_it(moe_checkpoints, tmp_path):
    def block_wise(config):
        config["quantization_config"]["weight_block_size"] = [128, 128]

    path = _with_config(moe_checkpoints["mixtral", "fp8", False, True], tmp_path / "m", block_wise)
    with pytest.raises(UnsupportedQuantization, match="block-wise FP8.*supported"):
        load_model(ModelConfig.from_path(path), torch.device("cpu"))


@NEEDS_CT
def test_experts_quantized_only_in_part_fail_at_load(moe_checkpoints, tmp_path):
    """An ignore list that leaves one expert of a block unquantized: the block's experts are one
    fused tensor, so they must be quantized alike (as the parts of q|k|v must)."""
    def ignore_one(config):
        config["quantization_config"]["ignore"].append("model.layers.0.mlp.experts.2.down_proj")

    path = _with_config(moe_checkpoints["qwen3_moe", "compressed-tensors", True, False], tmp_path / "m", ignore_one)
    with pytest.raises(UnsupportedQuantization, match="quantized alike"):
        load_model(ModelConfig.from_path(path), torch.device("cpu"))


def test_fp8_router_is_refused_naming_it(moe_checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    src = moe_checkpoints["mixtral", "fp8", True, False]
    dst = _with_config(src, tmp_path / "m", lambda config: None)
    tensors = load_file(dst / "model.safetensors")
    router = "model.layers.1.block_sparse_moe.gate.weight"
    q, scale = quantize(tensors[router], per_channel=True)
    tensors[router], tensors[router[:-7] + ".weight_scale"] = q, scale
    save_file(tensors, dst / "model.safetensors")
    with pytest.raises(ValueError, match="router"):
        load_model(ModelConfig.from_path(dst), torch.device("cpu"))


def test_plan_counts_fp8_expert_bytes_as_the_checkpoint_holds_them(moe_checkpoints, tiny_models):
    """`pagoda plan` on an FP8 MoE checkpoint: the experts at one byte per weight plus a float32
    scale per output row, like the projections, the routers in the checkpoint's dtype; the same
    bytes for --quantization fp8 on the plain checkpoint."""
    from safetensors import safe_open

    from pagoda.runtime.plan import make_plan

    for family in FAMILIES:
        dst = moe_checkpoints[family, "compressed-tensors", True, False]
        with safe_open(dst / "model.safetensors", framework="pt") as f:
            stored = sum(f.get_tensor(k).nbytes for k in f.keys())
            expert_params = sum(f.get_slice(k).get_shape()[0] * f.get_slice(k).get_shape()[1] for k in f.keys()
                                if ".experts." in k and k.endswith(".weight"))
        plan = make_plan(str(dst), 1.0)
        assert plan["weight_bytes"] == stored and plan["weight_dtype"] == "fp8"
        assert make_plan(tiny_models[family], 1.0, quantization="fp8")["weight_bytes"] == stored
        # the fp32 plan holds the experts at 4 bytes: at least 3 more per expert weight, less their scales
        assert make_plan(tiny_models[family], 1.0)["weight_bytes"] - stored > 2.5 * expert_params


@NEEDS_CT
def test_each_rank_holds_its_slice_of_the_fp8_experts_and_their_scales(moe_checkpoints, monkeypatch):
    """Tensor parallelism over FP8 experts (kept FP8: has_fp8_matmul patched): each rank holds its
    rows of every expert's gate and up with their per-channel scales, its columns of down with all
    of down's row scales; the two ranks' partial outputs add up to the unsplit block's, weight-only.
    (W8A8 quantizes each rank's half of the activation by its own per-token amax, as vLLM does, so
    there the sum is close to, not equal to, the unsplit block's.)"""
    from safetensors.torch import load_file

    from pagoda.kernels import ops
    from pagoda.runtime.layers.parallel_state import TensorParallelGroup, tensor_parallel
    from pagoda.runtime.quantization import fp8_linear, fp8_moe

    monkeypatch.setattr(fp8_linear, "has_fp8_matmul", lambda device: True)
    monkeypatch.setattr(ops, "MOE_FP8_W8A8", False)
    dst = moe_checkpoints["qwen3_moe", "compressed-tensors", True, False]
    cfg = ModelConfig.from_path(dst, "float32", 256)
    tensors = load_file(dst / "model.safetensors")
    whole = load_model(cfg, torch.device("cpu")).model.layers[2].mlp
    x = torch.randn(5, whole.w13.shape[2])
    weights, ids = ops.moe_route(whole.gate(x), whole.top_k, whole.renormalize)
    partials = []
    for rank in (0, 1):
        with tensor_parallel(TensorParallelGroup(rank=rank, size=2)):
            block = load_model(cfg, torch.device("cpu")).model.layers[2].mlp
        p = "model.layers.2.mlp.experts"
        for e in range(block.num_experts):
            gate, up = (tensors[f"{p}.{e}.{n}_proj.weight"].chunk(2)[rank] for n in ("gate", "up"))
            assert torch.equal(block.w13[e].view(torch.uint8), torch.cat([gate, up]).view(torch.uint8))
            scales = torch.cat([tensors[f"{p}.{e}.{n}_proj.weight_scale"].chunk(2)[rank] for n in ("gate", "up")])
            assert torch.equal(block.w13_weight_scale[e], scales.reshape(-1))
            assert torch.equal(block.w2_weight_scale[e], tensors[f"{p}.{e}.down_proj.weight_scale"].reshape(-1))
        partials.append(fp8_moe.apply(block, x, weights, ids))
    torch.testing.assert_close(partials[0] + partials[1], fp8_moe.apply(whole, x, weights, ids), rtol=1e-5,
                               atol=1e-5)


@NEEDS_CT
def test_weight_only_fp8_experts_kept_fp8_match_transformers(tiny_models, moe_checkpoints, monkeypatch, tmp_path):
    """A weight-only compressed-tensors scheme (no input_activations) on an FP8 GPU, run on the CPU
    (has_fp8_matmul patched): the dense projections are dequantized (the scheme quantizes weights
    only), the experts stay e4m3 and run weight-only (W8A16) through the engine, and the logits equal
    transformers' on the same checkpoint."""
    from pagoda.runtime.quantization import fp8_linear

    def weight_only(config):
        del config["quantization_config"]["config_groups"]["group_0"]["input_activations"]

    dst = _with_config(moe_checkpoints["qwen3_moe", "compressed-tensors", True, False], tmp_path / "m", weight_only)
    monkeypatch.setattr(fp8_linear, "has_fp8_matmul", lambda device: True)
    model = load_model(ModelConfig.from_path(dst, "float32", 256), torch.device("cpu"))
    assert model.model.layers[0].mlp.w13.dtype == torch.float8_e4m3fn
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
    rng = random.Random(9)
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in (40, 44)]
    got = engine_logits(str(dst), seqs)
    want = reference(Path(tiny_models["qwen3_moe"]), dst, "compressed-tensors")
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            err = (got[s] - want(torch.tensor([seq])).logits[0]).abs().max()
        assert err <= ATOL, f"sequence {s}: off by {err:.2e}"
