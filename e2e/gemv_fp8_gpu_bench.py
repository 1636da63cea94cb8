"""The FP8-weight GEMV against the paths it replaces, at decode's few rows on Llama-3.1-8B's shapes.

Run on the H200 from the repository root, after `source e2e/gpu_env.sh` (about 2.5 minutes):
    python3 e2e/gemv_fp8_gpu_bench.py [--out DIR] [--rows 1 4] [--sweep-rows 1]
and on the CPU first, to check the script (tiny shapes, Triton's interpreter, times that mean nothing):
    .venv/bin/python e2e/gemv_fp8_gpu_bench.py --smoke --out /tmp/gemv-fp8-smoke

For each projection (down_proj with silu_and_mul fused, as the MLP runs it) and row count, as
CUDA-graph replays over weight copies that exceed L2 (e2e/gemv_gpu_bench.py says why):
- scaled_mm: what an FP8 layer ran before at these rows, the Triton per-token quantization of x
  then torch._scaled_mm with row-wise scales (silu_and_mul first for down_proj);
- bf16: the bf16 layer as the runtime runs it (ops.linear: the bf16 GEMV where it measured faster
  than cuBLAS, else cuBLAS), the baseline FP8 must beat;
- fp8_gemv: the FP8 GEMV at the runtime's launch (gemv.fp8_launch), and at --sweep-rows the best of
  a sweep of its launch knobs, printed as entries for pagoda.kernels.gemv.FP8_MEASURED.
TB/s is each path's weight bytes (1 per FP8 weight, 2 per bf16 one) over its time, against the
H200's 4.25. Every FP8 GEMV result is checked against gemv_ref (the same e4m3 weights dequantized,
fp32 sums). One JSON (gemv-fp8-pagoda-DATE.json) goes to --out (default $OUT, else e2e/results/).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gemv_gpu_bench import LAYERS, PEAK_TB_PER_S, Bench, begin, max_abs_err, sweep  # noqa: E402

SHAPES = {  # name: (N, K, act)
    "qkv_proj": (6144, 4096, None),
    "o_proj": (4096, 4096, None),
    "gate_up_proj": (28672, 4096, None),
    "down_proj": (4096, 14336, "silu_mul"),
}
SMOKE_SHAPES = {"odd": (67, 130, None), "down_like": (48, 256, "silu_mul")}
# gemv_ref and the kernel differ only in summation order and the one rounding to bf16: outputs are
# of order 1, so a few bf16 ulps. A wrong scale or row is off by far more.
MAX_ABS_ERR = 0.0625


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "results"))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4], help="rows of x (decode batch)")
    p.add_argument("--sweep-rows", type=int, nargs="*", default=[1], help="rows that sweep the FP8 launch")
    p.add_argument("--rep", type=int, default=10, help="ms of replays per sweep point (headlines: 5x)")
    p.add_argument("--smoke", action="store_true", help="CPU check: tiny shapes under TRITON_INTERPRET=1")
    return p.parse_args(argv)


def fp8_copies(bench: Bench, n: int, k: int) -> tuple[list, list]:
    """Weight copies, bf16 and their per-channel e4m3 quantization (the --quantization fp8 arithmetic)."""
    from pagoda.kernels.quant_fp8_ref import quantize_weight_fp8_ref

    bf16 = bench.weights(n, k)
    return bf16, [quantize_weight_fp8_ref(w) for w in bf16]


def bench_shape(bench: Bench, name: str, m: int, n: int, k: int, act, do_sweep: bool) -> dict:
    import torch

    from pagoda.kernels import ops
    from pagoda.kernels.gemv import GemvConfig, fp8_launch, gemv
    from pagoda.kernels.gemv_ref import gemv_ref

    bf16, fp8 = fp8_copies(bench, n, k)
    x = torch.randn(m, 2 * k if act else k, device=bench.device).bfloat16()
    rep = bench.rep * 5

    def scaled_mm(w):
        h = ops.silu_and_mul(x) if act else x
        q, scale_a = ops.quantize_fp8(h)
        return torch._scaled_mm(q, w[0].t(), scale_a=scale_a, scale_b=w[1].view(1, -1), out_dtype=x.dtype)

    def bf16_runtime(w):
        return ops.silu_and_mul_linear(x, w) if act else ops.linear(x, w)

    def fp8_gemv(w, cfg):
        return gemv(x, w[0], weight_scale=w[1], act=act, config=cfg)

    want = gemv_ref(x, fp8[0][0], weight_scale=fp8[0][1], act=act)
    unquantized = gemv_ref(x, bf16[0], act=act).float()
    launch = fp8_launch(m, n, k, act, bench.device)
    row = dict(name=name, m=m, n=n, k=k, act=act, fp8_weight_bytes=n * k, copies=len(fp8))
    row["scaled_mm"] = bench.timed(scaled_mm, fp8, n * k, rep)
    row["bf16"] = bench.timed(bf16_runtime, bf16, n * k * 2, rep)
    row["fp8_gemv"] = dict(config=dataclasses.asdict(launch), **bench.timed(lambda w: fp8_gemv(w, launch), fp8, n * k, rep),
                           max_abs_err=max_abs_err(fp8_gemv(fp8[0], launch), want),
                           rel_err_vs_bf16_weights=rel_err(fp8_gemv(fp8[0], launch), unquantized))
    if do_sweep:
        points = sweep(bench, m, n, k, x, fp8, launch, call=fp8_gemv, weight_bytes=1)
        best = GemvConfig(**points[0]["config"])
        row["sweep"] = points
        row["fp8_best"] = dict(config=dataclasses.asdict(best), **bench.timed(lambda w: fp8_gemv(w, best), fp8, n * k, rep),
                               max_abs_err=max_abs_err(fp8_gemv(fp8[0], best), want))
    top = row.get("fp8_best", row["fp8_gemv"])
    for base in ("scaled_mm", "bf16"):
        row[f"speedup_vs_{base}"] = round(row[base]["ms"] / top["ms"], 3)
    print(f"  M={m} {name:13s} N={n:6d} K={k:5d}: scaled_mm {row['scaled_mm']['ms'] * 1e3:6.1f} us, "
          f"bf16 {row['bf16']['ms'] * 1e3:6.1f} us ({row['bf16']['tb_per_s']:.2f} TB/s), FP8 GEMV "
          f"{row['fp8_gemv']['ms'] * 1e3:6.1f} us ({row['fp8_gemv']['tb_per_s']:.2f} TB/s), best "
          f"{top['ms'] * 1e3:6.1f} us ({top['tb_per_s']:.2f} of {PEAK_TB_PER_S} TB/s) err {top['max_abs_err']:.3g}")
    return row


def rel_err(got, want) -> float:
    """Relative Frobenius distance: e4m3's rounding of the weights, about 3-4%."""
    return round(float((got.float() - want).norm() / want.norm()), 5)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = begin(args)
    if started is None:
        return 2
    bench, meta = started
    import torch

    from pagoda.kernels.gemv import GemvConfig

    start = time.perf_counter()
    rows = []
    for m in args.rows:
        for name, (n, k, act) in (SMOKE_SHAPES if args.smoke else SHAPES).items():
            rows.append(bench_shape(bench, name, m, n, k, act, m in args.sweep_rows))
            if not args.smoke:
                torch.cuda.empty_cache()  # the rotation copies of the last shape
        print(f"  ({time.perf_counter() - start:.0f} s so far)")
    # Per decode step, the 32 layers' four projections (the LM head stays bf16 either way).
    def step(m, path):  # a shape without a sweep counts its runtime launch as its best
        return round(LAYERS * sum(r.get(path, r["fp8_gemv"])["ms"] for r in rows if r["m"] == m), 4)

    step_ms = {m: {path: step(m, path) for path in ("scaled_mm", "bf16", "fp8_gemv", "fp8_best")} for m in args.rows}
    failed = [r for r in rows if max(r[p]["max_abs_err"] for p in ("fp8_gemv", "fp8_best") if p in r) > MAX_ABS_ERR]
    entries = [f"    ({r['m']}, {r['n']}, {r['k']}, {r['act']!r}): {GemvConfig(**r['fp8_best']['config'])!r},"
               for r in rows if "fp8_best" in r and r["fp8_best"]["ms"] < r["fp8_gemv"]["ms"]]
    from kernels_gpu import write_result

    path = write_result(args.out, "gemv-fp8", meta, dict(
        peak_tb_per_s=PEAK_TB_PER_S, figure="weight bytes / CUDA-graph replay median",
        num_sms=bench.num_sms, seconds=round(time.perf_counter() - start, 1), layer_ms_per_step=step_ms,
        shapes=rows, fp8_measured_entries=entries, max_abs_err_allowed=MAX_ABS_ERR, passed=not failed,
    ))
    print(f"\n{'M':>2s} {'shape':13s} {'scaled_mm us':>12s} {'bf16 TB/s':>10s} {'FP8 TB/s':>9s} {'best':>6s} {'vs mm':>6s}")
    for r in rows:
        top = r.get("fp8_best", r["fp8_gemv"])
        print(f"{r['m']:2d} {r['name']:13s} {r['scaled_mm']['ms'] * 1e3:12.1f} "
              f"{r['bf16']['tb_per_s']:10.2f} {r['fp8_gemv']['tb_per_s']:9.2f} {top['tb_per_s']:6.2f} "
              f"{r['speedup_vs_scaled_mm']:6.2f}")
    print(f"\nlinear layers per decode step (ms, 32 layers): {step_ms}")
    if entries:
        print("\nFP8_MEASURED entries (pagoda.kernels.gemv):\n" + "\n".join(entries))
    print(f"\nresult: {path} ({time.perf_counter() - start:.0f} s)")
    if failed:
        print(f"FAILED: {len(failed)} FP8 GEMV results disagree with gemv_ref beyond {MAX_ABS_ERR}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
