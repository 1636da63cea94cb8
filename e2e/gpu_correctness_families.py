"""gpu_correctness.py's checks for the families of issue 18, on the GPU, against transformers, plus
greedy generation token for token against transformers' generate.

Run on the H200 from the repository root (after `source e2e/gpu_env.sh`):
    python e2e/gpu_correctness_families.py --out "$OUT" [--only NAME...]

The shapes are real checkpoints' widths with fewer layers and random weights (transformers'
default init), so that transformers' fp32 copy fits and the call stays short: Qwen3-8B (q/k
norms), Gemma-2-9B (GeGLU, four norms per block, query_pre_attn_scalar, attention and final
soft-capping, local layers alternating with global ones), Gemma-3-1B (five local layers to one
global, each kind with its rope base, q/k norms), Phi-3-mini (head_dim 96, LongRoPE, and a window on
every layer, so blocks under it are freed as requests move on) and Qwen3-30B-A3B (128 experts,
top-8, through the fused MoE kernel). Every sliding window is cut to 128, shorter than the 256-token
teacher-forced sequences and most greedy prompts.

Each shape runs gpu_correctness.check_shape: teacher-forced logits through prefill, prefix extension
and decode in bf16 (against the measured bf16 noise floor) and fp32 (top-1 at least MIN_TOP1), and
greedy generation with CUDA graphs against eager. Then `greedy_vs_transformers`: in fp32, prompts of
8 to 400 tokens (some sharing prefixes) through the engine with CUDA graphs, chunked prefill and
prefix caching, against transformers' generate one prompt at a time; a token may differ only where
transformers' own top-2 margin at the first divergence is below GREEDY_TIE (a true near-tie).
The JSON goes to --out (a folder or a file); the exit status is 0 only when every shape passes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_correctness as base  # noqa: E402

SHAPES = {
    "qwen3-8b-12l": dict(
        family="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=12,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
    "gemma-2-9b-8l": dict(
        family="gemma2", hidden_size=3584, intermediate_size=14336, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, vocab_size=256000,
        max_position_embeddings=8192, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=128,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    "gemma-3-1b-6l": dict(
        family="gemma3", hidden_size=1152, intermediate_size=6912, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
        max_position_embeddings=32768, rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=128,
        sliding_window_pattern=6,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
    ),
    "phi-3-mini-4l": dict(
        family="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=4,
        num_attention_heads=32, num_key_value_heads=32, head_dim=96, vocab_size=32064,
        max_position_embeddings=131072, original_max_position_embeddings=4096, rms_norm_eps=1e-5,
        sliding_window=128, tie_word_embeddings=False,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
                         "original_max_position_embeddings": 4096,
                         "short_factor": [1.0 + 0.02 * i for i in range(48)],
                         "long_factor": [1.0 + 0.5 * i for i in range(48)]},
    ),
    "qwen3-30b-a3b-4l": dict(
        family="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_local_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        mlp_only_layers=[], vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
}
# transformers has no sdpa path for Gemma 2 (soft-capping); it runs eager attention.
ATTENTION = {"gemma2": "eager"}


GREEDY_TIE = 1e-3  # nats: transformers' own top-2 margin below which a different token is a tie
GREEDY_PROMPTS, GREEDY_TOKENS = 12, 32


def layer_types(family: str, n: int) -> list[str]:
    if family == "gemma2":  # local first, then alternating
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if family == "gemma3":  # five local, then one global
        return ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    if family == "phi3":  # the window on every layer
        return ["sliding_attention"] * n
    return ["full_attention"] * n


def make_checkpoint_dir(root: Path, name: str, shape: dict) -> Path:
    """As base.make_checkpoint_dir, but the layer types follow the family (Gemma's local layers)."""
    from pagoda.runtime.tools.tiny_models import build_tiny_model

    shape = dict(shape)
    family = shape.pop("family")
    path = build_tiny_model(root / name, family)
    for f in path.glob("*.safetensors*"):
        f.unlink()
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(shape)
    cfg["layer_types"] = layer_types(family, cfg["num_hidden_layers"])
    if family == "phi3":  # Phi-3's config.json has no layer_types; the window alone applies it
        del cfg["layer_types"]
    cfg["pagoda_family"] = family
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path


def hf_model(path: Path, seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.from_pretrained(path)
    family = json.loads((path / "config.json").read_text())["pagoda_family"]
    with torch.device(base.DEVICE):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                 attn_implementation=ATTENTION.get(family, "sdpa"))
    return model.eval()


def greedy_prompts(vocab: int) -> list[list[int]]:
    """Lengths on both sides of the window (128), a third of them sharing a 160-token prefix."""
    import random

    rng = random.Random(2)
    prefix = [rng.randrange(10, min(vocab, 30000)) for _ in range(160)]
    prompts = []
    for i in range(GREEDY_PROMPTS):
        n = rng.randint(8, 400 if base.DEVICE == "cuda" else 60)
        fresh = [rng.randrange(10, min(vocab, 30000)) for _ in range(n)]
        prompts.append(prefix[: min(160, n)] + fresh if i % 3 == 0 and base.DEVICE == "cuda" else fresh)
    return prompts


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens, and its top-2 margin (nats of logits) at each of them."""
    import copy

    ids = torch.tensor([prompt], device=base.DEVICE)
    # No EOS at all, as the engine's ignore_eos: min_new_tokens would instead forbid EOS (its logit
    # set to -inf), so where greedy picks EOS the two would part for a reason that is not the model.
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = []
    out = model.generate(ids, generation_config=config, attention_mask=torch.ones_like(ids),
                         max_new_tokens=max_new_tokens, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=0)
    margins = []
    for scores in out.scores:
        top = scores[0].float().topk(2).values
        margins.append(float(top[0] - top[1]))
    return out.sequences[0, len(prompt):].tolist(), margins


def greedy_vs_transformers(path: Path, shape: dict) -> dict:
    """fp32 greedy decoding of the engine (CUDA graphs, chunked prefill, prefix caching) against
    transformers' generate on the same weights."""
    from pagoda.runtime import LLM, SamplingParams

    hf = hf_model(path, seed=0).float()
    llm = LLM(str(path), dtype="float32", device=base.DEVICE, load_format="dummy", max_model_len=2048,
              num_kv_blocks=1024, max_num_seqs=16, max_num_batched_tokens=512, enable_prefix_caching=True)
    llm.llm_engine.runner.model.load_weights(hf.state_dict().items())
    prompts = greedy_prompts(shape["vocab_size"])
    params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                         use_tqdm=False)]
    stats = llm.llm_engine.stats()
    plan = llm.llm_engine.memory_plan
    identical, divergences = 0, []
    for i, (prompt, got) in enumerate(zip(prompts, ours)):
        want, margins = hf_greedy(hf, prompt, GREEDY_TOKENS)
        if got == want:
            identical += 1
            continue
        j = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
        divergences.append({"prompt": i, "prompt_len": len(prompt), "position": j, "hf_margin": margins[j]})
    del llm, hf
    base.free_memory()
    return {
        "prompts": len(prompts),
        "prompt_lens": [len(p) for p in prompts],
        "new_tokens": GREEDY_TOKENS,
        "identical": identical,
        "divergences": divergences,
        "accepted_margin_nats": GREEDY_TIE,
        "prefix_cache_hits": stats.prefix_cache_hits,
        "sliding_window_freed": plan.sliding_window,  # the window blocks are freed under, if any
        "ok": all(d["hf_margin"] <= GREEDY_TIE for d in divergences),
    }


def check_family(root: Path, name: str, shape: dict) -> dict:
    result = base.check_shape(root, name, shape)
    result["greedy_vs_transformers"] = greedy_vs_transformers(root / name, shape)
    result["ok"] = result["ok"] and result["greedy_vs_transformers"]["ok"]
    return result


def main(argv=None) -> int:
    from pagoda.runtime.tools.bench.results import environment

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("e2e/results/gpu-correctness-families.json"))
    parser.add_argument("--only", nargs="*", default=None, help="shape names to run (default: all)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script only)")
    args = parser.parse_args(argv)
    shapes = {k: dict(v) for k, v in SHAPES.items() if not args.only or k in args.only}
    base.make_checkpoint_dir, base.hf_model = make_checkpoint_dir, hf_model
    if args.smoke:
        base.DEVICE = "cpu"
        base.BATCH, base.SEQ_LEN, base.DECODE_STEPS = 2, 40, 4
        for shape in shapes.values():
            shape.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=512)
            if "moe_intermediate_size" in shape:
                shape.update(moe_intermediate_size=32, num_experts=8, num_local_experts=8, num_experts_per_tok=2)
            if "sliding_window" in shape:
                shape.update(sliding_window=12)
            if "query_pre_attn_scalar" in shape:
                shape.update(query_pre_attn_scalar=16)
            if shape["rope_parameters"].get("rope_type") == "longrope":  # one factor per frequency
                rope = shape["rope_parameters"] = dict(shape["rope_parameters"])
                rope.update(short_factor=rope["short_factor"][:8], long_factor=rope["long_factor"][:8])
    env = environment()
    record = {"workload": "gpu-correctness-families", "backend": "pagoda", **env,
              "command": "python " + " ".join(sys.argv), "min_top1": base.MIN_TOP1,
              "bf16_top1_slack": base.BF16_TOP1_SLACK, "bf16_error_ratio": base.BF16_ERROR_RATIO,
              "fp32_tie_nats": base.FP32_TIE, "greedy_tie_nats": GREEDY_TIE, "weight_init": base.WEIGHT_INIT,
              "shapes": {k: {f: v for f, v in s.items() if f != "family"} for k, s in shapes.items()},
              "teacher_forced": {"batch": base.BATCH, "seq_len": base.SEQ_LEN, "decode_steps": base.DECODE_STEPS}}
    root = Path(tempfile.mkdtemp())
    try:
        for name, shape in shapes.items():
            try:
                record[name] = check_family(root, name, shape)
            except Exception as exc:  # report every shape, even when one fails
                import traceback

                record[name] = {"ok": False, "error": traceback.format_exc()[-3000:], "type": type(exc).__name__}
            base.free_memory()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    record["ok"] = all(record[name]["ok"] for name in shapes)
    out = args.out / "gpu-correctness-families.json" if args.out.is_dir() else args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    base.print_table(record, shapes)
    for name in shapes:
        g = record[name].get("greedy_vs_transformers")
        if g:
            print(f"{name:14} fp32 greedy == transformers {g['identical']}/{g['prompts']} prompts "
                  f"(divergence margins: {[round(d['hf_margin'], 5) for d in g['divergences']]}, accepted up to "
                  f"{g['accepted_margin_nats']}; prefix-cache hits {g['prefix_cache_hits']}, "
                  f"window freeing: {g['sliding_window_freed']})")
    print(f"wrote {out}")
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
