"""The pooling runner on the GPU: embeddings against transformers, and a throughput figure.

Run on the H200 from the repository root (after `source e2e/gpu_env.sh`):
    python e2e/embeddings_gpu.py [--out e2e/results/embeddings_gpu.json] [--smoke]

1. Correctness, Qwen2.5-0.5B shape, transformers' random weights copied into Pagoda: 24 inputs of
   1 to 1500 tokens with a 512-token step budget (long inputs are chunked), LAST and MEAN pooling.
   fp32 must match transformers' fp32 AutoModel hidden states pooled the same way (max abs error
   at most FP32_MAX_ERR on unit vectors); bf16 must be as close to that fp32 truth as transformers'
   own bf16 run is (its minimum cosine similarity, less BF16_COS_SLACK).
2. Throughput, Llama-3.1-8B shape, dummy bf16 weights, LAST pooling: 2048 inputs of 512 tokens
   through LLM.embed; embeddings/s and prompt tokens/s (a figure, not a target).
The JSON goes to --out; the exit status is 0 only when every check passes.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_correctness as gc_  # noqa: E402  (SHAPES and the checkpoint folder builder)

FP32_MAX_ERR = 1e-3  # on unit vectors; the GPU kernels sum in other orders (and TF32 where torch allows it)
BF16_COS_SLACK = 1e-3
LENGTHS_SEED = 0


def pooled(hidden: torch.Tensor, kind: str) -> torch.Tensor:
    vector = hidden[-1] if kind == "LAST" else hidden.mean(0)
    return torch.nn.functional.normalize(vector.float(), dim=-1)


@torch.inference_mode()
def hf_embeddings(model, inputs, kind: str, device: str) -> list[torch.Tensor]:
    base = model.model
    return [pooled(base(torch.tensor([ids], device=device)).last_hidden_state[0], kind).cpu() for ids in inputs]


def cosines(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
    return [float(torch.dot(x, y)) for x, y in zip(a, b)]


def correctness(root: Path, device: str, smoke: bool) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    from pagoda.runtime import LLM
    from pagoda.runtime.models.pooling_adapter import pooling_weights

    shape = dict(gc_.SHAPES["qwen2.5-0.5b"])
    if smoke:
        shape.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=512)
    path = gc_.make_checkpoint_dir(root, "qwen2.5-0.5b", shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    rng = random.Random(LENGTHS_SEED)
    vocab, top = shape["vocab_size"], 200 if smoke else 1500
    inputs = [[rng.randrange(vocab) for _ in range(n)] for n in [1, 2, 17, top] + [rng.randrange(1, top) for _ in range(20)]]
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)  # the noise floor: transformers' own bf16
    record = {}
    for kind in ("LAST", "MEAN"):
        truth = hf_embeddings(model, inputs, kind, device)
        hf_bf16 = hf_embeddings(model_bf16, inputs, kind, device)
        row = {"hf_bf16_min_cos": min(cosines(hf_bf16, truth))}
        for dtype in ("float32", "bfloat16"):
            llm = LLM(str(path), runner="pooling", pooler_config=json.dumps({"pooling_type": kind}), dtype=dtype,
                      device=device, load_format="dummy", max_model_len=2048, num_kv_blocks=1024,
                      max_num_batched_tokens=512, max_num_seqs=64)
            llm.llm_engine.runner.model.load_weights(pooling_weights(weights.items()))
            got = [torch.tensor(o.outputs.embedding) for o in llm.embed(prompt_token_ids=inputs, use_tqdm=False)]
            row[dtype] = {"min_cos": min(cosines(got, truth)),
                          "max_abs_err": max(float((g - t).abs().max()) for g, t in zip(got, truth))}
            del llm
            gc.collect()
            torch.cuda.empty_cache() if device == "cuda" else None
        row["pass"] = (row["float32"]["max_abs_err"] <= FP32_MAX_ERR
                       and row["bfloat16"]["min_cos"] >= row["hf_bf16_min_cos"] - BF16_COS_SLACK)
        record[kind] = row
    record["lengths"] = [len(i) for i in inputs]
    return record


def throughput(root: Path, device: str, smoke: bool) -> dict:
    from pagoda.runtime import LLM

    shape = dict(gc_.SHAPES["llama-3.1-8b"])
    num, length = (64, 64) if smoke else (2048, 512)
    if smoke:
        shape.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=512)
    path = gc_.make_checkpoint_dir(root, "llama-3.1-8b", shape)
    llm = LLM(str(path), runner="pooling", dtype="bfloat16", device=device, load_format="dummy", max_model_len=4096)
    rng = random.Random(1)
    inputs = [[rng.randrange(shape["vocab_size"]) for _ in range(length)] for _ in range(num)]
    llm.embed(prompt_token_ids=inputs[:64], use_tqdm=False)  # warm
    start = time.perf_counter()
    outputs = llm.embed(prompt_token_ids=inputs, use_tqdm=False)
    seconds = time.perf_counter() - start
    assert len(outputs) == num
    return {"inputs": num, "tokens_per_input": length, "seconds": seconds, "embeddings_per_s": num / seconds,
            "prompt_tokens_per_s": num * length / seconds,
            "max_num_batched_tokens": llm.llm_engine.engine_core.max_num_batched_tokens}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="e2e/results/embeddings_gpu.json")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, to check the script")
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        record = {"command": " ".join(["python", *sys.argv]), "commit": commit, "torch": torch.__version__,
                  "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                  "correctness": correctness(Path(tmp), device, args.smoke)}
        gc.collect()
        record["throughput"] = throughput(Path(tmp), device, args.smoke)
    ok = all(record["correctness"][k]["pass"] for k in ("LAST", "MEAN"))
    record["pass"] = ok
    text = json.dumps(record, indent=1)
    print(text)
    if not args.smoke:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
