"""W4 under several engine settings in one process, each on a fresh LLM, in the order given.

    python e2e/w4_ab.py --out DIR [--variant NAME=JSON ...] [--runs 2]

A variant is LLM keyword arguments as JSON, e.g. `glu={"gemm_glu": true}`; the key "glu_min_rows"
sets kernels.ops.GEMM_GLU_MIN_ROWS for that engine (the threshold is a module constant, not a knob).
`base={}` is the defaults. Cards differ in W4's run-to-run spread by up to 15% between calls, so
only an A/B in one process decides: list the baseline first and last (base glu base) and trust a
gap only where it is wider than the two baselines' spread. Writes w4-ab-<commit>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

import pagoda.kernels.ops as ops

DEFAULT_VARIANTS = ["base={}", 'glu={"gemm_glu": true}', 'glu2k={"gemm_glu": true, "glu_min_rows": 2048}', "base={}"]


def parse_variant(text: str) -> tuple[str, dict]:
    name, sep, spec = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant wants NAME=JSON, got {text!r}")
    kwargs = json.loads(spec or "{}")
    if not isinstance(kwargs, dict):
        raise SystemExit(f"--variant {name}: the JSON must be an object")
    return name, kwargs


def w4_rates(runs: int = 2, **llm_kwargs) -> list[float]:
    """W4's output tok/s on a fresh LLM built with llm_kwargs, once per timed draw (seeds 10, 11, ...:
    a fresh draw each time, since the prefix cache holds the last); the engine is gone afterwards."""
    from pagoda.runtime.frontend.llm import LLM
    from pagoda.runtime.sampling_params import SamplingParams
    from pagoda.runtime.tools.bench import workloads

    try:
        llm = LLM(model=str(workloads.resolve_model("w4")), load_format="dummy", max_model_len=2048,
                  max_num_seqs=1024, seed=0, **llm_kwargs)
        warm = [r.prompt_token_ids for r in workloads.offline_requests(1024, 16, seed=1)]
        llm.generate([{"prompt_token_ids": p} for p in warm],
                     SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
        greedy = SamplingParams(temperature=0, max_tokens=workloads.W1_OUTPUT_LEN, ignore_eos=True)
        rates = []
        for seed in range(10, 10 + runs):
            prompts = [r.prompt_token_ids for r in workloads.offline_requests(1024, workloads.W1_OUTPUT_LEN, seed)]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            rates.append(round(sum(len(c.token_ids) for o in outs for c in o.outputs) / wall, 1))
        llm.shutdown()
        del llm
    finally:
        gc.collect()
        torch.cuda.empty_cache()
    return rates


def w4_run(name: str, kwargs: dict, runs: int) -> dict:
    """One variant: w4_rates with its kwargs, GEMM_GLU_MIN_ROWS set for the engine if it asks."""
    kwargs = dict(kwargs)
    min_rows = kwargs.pop("glu_min_rows", None)
    default_min_rows = ops.GEMM_GLU_MIN_ROWS
    if min_rows is not None:
        ops.GEMM_GLU_MIN_ROWS = int(min_rows)
    try:
        rates = w4_rates(runs, **kwargs)
    finally:
        ops.GEMM_GLU_MIN_ROWS = default_min_rows
    row = {"variant": name, "kwargs": kwargs, "glu_min_rows": min_rows, "output_tokens_per_s": rates}
    print("w4", json.dumps(row), flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--variant", action="append", help="NAME=JSON of LLM kwargs (repeatable, run in order)")
    p.add_argument("--runs", type=int, default=2, help="timed W4 runs per engine")
    args = p.parse_args()
    variants = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    result = {"commit": os.environ.get("PAGODA_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "workload": "W4", "runs": []}
    for name, kwargs in variants:
        result["runs"].append(w4_run(name, kwargs, args.runs))
    out = Path(args.out) / f"w4-ab-{result['commit']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
