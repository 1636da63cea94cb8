"""The fused MoE kernel with FP8 experts on Qwen3-30B-A3B's MoE layer: correctness, then time.

Run on the H200 from the repository root, after `source e2e/gpu_env.sh` (a minute or two):
    python3 e2e/moe_fp8_gpu_bench.py [--out DIR] [--tokens 1 8 64 512 4096]
and on the CPU first, to check the script (tiny shapes, Triton's interpreter, perf_counter times
that mean nothing):
    .venv/bin/python e2e/moe_fp8_gpu_bench.py --smoke --out /tmp/moe-fp8-smoke

The layer: hidden 2048, 128 experts of inter 768, top-8, random weights quantized per output row
(what --quantization fp8 and llm-compressor's FP8-dynamic checkpoints hold). For each token count
it runs the bf16 kernel, the FP8 kernel weight-only (W8A16) and W8A8 with per-token activations,
checks each against fused_moe_fp8_ref (the FP8 paths) or fused_moe_ref (bf16) in fp32 on the same
operands, and times them as CUDA-graph replays. The figure is the expert bytes the routed experts
read over the time (all 128 experts are touched from about 32 tokens on). Several weight copies
rotate so the experts are cold, as in a real step. One JSON (moe-fp8-pagoda-DATE.json) goes to
--out (default $OUT, else e2e/results/).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gemv_gpu_bench import begin, max_abs_err, report  # noqa: E402

SHAPE = dict(hidden=2048, inter=768, experts=128, top_k=8)
SMOKE_SHAPE = dict(hidden=48, inter=24, experts=6, top_k=2)
ROTATION_BYTES = 256 << 20  # weight copies add up to at least this (H200 L2: 50 MB)
# Outputs are of order 1: a few bf16 ulps apart from the fp32 reference. W8A8's reference quantizes
# the same bf16 activation, but one bf16 ulp can move an element to the next e4m3 value, so its
# bound is looser. A wrong scale, row or expert is off by far more.
MAX_ABS_ERR = {"bf16": 0.0625, "w8a16": 0.0625, "w8a8": 0.25}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "results"))
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 512, 4096])
    p.add_argument("--rep", type=int, default=50, help="ms of replays per point")
    p.add_argument("--smoke", action="store_true", help="CPU check: tiny shapes under TRITON_INTERPRET=1")
    return p.parse_args(argv)


def expert_copies(bench, shape: dict) -> list[dict]:
    """Copies of one layer's experts: bf16, and e4m3 with per-row scales."""
    from pagoda.kernels.quant_fp8_ref import quantize_weight_fp8_ref

    torch = bench.torch
    h, i, e = shape["hidden"], shape["inter"], shape["experts"]
    nbytes = e * 3 * h * i * 2
    copies = 2 if bench.smoke else max(2, -(-ROTATION_BYTES // nbytes))
    out = []
    for _ in range(copies):
        w13 = (torch.randn(e, 2 * i, h, device=bench.device) * h**-0.5)
        w2 = (torch.randn(e, h, i, device=bench.device) * i**-0.5)
        q13, s13 = quantize_weight_fp8_ref(w13.reshape(-1, h))
        q2, s2 = quantize_weight_fp8_ref(w2.reshape(-1, i))
        q13, s13, q2, s2 = q13.view(e, 2 * i, h), s13.view(e, 2 * i), q2.view(e, h, i), s2.view(e, h)
        # the bf16 kernel gets the dequantized weights, so all three compute the same layer
        out.append(dict(w13=(q13.float() * s13[..., None]).bfloat16(), w2=(q2.float() * s2[..., None]).bfloat16(),
                        q13=q13, s13=s13, q2=q2, s2=s2))
    return out


def bench_tokens(bench, shape: dict, tokens: int) -> dict:
    from pagoda.kernels.fused_moe import fused_moe
    from pagoda.kernels.fused_moe_ref import fused_moe_fp8_ref, fused_moe_ref, route_ref

    torch = bench.torch
    h, e, k = shape["hidden"], shape["experts"], shape["top_k"]
    copies = expert_copies(bench, shape)
    x = torch.randn(tokens, h, device=bench.device).bfloat16()
    weights, ids = route_ref(torch.randn(tokens, e, device=bench.device).bfloat16(), k, renormalize=True)
    touched = int(torch.unique(ids).numel())
    calls = {
        "bf16": lambda c: fused_moe(x, c["w13"], c["w2"], weights, ids),
        "w8a16": lambda c: fused_moe(x, c["q13"], c["q2"], weights, ids, w13_scale=c["s13"], w2_scale=c["s2"]),
        "w8a8": lambda c: fused_moe(x, c["q13"], c["q2"], weights, ids, w13_scale=c["s13"], w2_scale=c["s2"],
                                    activations="dynamic-token"),
    }
    c0 = copies[0]
    refs = {
        "bf16": fused_moe_ref(x.float(), c0["w13"].float(), c0["w2"].float(), weights.float(), ids),
        "w8a16": fused_moe_fp8_ref(x.float(), c0["q13"], c0["q2"], c0["s13"], c0["s2"], weights.float(), ids),
        "w8a8": fused_moe_fp8_ref(x, c0["q13"], c0["q2"], c0["s13"], c0["s2"], weights, ids,
                                  activations="dynamic-token").float(),
    }
    row = dict(tokens=tokens, experts_touched=touched)
    for name, call in calls.items():
        err = max_abs_err(call(c0), refs[name])
        cycle = itertools.cycle(copies)
        ms = bench.time_ms(lambda call=call, cycle=cycle: call(next(cycle)), bench.rep)
        weight_bytes = touched * 3 * h * shape["inter"] * (2 if name == "bf16" else 1)
        row[name] = dict(ms=round(ms, 5), max_abs_err=err, tb_per_s=round(weight_bytes / (ms * 1e-3) / 1e12, 3))
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    begun = begin(args)
    if begun is None:
        return 2
    bench, meta = begun
    shape = SMOKE_SHAPE if args.smoke else SHAPE
    tokens = [1, 5] if args.smoke else args.tokens
    rows, failed = [], None
    table = ["tokens  experts  bf16 ms (TB/s)      W8A16 ms (TB/s)     W8A8 ms (TB/s)"]
    for t in tokens:
        row = bench_tokens(bench, shape, t)
        rows.append(row)
        table.append(f"{t:>6}  {row['experts_touched']:>7}  " + "  ".join(
            f"{row[n]['ms']:>8.4f} ({row[n]['tb_per_s']:>5.2f})    " for n in ("bf16", "w8a16", "w8a8")))
        for name in ("bf16", "w8a16", "w8a8"):
            if not row[name]["max_abs_err"] <= MAX_ABS_ERR[name]:
                failed = f"{name} at {t} tokens: max abs err {row[name]['max_abs_err']:.3g} > {MAX_ABS_ERR[name]}"
    body = dict(shape=shape, rows=rows, max_abs_err_bounds=MAX_ABS_ERR, smoke=args.smoke)
    return report(args, meta, "moe-fp8", body, table, {}, failed, started)


if __name__ == "__main__":
    sys.exit(main())
