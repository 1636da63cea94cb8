"""Decode-attention launches for narrow heads (head_dim 64), and W4 with the best one.

    python e2e/decode_tile_sweep.py --out DIR [--w4-ab]

The decode kernel's thin tile (32 positions, 2 warps, 2 stages) was swept on the 8B model's heads
of 128, where it streams at 96% of the H100's copy bandwidth. W4's Qwen2.5-0.5B heads are 64 wide,
so the same tile moves half the bytes per load, and e2e/overlap_probe.py measured W4's decode
attention at 81% (e2e/results/overlap-7c1e0b0/). This sweeps block_n x warps x stages on two
head_dim-64 shapes (W4's 14 heads over 2, Llama-3.2-1B's 32 over 8) at the batches and contexts a
busy server runs, and ranks the launches by their worst bandwidth.

--w4-ab then runs W4 in this process twice, with the runtime's rule and with the sweep's best launch
put in place of the thin tile for heads of 64 or less (kernels/paged_attention_decode.choose_tile
swapped for the run), each on a fresh LLM. Writes decode-tile-sweep-<commit>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernels_gpu_bench import bandwidth_point, graph_median_ms  # noqa: E402
from kernels_gpu_cases import paged_batch  # noqa: E402
from w4_ab import w4_rates  # noqa: E402

import pagoda.kernels.paged_attention_decode as decode  # noqa: E402

SHAPES = {"w4": (14, 2, 64), "llama-1b": (32, 8, 64)}  # heads, kv_heads, head_dim
POINTS = [(512, 704), (1024, 704), (1024, 2048), (256, 1024)]  # batch, context
BLOCK_SIZE = 16
LAUNCHES = list(itertools.product((32, 64, 128), (2, 4), (2, 3, 4)))


def point(shape: tuple, batch: int, context: int, args: tuple, **launch) -> dict:
    heads, kv_heads, head_dim = shape
    fn = lambda: decode.paged_attention_decode(*args, head_dim ** -0.5, max_seq_len=context, **launch)  # noqa: E731
    ms = graph_median_ms(fn)
    kv_bytes = 2 * batch * context * kv_heads * head_dim * 2
    return bandwidth_point(kv_bytes, ms, batch=batch, context=context)


def sweep(shape: tuple) -> dict:
    heads, kv_heads, head_dim = shape
    inputs = {(b, c): paged_batch([1] * b, [c] * b, kv_heads, heads // kv_heads, head_dim, BLOCK_SIZE,
                                  torch.bfloat16, "cuda", poison=False) for b, c in POINTS}
    rule = [point(shape, b, c, inputs[b, c]) for b, c in POINTS]
    rows = []
    for block_n, warps, stages in LAUNCHES:
        knobs = dict(block_n=block_n, num_warps=warps, num_stages=stages, num_splits=1)
        try:
            pts = [point(shape, b, c, inputs[b, c], **knobs) for b, c in POINTS]
        except Exception as exc:  # out of shared memory for this tile
            print(f"  {knobs}: skipped ({type(exc).__name__})", flush=True)
            continue
        worst = min(p["achieved_tb_per_s"] for p in pts)
        rows.append(dict(knobs, worst_tb_per_s=worst, points=pts))
        print(f"  {shape} {block_n:3d}/{warps}/{stages}: worst {worst:.2f} TB/s "
              + " ".join(f"{p['achieved_tb_per_s']:.2f}" for p in pts), flush=True)
    rows.sort(key=lambda r: -r["worst_tb_per_s"])
    print(f"  {shape} rule now: " + " ".join(f"{p['achieved_tb_per_s']:.2f}" for p in rule), flush=True)
    return {"rule_now": rule, "launches": rows}


def w4_run(tile: tuple | None) -> dict:
    """W4 on a fresh LLM (w4_ab.w4_rates); tile replaces the thin tile for heads of 64 or less."""
    original = decode.choose_tile

    def narrow(num_programs, element_size, device, head_dim=128):
        got = original(num_programs, element_size, device, head_dim)
        if tile and element_size == 2 and head_dim <= 64 and got == (decode.BLOCK_N, decode.NUM_WARPS, decode.NUM_STAGES):
            return tile
        return got

    decode.choose_tile = narrow
    try:
        runs = w4_rates(2)
    finally:
        decode.choose_tile = original
    return {"tile": tile, "output_tokens_per_s": runs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--w4-ab", action="store_true")
    args = p.parse_args()
    result = {"commit": os.environ.get("PAGODA_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "block_size": BLOCK_SIZE, "shapes": {}}
    for name, shape in SHAPES.items():
        result["shapes"][name] = sweep(shape)
        torch.cuda.empty_cache()
    if args.w4_ab:
        best = result["shapes"]["w4"]["launches"][0]
        tile = (best["block_n"], best["num_warps"], best["num_stages"])
        result["w4_ab"] = [w4_run(None), w4_run(tile), w4_run(None)]
        print("w4 a/b", json.dumps(result["w4_ab"]), flush=True)
    out = Path(args.out) / f"decode-tile-sweep-{result['commit']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
