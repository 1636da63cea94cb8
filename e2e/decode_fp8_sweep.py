"""The paged decode kernel over an FP8 (e4m3) KV cache on the GPU: bandwidth against the bf16 cache
on the same shapes, V read as 16-bit pairs (paged_attention_decode.V_PAIRS) against V read a byte
at a time (whether their bits agree, and how far apart they are), the fp16 dot (attention_dot.fp8_as_f16) against the old
widening to bf16, and a sweep of the FP8 launch's tile (block_n, num_warps, num_stages).

    python e2e/decode_fp8_sweep.py --out DIR [--quick]

Times are CUDA-graph replay medians (the engine replays decode from graphs); TB/s counts the bytes
the cache holds (one a value for FP8) against the 4.25 TB/s copy ceiling of BENCHMARKS.md. Writes
decode-fp8-sweep-<commit>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_gpu_bench import HEAD_DIM, HEADS, KV_HEADS, bandwidth_point, graph_median_ms  # noqa: E402
from kernels_gpu_cases import paged_batch  # noqa: E402

import pagoda.kernels.paged_attention_decode as decode_module  # noqa: E402
from pagoda.kernels.paged_attention_decode import paged_attention_decode  # noqa: E402
from pagoda.kernels.paged_attention_ref import paged_attention_ref  # noqa: E402

FP8 = torch.float8_e4m3fn
# W1's decode (256 seats, 128-1024-token prompts + up to 256 generated), and W3/W4-like corners
SHAPES = [(256, 768), (256, 1152), (128, 2048), (64, 4096), (32, 1024)]


@contextlib.contextmanager
def v_bytes():
    """V read a byte at a time, as before V_PAIRS."""
    saved = decode_module.V_PAIRS
    decode_module.V_PAIRS = False
    try:
        yield
    finally:
        decode_module.V_PAIRS = saved


@contextlib.contextmanager
def widen_to_bf16():
    """The kernel as it was: an FP8 cache widened to q's bf16 (e4m3 -> fp16 -> fp32 -> bf16)."""
    saved = decode_module.fp8_as_f16
    decode_module.fp8_as_f16 = lambda query, k_cache: False
    try:
        yield
    finally:
        decode_module.fp8_as_f16 = saved


def inputs(batch: int, context: int, block_size: int, dtype):
    args = list(paged_batch([1] * batch, [context] * batch, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM, block_size,
                            torch.bfloat16, "cuda", poison=False))
    if dtype == FP8:
        args[1], args[2] = args[1].to(FP8), args[2].to(FP8)
    return tuple(args)


def point(batch, context, block_size, args, **launch) -> dict:
    scale = HEAD_DIM**-0.5
    ms = graph_median_ms(lambda: paged_attention_decode(*args, scale, max_seq_len=context, **launch))
    elem = args[1].element_size()
    nbytes = 2 * batch * context * KV_HEADS * HEAD_DIM * elem + 2 * batch * HEADS * HEAD_DIM * 2
    return bandwidth_point(nbytes, ms, batch=batch, context=context, elem_bytes=elem, **launch)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--quick", action="store_true", help="sweep 2 and 4 warps, 2-4 stages only")
    p.add_argument("--shapes-only", action="store_true", help="the per-shape comparisons, no tile sweep")
    args = p.parse_args()
    bs = args.block_size
    result = {"workload": "decode-fp8-sweep", "commit": os.environ.get("PAGODA_COMMIT", "unknown"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "block_size": bs,
              "shapes": [], "sweep": []}
    cached = {}
    for batch, context in SHAPES:
        bf16, fp8 = inputs(batch, context, bs, torch.bfloat16), inputs(batch, context, bs, FP8)
        cached[batch, context] = fp8
        # the fp16 dot must agree with the reference as closely as the bf16 widening did
        want = paged_attention_ref(*fp8, HEAD_DIM**-0.5)
        got = paged_attention_decode(*fp8, HEAD_DIM**-0.5, max_seq_len=context)
        with widen_to_bf16():
            old = paged_attention_decode(*fp8, HEAD_DIM**-0.5, max_seq_len=context)
            widened = point(batch, context, bs, fp8)
        with v_bytes():
            by_bytes = paged_attention_decode(*fp8, HEAD_DIM**-0.5, max_seq_len=context)
            bytes_point = point(batch, context, bs, fp8)
        row = {"batch": batch, "context": context, "bf16_cache": point(batch, context, bs, bf16),
               "fp8_f16_dot": point(batch, context, bs, fp8), "fp8_widen_bf16": widened,
               "fp8_v_bytes": bytes_point, "v_pairs_same_bits": bool(torch.equal(got, by_bytes)),
               "max_diff_v_pairs_v_bytes": float((got.float() - by_bytes.float()).abs().max()),
               "max_err_v_bytes": float((by_bytes.float() - want.float()).abs().max()),
               "max_err_f16_dot": float((got.float() - want.float()).abs().max()),
               "max_err_widen_bf16": float((old.float() - want.float()).abs().max())}
        row["fp8_over_bf16_time"] = round(row["fp8_f16_dot"]["ms"] / row["bf16_cache"]["ms"], 3)
        row["v_pairs_speedup"] = round(bytes_point["ms"] / row["fp8_f16_dot"]["ms"], 3)
        result["shapes"].append(row)
        print(f"{batch}x{context}: bf16 {row['bf16_cache']['achieved_tb_per_s']} TB/s "
              f"{row['bf16_cache']['ms']} ms; fp8 f16-dot {row['fp8_f16_dot']['achieved_tb_per_s']} TB/s "
              f"{row['fp8_f16_dot']['ms']} ms; V bytes {bytes_point['achieved_tb_per_s']} TB/s "
              f"(pairs {row['v_pairs_speedup']}x, same bits {row['v_pairs_same_bits']}, "
              f"max diff {row['max_diff_v_pairs_v_bytes']:.2e}, bytes err {row['max_err_v_bytes']:.2e}); "
              f"fp8 widen-bf16 {widened['achieved_tb_per_s']} TB/s; "
              f"err {row['max_err_f16_dot']:.2e} / {row['max_err_widen_bf16']:.2e}", flush=True)
    grid = ((32, 64, 128), (2, 4), (2, 3, 4)) if args.quick else ((32, 64, 128), (2, 4, 8), (1, 2, 3, 4))
    if args.shapes_only:
        grid = ((), (), ())
    for block_n, warps, stages in itertools.product(*grid):
        knobs = dict(block_n=block_n, num_warps=warps, num_stages=stages)
        try:
            pts = [point(b, c, bs, cached[b, c], **knobs) for b, c in SHAPES]
        except Exception as exc:  # e.g. out of shared memory for this tile
            print(f"  {knobs}: skipped ({type(exc).__name__})")
            continue
        worst = min(q["achieved_tb_per_s"] for q in pts)
        result["sweep"].append(dict(knobs, worst_tb_per_s=worst, tb_per_s=[q["achieved_tb_per_s"] for q in pts]))
        print(f"  {knobs}: worst {worst:.2f} TB/s  {[q['achieved_tb_per_s'] for q in pts]}", flush=True)
    result["sweep"].sort(key=lambda r: -r["worst_tb_per_s"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"decode-fp8-sweep-{result['commit']}.json"
    path.write_text(json.dumps(result, indent=1))
    print("wrote", path, "best", result["sweep"][:3])  # [] with --shapes-only
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
