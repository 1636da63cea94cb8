"""GPU smoke run of the engine against transformers on the tiny models: python e2e/engine_gpu_smoke.py OUT.json

1. Tiny models on CUDA in fp32 against transformers on the CPU: greedy token agreement.
2. A Llama-3.1-8B-shaped dummy model in bf16: the start-up memory plan and a short batch.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch


def tiny_parity(root: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.tools.tiny_models import build_tiny_model
    from tests.engine.conftest import make_prompts

    results = {}
    prompts = make_prompts()
    for family in ("llama", "llama3", "mistral", "qwen2"):
        path = str(build_tiny_model(root / family, family))
        llm = LLM(path, device="cuda", max_model_len=128, gpu_memory_utilization=0.01, max_num_seqs=4)
        outs = llm.generate(
            prompt_token_ids=prompts,
            sampling_params=SamplingParams(temperature=0, max_tokens=10),
            use_tqdm=False,
        )
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        same = 0
        for p, o in zip(prompts, outs):
            ids = torch.tensor([p])
            want = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)[
                0, len(p) :
            ]
            same += o.outputs[0].token_ids == want.tolist()
        stats = llm.llm_engine.stats()
        results[family] = {"identical": same, "of": len(prompts), "preemptions": stats.num_preemptions}
        del llm
        torch.cuda.empty_cache()
    return results


def dummy_8b(root: Path) -> dict:
    from pagoda.runtime import LLM, SamplingParams

    path = root / "llama8b"
    shutil.copytree(root / "llama3", path, ignore=shutil.ignore_patterns("*.safetensors*"))
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        head_dim=128,
        dtype="bfloat16",
        max_position_embeddings=8192,
    )
    (path / "config.json").write_text(json.dumps(cfg))
    t0 = time.perf_counter()
    llm = LLM(str(path), load_format="dummy", max_model_len=2048)
    startup = time.perf_counter() - t0
    plan = llm.llm_engine.memory_plan.to_dict()
    import random

    rng = random.Random(0)
    prompts = [[rng.randrange(10, 30000) for _ in range(rng.randint(128, 512))] for _ in range(32)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    llm.generate(prompt_token_ids=prompts[:2], sampling_params=params, use_tqdm=False)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "startup_s": startup,
        "plan": plan,
        "output_tokens": n,
        "seconds": elapsed,
        "tok_per_s": n / elapsed,
    }


def main() -> None:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    if not torch.cuda.is_available():
        sys.exit("engine_gpu_smoke.py needs a CUDA GPU")
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("gpu_smoke.json")
    root = Path(tempfile.mkdtemp())
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    for name, fn in (("tiny_parity", tiny_parity), ("dummy_8b", dummy_8b)):
        try:
            result[name] = fn(root)
        except Exception as exc:  # report every part, even when one fails
            import traceback

            result[name] = {"error": traceback.format_exc()[-3000:], "type": type(exc).__name__}
        print(name, json.dumps(result[name], indent=1)[:3000], flush=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
