"""How close cuBLAS comes to the card's matmul ceiling on each dense layer of W4's and W1's steps.

    python3 e2e/gemm_shapes_bench.py --out DIR        -> DIR/gemm-shapes-<commit>.json

Each projection (qkv with its bias, o, gate|up, down, the LM head) at the row counts the engine runs
(decode: W4's 1,024 seats, W1's 256; mixed: a 16k-token chunk), timed from a CUDA graph so launch cost
is left out, against the bf16 8192^3 ceiling measured in the same process. A shape well under the
ceiling (few output tiles for 132 SMs, or a short K) is where a kernel could still gain.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from kernels_gpu_bench import graph_median_ms  # noqa: E402

from pagoda.runtime.tools.bench.ceilings import matmul_tflop_per_s  # noqa: E402

# name: (hidden, q+kv width, intermediate, vocab, qkv bias)
MODELS = {"w4": (896, 896 + 2 * 128, 4864, 151936, True), "w1-8b": (4096, 4096 + 2 * 1024, 14336, 128256, False)}
ROWS = {"w4": (1024, 512, 16384), "w1-8b": (256, 16384)}


def layers(hidden: int, qkv: int, inter: int, vocab: int) -> dict:
    return {"qkv": (qkv, hidden), "o": (hidden, hidden), "gate_up": (2 * inter, hidden),
            "down": (hidden, inter), "lm_head": (vocab, hidden)}


def point(rows: int, n: int, k: int, bias: bool, ceiling: float) -> dict:
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    ms = graph_median_ms(lambda: F.linear(x, w, b))
    tflops = 2 * rows * n * k / (ms * 1e-3) / 1e12
    return {"rows": rows, "n": n, "k": k, "bias": bias, "ms": round(ms, 4),
            "tflop_per_s": round(tflops, 1), "fraction_of_ceiling": round(tflops / ceiling, 3)}


def glu_point(rows: int, hidden: int, inter: int) -> dict:
    """The fused gate|up GEMM (kernels/gemm_glu.py, its launch as the engine picks it) against cuBLAS
    then silu_and_mul, at row counts a W4 run really has (not the sweep's powers of two)."""
    from pagoda.kernels.activation import silu_and_mul
    from pagoda.kernels.gemm_glu import gemm_glu, launch_for

    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * inter, hidden, device="cuda", dtype=torch.bfloat16) / hidden ** 0.5
    fused = graph_median_ms(lambda: gemm_glu(x, w))
    unfused = graph_median_ms(lambda: silu_and_mul(F.linear(x, w)))
    cfg = launch_for(x, w)
    return {"rows": rows, "fused_ms": round(fused, 4), "unfused_ms": round(unfused, 4),
            "speedup": round(unfused / fused, 3), "launch": {"block_m": cfg.block_m, "block_n": cfg.block_n,
                                                             "tma": cfg.tma}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    ceiling = matmul_tflop_per_s(8192, 20)
    result = {"commit": os.environ.get("PAGODA_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "ceiling_tflop_per_s": round(ceiling, 1), "models": {}}
    for name, (hidden, qkv, inter, vocab, qkv_bias) in MODELS.items():
        rows_out = []
        for rows in ROWS[name]:
            for layer, (n, k) in layers(hidden, qkv, inter, vocab).items():
                if layer == "lm_head" and rows > 1024:
                    continue  # a prefill chunk takes the LM head only on its last tokens
                pt = dict(layer=layer, **point(rows, n, k, qkv_bias and layer == "qkv", ceiling))
                rows_out.append(pt)
                print(name, json.dumps(pt), flush=True)
        result["models"][name] = rows_out
    result["glu_w4"] = []
    for rows in (951, 1024, 16302, 16384):
        pt = glu_point(rows, MODELS["w4"][0], MODELS["w4"][2])
        result["glu_w4"].append(pt)
        print("glu", json.dumps(pt), flush=True)
    out = Path(args.out) / f"gemm-shapes-{result['commit']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
