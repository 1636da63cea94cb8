"""The gate|up GEMM with silu(gate) * up in its epilogue (kernels/gemm_glu.py) against what the engine
runs without --gemm-glu: cuBLAS (F.linear) for [M, 2 * inter], then the Triton silu_and_mul. On the W4
(Qwen2.5-0.5B) and 8B MLP shapes, over batch rows from 64 to 16k, for a few launches. Each result is
checked against the unfused output (same rounding steps; the sums differ in order only).

    python3 e2e/gemm_glu_gpu_bench.py --out DIR [--rows 64 256 1024 ...]

Writes gemm-glu-<commit>.json: per shape and rows, the unfused time, each launch's time and its max
difference, the best launch and its speed-up. A launch that beats the unfused path at every row
count from ops.GEMM_GLU_MIN_ROWS up is what DEFAULT should be.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from pagoda.kernels.activation import silu_and_mul
from pagoda.kernels.gemm_glu import CANDIDATES, gemm_glu

SHAPES = {"w4-qwen2.5-0.5b": (896, 4864), "llama-3.1-8b": (4096, 14336)}  # hidden, intermediate
LAUNCHES = CANDIDATES


def timed(fn, reps: int = 20) -> float:
    """Median ms of fn over reps, replayed from a CUDA graph (no launch gaps, as the engine replays)."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=reps, return_mode="median"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rows", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    args = p.parse_args(argv)
    torch.manual_seed(0)
    record = {"workload": "gemm-glu", "backend": "pagoda", "gpu": torch.cuda.get_device_name(),
              "commit": os.environ.get("PAGODA_COMMIT", "unknown"), "torch": torch.__version__,
              "command": "python3 " + " ".join(sys.argv), "shapes": {}}
    for name, (hidden, inter) in SHAPES.items():
        weight = (torch.randn(2 * inter, hidden, device="cuda") * hidden**-0.5).to(torch.bfloat16)
        rows_out = []
        for rows in args.rows:
            x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
            want = silu_and_mul(F.linear(x, weight))
            entry = {"rows": rows, "unfused_ms": timed(lambda x=x, w=weight: silu_and_mul(F.linear(x, w))),
                     "cublas_only_ms": timed(lambda x=x, w=weight: F.linear(x, w)), "launches": []}
            for cfg in LAUNCHES:
                try:
                    got = gemm_glu(x, weight, config=cfg)
                    diff = (got.float() - want.float()).abs().max().item()
                    ms = timed(lambda cfg=cfg, x=x, w=weight: gemm_glu(x, w, config=cfg))
                except Exception as exc:  # a launch that does not fit this GPU (shared memory) is recorded, not fatal
                    entry["launches"].append({"config": dataclasses.asdict(cfg), "error": repr(exc)[:300]})
                    continue
                entry["launches"].append({"config": dataclasses.asdict(cfg), "ms": ms, "max_abs_diff": diff,
                                          "scale": want.float().abs().max().item()})
            ok = [launch for launch in entry["launches"] if "ms" in launch]
            best = min(ok, key=lambda launch: launch["ms"]) if ok else None
            entry["best"] = best["config"] if best else None
            entry["speedup"] = entry["unfused_ms"] / best["ms"] if best else None
            flops = 2 * rows * hidden * 2 * inter
            entry["best_tflop_per_s"] = flops / best["ms"] / 1e9 if best else None
            entry["cublas_tflop_per_s"] = flops / entry["cublas_only_ms"] / 1e9
            rows_out.append(entry)
            print(f"{name} rows {rows:6d}: unfused {entry['unfused_ms']:.4f} ms (cuBLAS alone "
                  f"{entry['cublas_only_ms']:.4f}); best fused {best['ms'] if best else float('nan'):.4f} ms "
                  f"{entry['best']} x{entry['speedup'] or 0:.3f}, diff {best['max_abs_diff'] if best else -1:.3g}",
                  flush=True)
        record["shapes"][name] = {"hidden": hidden, "intermediate": inter, "rows": rows_out}
    # the launch whose worst speed-up over all shapes and rows is highest
    worst = {}
    for shape in record["shapes"].values():
        for entry in shape["rows"]:
            for launch in entry["launches"]:
                if "ms" in launch:
                    key = json.dumps(launch["config"], sort_keys=True)
                    worst[key] = min(worst.get(key, float("inf")), entry["unfused_ms"] / launch["ms"])
    record["worst_speedup_by_launch"] = dict(sorted(worst.items(), key=lambda kv: -kv[1]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gemm-glu-{record['commit']}.json"
    path.write_text(json.dumps(record, indent=1))
    print("worst speed-up by launch:", json.dumps(record["worst_speedup_by_launch"], indent=0))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
