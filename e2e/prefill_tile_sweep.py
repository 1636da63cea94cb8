"""Prefill-attention launches for heads of 64 on W4's mixed steps, and W4 with the best one.

    python e2e/prefill_tile_sweep.py --out DIR [--w4-ab]

kernels/paged_attention_prefill.default_config's launch for heads of 64 (128 x 64, 4 warps, 3
stages) is a first guess: the sweep behind the other entries ran on the 8B model's heads of 128 at
4k tokens. W4's mixed steps carry about 16k prompt tokens of 128-1,024 each, and the H100 profile of
W4 (results/fp8-peer-34f5b5f/profile-w4-34f5b5f.json) put its prefill attention at about 145 us a
layer for about 20 GFLOP, under a fifth of the tensor cores' rate. This sweeps block_m x block_n x
warps x stages on two head_dim-64 shapes (W4's 14 heads over 2, Llama-3.2-1B's 32 over 8) for two
batches: a mixed step of fresh W4 prompts, and the same prompts' second halves after a cached first
half (chunked prefill). Launches are ranked by their worst TFLOP/s.

--w4-ab then runs W4 in this process with the runtime's launch, the sweep's best for heads of 64,
and the runtime's again, each on a fresh LLM (decode_tile_sweep.w4_run). Writes
prefill-tile-sweep-<commit>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from decode_tile_sweep import w4_run  # noqa: E402
from kernels_gpu_bench import median_ms  # noqa: E402
from kernels_gpu_cases import paged_batch  # noqa: E402

import pagoda.kernels.paged_attention_prefill as prefill  # noqa: E402

SHAPES = {"w4": (14, 2, 64), "llama-1b": (32, 8, 64)}  # heads, kv_heads, head_dim
BLOCK_SIZE = 16
LAUNCHES = list(itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3)))


def w4_step(tokens: int = 16384) -> tuple[list[int], list[int]]:
    """(q_lens, seq_lens) of one mixed step's prompts: W1's lengths until the budget is spent."""
    rng = random.Random(0)
    lens = []
    while sum(lens) < tokens:
        lens.append(rng.randint(128, 1024))
    return lens, lens


def batches(names: list[str]) -> dict:
    q, s = w4_step()
    every = {"fresh": (q, s), "second_halves": ([n - n // 2 for n in s], s),
             # long prompts, where a launch picked on W4's short ones must not lose
             "long4k": ([4096] * 4, [4096] * 4), "chunk2k_of_16k": ([2048] * 2, [16384] * 2)}
    return {name: every[name] for name in names}


def point(shape: tuple, q_lens: list, seq_lens: list, args: tuple, **launch) -> dict:
    heads, _, head_dim = shape
    fn = lambda: prefill.paged_attention_prefill(*args, head_dim ** -0.5, max_query_len=max(q_lens), **launch)  # noqa: E731
    ms = median_ms(fn)
    keys = sum(sum(range(s - q + 1, s + 1)) for q, s in zip(q_lens, seq_lens))
    flops = 4 * heads * head_dim * keys
    return {"ms": round(ms, 4), "tflop_per_s": round(flops / (ms * 1e-3) / 1e12, 1)}


def sweep(shape: tuple, names: list[str], launches: list[tuple]) -> dict:
    heads, kv_heads, head_dim = shape
    inputs = {name: (q, s, paged_batch(q, s, kv_heads, heads // kv_heads, head_dim, BLOCK_SIZE, torch.bfloat16,
                                       "cuda", poison=False)) for name, (q, s) in batches(names).items()}
    rule = {name: point(shape, q, s, a) for name, (q, s, a) in inputs.items()}
    print(f"  {shape} rule now {prefill.default_config(head_dim, torch.bfloat16, torch.device('cuda'))}: "
          + json.dumps(rule), flush=True)
    rows = []
    for bm, bn, warps, stages in launches:
        knobs = dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
        try:
            pts = {name: point(shape, q, s, a, **knobs) for name, (q, s, a) in inputs.items()}
        except Exception as exc:  # out of shared memory or registers for this tile
            print(f"  {knobs}: skipped ({type(exc).__name__})", flush=True)
            continue
        worst = min(p["tflop_per_s"] for p in pts.values())
        rows.append(dict(knobs, worst_tflop_per_s=worst, points=pts))
        print(f"  {shape} {bm}/{bn}/{warps}/{stages}: worst {worst:.1f} "
              + " ".join(f"{p['tflop_per_s']:.1f}" for p in pts.values()), flush=True)
    rows.sort(key=lambda r: -r["worst_tflop_per_s"])
    return {"rule_now": rule, "launches": rows}


def with_prefill_launch(launch: dict | None):
    """w4_run's hook: default_config answers `launch` for 16-bit heads of 64 or less."""
    original = prefill.default_config

    def narrow(head_dim, dtype, device, max_seq_len=None):
        if launch and device.type == "cuda" and head_dim <= 64 and dtype != torch.float32:
            return dict(launch)
        return original(head_dim, dtype, device, max_seq_len)

    return original, narrow


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--w4-ab", action="store_true")
    p.add_argument("--shapes", nargs="+", default=["w4"], choices=list(SHAPES))
    p.add_argument("--batches", nargs="+", default=["fresh", "second_halves"])
    p.add_argument("--launches", nargs="+", default=None, metavar="BM/BN/WARPS/STAGES",
                   help="only these launches (default: the whole grid)")
    args = p.parse_args()
    result = {"commit": os.environ.get("PAGODA_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "block_size": BLOCK_SIZE, "shapes": {}}
    for name in args.shapes:
        launches = [tuple(int(x) for x in t.split("/")) for t in args.launches] if args.launches else LAUNCHES
        result["shapes"][name] = sweep(SHAPES[name], args.batches, launches)
        torch.cuda.empty_cache()
    if args.w4_ab:
        best = result["shapes"]["w4"]["launches"][0]
        launch = {k: best[k] for k in ("block_m", "block_n", "num_warps", "num_stages")}
        runs = []
        for arm in (None, launch, None):
            original, narrow = with_prefill_launch(arm)
            prefill.default_config = narrow
            try:
                runs.append(dict(w4_run(None), prefill_launch=arm))
            finally:
                prefill.default_config = original
        result["w4_ab"] = runs
        print("w4 a/b", json.dumps(runs), flush=True)
    out = Path(args.out) / f"prefill-tile-sweep-{result['commit']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
