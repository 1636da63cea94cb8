"""--l2-prefetch changes when weights reach L2, never what a step computes: greedy decode of the 8B
shape (FP8 weights on the fly, dummy weights, a few layers) one sequence at a time, with CUDA
graphs and eager, must give the same tokens and the same logprob bits with it on and off.

Run on the H200 from the repository root, after `source e2e/gpu_env.sh` (about a minute):
    python3 e2e/gpu_prefetch_check.py [--layers 8] [--out FILE]
and on the CPU, to check the script (tiny shape; the prefetch never runs there):
    .venv/bin/python e2e/gpu_prefetch_check.py --smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_correctness as gc_  # noqa: E402

PROMPT_LEN, OUTPUT_LEN, PROMPTS = 96, 48, 3


def run(path: Path, device: str, prefetch: bool, eager: bool) -> list:
    """(token ids, their logprobs) of each prompt, decoded alone (W2's one row)."""
    from pagoda.runtime import LLM, SamplingParams

    llm = LLM(str(path), device=device, load_format="dummy", quantization="fp8", max_model_len=512,
              num_kv_blocks=256, max_num_seqs=4, enforce_eager=eager, l2_prefetch=prefetch, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_LEN, ignore_eos=True, logprobs=0)
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(PROMPTS):
        ids = torch.randint(10, 1000, (PROMPT_LEN,), generator=gen).tolist()
        (o,) = llm.generate(prompt_token_ids=[ids], sampling_params=params, use_tqdm=False)
        c = o.outputs[0]
        out.append((list(c.token_ids), [next(iter(lp.values())).logprob for lp in c.logprobs]))
    del llm
    gc.collect()
    torch.cuda.empty_cache() if device == "cuda" else None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    shape = dict(gc_.SHAPES["llama-3.1-8b"], num_hidden_layers=args.layers)
    if args.smoke:
        shape.update(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=64, vocab_size=1024)
    device = "cpu" if args.smoke else "cuda"
    path = gc_.make_checkpoint_dir(Path(tempfile.mkdtemp(prefix="pagoda-prefetch-")), "llama-3.1-8b", shape)
    record = {"workload": "l2-prefetch-check", "layers": shape["num_hidden_layers"], "results": {}}
    for eager in (False, True):
        off, on = run(path, device, False, eager), run(path, device, True, eager)
        name = "eager" if eager else "graphs"
        record["results"][name] = {"same_tokens": [a[0] == b[0] for a, b in zip(off, on)],
                                   "same_logprobs": [a[1] == b[1] for a, b in zip(off, on)]}
        print(name, record["results"][name], flush=True)
    record["ok"] = all(all(v) for r in record["results"].values() for v in r.values())
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print("PASS" if record["ok"] else "FAIL")
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
