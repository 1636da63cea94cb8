"""Tiny FP8 checkpoints in the two formats Pagoda reads, written with the formats' own arithmetic.

From a tiny bf16/fp32 Hugging Face checkpoint, every attention and MLP projection weight, and every
MoE expert's gate, up and down matrix (Mixtral's experts.N.w1/w3/w2, Qwen3-MoE's
experts.N.gate_proj/up_proj/down_proj; the routers stay as they are, as llm-compressor leaves them),
becomes float8_e4m3fn with float32 scales: scale = amax / 448 over the output channel (row) or the whole
tensor, q = clamp(w / scale, +-448) rounded to nearest by the cast, w ~= q * scale. That is
compressed-tensors' float strategy "channel"/"tensor" and vLLM's fp8 per-tensor/per-channel
weight_scale. Static activation scales (input_scale) and KV-cache scales (k_scale, v_scale) are
calibrated the same way, from the largest value each sees on a calibration prompt (an expert's,
from the tokens routed to it).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

# (an image-text checkpoint's language model under language_model.model. or model.language_model.)
PROJECTION = re.compile(r"((?:language_model\.)?model\.(?:language_model\.)?layers\.\d+\."
                        r"(?:self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj"
                        r"|(?:mlp|block_sparse_moe)\.experts\.\d+\.(?:w[123]|gate_proj|up_proj|down_proj)))\.weight")
# model_type -> (the checkpoint's name of the expert block, its experts' gate, up and down names)
EXPERT_NAMES = {"mixtral": ("block_sparse_moe", ("w1", "w3", "w2")),
                "qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj"))}
FP8_MAX = 448.0


def quantize(w: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    w = w.float()
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().reshape(1)
    scale = amax / FP8_MAX
    return (w / (scale if per_channel else scale[0])).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * (scale.float() if scale.dim() == 2 else scale.float().reshape(()))


def calibrate(src: Path) -> dict[str, float]:
    """amax of each projection's input and of each layer's keys and values (before rotary) on a prompt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    seen: dict[str, float] = {}

    def hook(name):
        def record(module, inputs, output):
            seen[f"{name}.input"] = max(seen.get(f"{name}.input", 0.0), float(inputs[0].abs().max()))
            seen[f"{name}.output"] = max(seen.get(f"{name}.output", 0.0), float(output.abs().max()))
        return record

    def experts_hook(name):  # transformers 5 stacks the experts: find each one's tokens, as it does
        block, (gate, up, down) = EXPERT_NAMES[model.config.model_type]
        ckpt = name.replace(".mlp.experts", f".{block}.experts")

        def record(module, inputs, output):
            hidden, top_k_index = inputs[0], inputs[1]
            for e in range(module.num_experts):
                tokens = (top_k_index == e).any(dim=-1).nonzero()[:, 0]
                if tokens.numel():
                    g, u = torch.nn.functional.linear(hidden[tokens], module.gate_up_proj[e]).chunk(2, dim=-1)
                    inner = module.act_fn(g) * u
                    for part, value in ((gate, hidden[tokens]), (up, hidden[tokens]), (down, inner)):
                        key = f"{ckpt}.{e}.{part}.input"
                        seen[key] = max(seen.get(key, 0.0), float(value.abs().max()))
        return record

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(hook(name))
        elif hasattr(module, "gate_up_proj") and hasattr(module, "num_experts"):
            module.register_forward_hook(experts_hook(name))
    with torch.no_grad():
        model(torch.arange(5, 69)[None])
    return seen


def quantization_config(fmt: str, per_channel: bool, static: bool, kv_scales: bool,
                        ignore: tuple[str, ...] = ("lm_head",)) -> dict:
    if fmt == "fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "static" if static else "dynamic",
                "ignored_layers": list(ignore)}
    activations = ({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
                   if static else
                   {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True})
    kv = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel" if per_channel else "tensor",
                        "dynamic": False, "symmetric": True},
            "input_activations": activations,
        }},
        "ignore": list(ignore),
        "kv_cache_scheme": kv if kv_scales else None,
    }


def write_fp8_checkpoint(src: Path, dst: Path, fmt: str, *, per_channel: bool = True, static: bool = False,
                         kv_scales: bool = False, ignore: tuple[str, ...] = ("lm_head",),
                         keep: tuple[str, ...] = ()) -> Path:
    """dst: src's files, its projections in FP8 (fmt "fp8" or "compressed-tensors"), one safetensors file.
    ignore: the quantization_config's list, as written (the exporting tool's module names); keep: the
    checkpoint's projection modules it names, left in src's dtype, as the tool leaves them."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(f))
    amax = calibrate(src) if static or kv_scales else {}
    out = {}
    for name, t in tensors.items():
        match = PROJECTION.fullmatch(name)
        if match is None or match.group(1) in keep:
            out[name] = t
            continue
        module = match.group(1)
        q, scale = quantize(t, per_channel)
        out[name], out[f"{module}.weight_scale"] = q, scale
        if static:  # an expert no calibration token reached takes the largest its block's experts saw
            block, _, part = module.rsplit(".", 2)
            calibrated = amax.get(f"{module}.input") or max(
                v for k, v in amax.items() if k.startswith(block) and k.endswith(f".{part}.input"))
            out[f"{module}.input_scale"] = torch.tensor([calibrated / FP8_MAX])
        if kv_scales and module.endswith(("k_proj", "v_proj")):
            kv_name = module.replace("k_proj", "k_scale").replace("v_proj", "v_scale")
            out[kv_name] = torch.tensor(amax[f"{module}.output"] / FP8_MAX * 1.25)  # rotary may grow k a bit
    save_file(out, dst / "model.safetensors")
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = quantization_config(fmt, per_channel, static, kv_scales, ignore)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def dequantized_reference(src: Path, fp8_dir: Path):
    """transformers' model of src with every projection replaced by its FP8 checkpoint's q * scale."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    tensors = load_file(fp8_dir / "model.safetensors")
    params = dict(model.named_parameters())
    for name, q in tensors.items():
        if match := PROJECTION.fullmatch(name):
            w = dequantize(q, tensors[f"{match.group(1)}.weight_scale"])
            if name in params:
                params[name].data.copy_(w)
            else:  # one expert's matrix: its rows (gate, up) or the whole of its slot (down) in the stack
                _set_expert(model, params, name, w)
    return model


EXPERT_MATRIX = re.compile(r"(model\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")


def _set_expert(model, params: dict, name: str, w: torch.Tensor) -> None:
    layer, e, part = EXPERT_MATRIX.fullmatch(name).groups()
    gate, up, down = EXPERT_NAMES[model.config.model_type][1]
    if part == down:
        params[f"{layer}.mlp.experts.down_proj"].data[int(e)].copy_(w)
    else:
        rows = w.shape[0]
        start = 0 if part == gate else rows
        assert part in (gate, up)
        params[f"{layer}.mlp.experts.gate_up_proj"].data[int(e), start:start + rows].copy_(w)
