"""The two ceilings behind every roofline, measured on the GPU at hand, as BENCHMARKS.md measured the
H200's: a bf16 8192^3 matmul (TFLOP/s) and a device-to-device copy (TB/s, bytes read plus written).

    python3 e2e/gpu_ceilings.py --out DIR        -> DIR/gpu-ceilings-<gpu>.json

The bench's rooflines use the H200's figures (780 TFLOP/s, 4.25 TB/s) whatever ran them, because the
targets are the H200's; on another card their ratio to the roofline understates how close a run came
to that card's limit. runtime/tools/bench/ceilings.py's GPU_CEILINGS holds the figures this measures,
so a result also carries its ratio to the roofline of the card that ran it. Also measured: the FP8
matmul (torch._scaled_mm, row-wise scales), which the roofline takes as twice the bf16 one.
Each figure is the median of ITERS timed launches after a warm-up, timed with CUDA events.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

# The measurement the bench's --measure-ceilings makes, so the two never drift apart.
from pagoda.runtime.tools.bench.ceilings import copy_tb_per_s, matmul_tflop_per_s, timed_ms


def fp8_matmul_tflop_per_s(n: int, iters: int) -> float:
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    sa = torch.ones(n, 1, device="cuda")
    sb = torch.ones(1, n, device="cuda")
    run = lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
    return 2 * n**3 / (timed_ms(run, iters) * 1e-3) / 1e12


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    name = torch.cuda.get_device_name()
    record = {
        "workload": "gpu-ceilings",
        "gpu": name,
        "torch": torch.__version__,
        "bf16_matmul_8192_tflop_per_s": matmul_tflop_per_s(8192, args.iters),
        "fp8_matmul_8192_tflop_per_s": fp8_matmul_tflop_per_s(8192, args.iters),
        "copy_2gib_tb_per_s": copy_tb_per_s(2.0, args.iters),
        "iters": args.iters,
    }
    print(json.dumps(record, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = name.replace(" ", "-").replace("/", "-")
    (out / f"gpu-ceilings-{tag}.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
