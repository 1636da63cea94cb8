"""The FP8 paths at decode's few rows on Llama-3.1-8B's shapes, and RMSNorm fused with FP8 quantization.

Run on the H200 from the repository root, after `source e2e/gpu_env.sh` (about 5 minutes):
    python3 e2e/gemv_fp8_gpu_bench.py [--out DIR] [--rows 1 2 4 8] [--sweep-rows 1]
and on the CPU first, to check the script (tiny shapes, Triton's interpreter, times that mean nothing):
    .venv/bin/python e2e/gemv_fp8_gpu_bench.py --smoke --out /tmp/gemv-fp8-smoke

For each projection (down_proj with silu_and_mul, as the MLP runs it) and row count, as CUDA-graph
replays over weight copies that exceed L2 (e2e/gemv_gpu_bench.py says why):
- scaled_mm: x quantized per token by the Triton kernel, then torch._scaled_mm with row-wise scales
  (silu_and_mul fused into the quantization for down_proj), what an FP8 layer runs without a table entry;
- bf16: the bf16 layer as the runtime runs it (ops.linear), the baseline FP8 must beat;
- fp8_gemv: the weight-only FP8 GEMV (x unquantized, silu fused; 1..4 rows) at the runtime's launch
  (gemv.fp8_launch), and with --sweep-old, at --sweep-rows, the best of a sweep of its knobs (fp8_best);
- gemv2: the second weight-only FP8 GEMV (kernels/gemv_fp8.py: x in the weights' register layout, 1..8
  rows in one loop) at its heuristic launch, and the best of a sweep of its knobs (gemv2_best; swept at
  --sweep-rows, its best launch reused at the other row counts);
- scaled_gemv: x quantized the same way, then the tensor-core small-M FP8 GEMM (kernels/scaled_gemv.py)
  at its heuristic launch, and the best of a sweep of its knobs (scaled_gemv_best; swept at
  --sweep-rows, its best launch reused at the other row counts: the tile costs the same up to 16).
For qkv_proj and gate_up_proj the quantization is not timed in the scaled paths: the RMSNorm before
them does it in its own kernel (see the norm_quant section); o_proj and down_proj pay for theirs.
TB/s is each path's weight bytes over its time, against the H200's 4.25. Every FP8 result is checked
against its reference (gemv_ref: the weight dequantized; scaled_gemv_ref: both operands dequantized).

norm_quant: RMSNorm with its residual add fused with the per-token FP8 quantization, against
rms_norm then quantize_fp8 (the unfused pair) and rms_norm alone, at decode to prefill row counts,
checked against rms_norm_quant_fp8_ref.

The fastest FP8 path per (rows, shape), where it beats scaled_mm, is printed as entries for
pagoda.kernels.fp8_dispatch.FP8_SMALL_M. One JSON (gemv-fp8-pagoda-DATE.json) goes to --out
(default $OUT, else e2e/results/).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gemv_gpu_bench import LAYERS, PEAK_TB_PER_S, Bench, begin, max_abs_err, report, sweep  # noqa: E402

SHAPES = {  # name: (N, K, act)
    "qkv_proj": (6144, 4096, None),
    "o_proj": (4096, 4096, None),
    "gate_up_proj": (28672, 4096, None),
    "down_proj": (4096, 14336, "silu_mul"),
}
SMOKE_SHAPES = {"odd": (67, 130, None), "down_like": (48, 256, "silu_mul")}
NORM_QUANTIZED = ("qkv_proj", "gate_up_proj", "odd")  # their input comes quantized from the norm
NORM_ROWS, SMOKE_NORM_ROWS = (1, 2, 4, 8, 64, 512, 4096), (1, 3)
# The references and the kernels differ only in summation order and the one rounding to bf16:
# outputs are of order 1, so a few bf16 ulps. A wrong scale or row is off by far more.
MAX_ABS_ERR = 0.0625
GEMV_MAX_ROWS = 4  # kernels/gemv.py MAX_ROWS
PATHS = ("fp8_gemv", "fp8_best", "gemv2", "gemv2_best", "scaled_gemv", "scaled_gemv_best")  # FP8 kernels timed
# FP8_SMALL_M's path for each, and its config class
ENTRY = {"fp8_gemv": ("gemv", "GemvConfig"), "fp8_best": ("gemv", "GemvConfig"),
         "gemv2": ("gemv_fp8", "Fp8GemvConfig"), "gemv2_best": ("gemv_fp8", "Fp8GemvConfig"),
         "scaled_gemv": ("scaled_gemv", "ScaledGemvConfig"), "scaled_gemv_best": ("scaled_gemv", "ScaledGemvConfig")}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "results"))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8], help="rows of x (decode batch)")
    p.add_argument("--sweep-rows", type=int, nargs="*", default=[1], help="rows that sweep the launches")
    p.add_argument("--sweep-old", action="store_true",
                   help="also sweep kernels/gemv.py's FP8 launch (its 1-row winners are in FP8_MEASURED already)")
    p.add_argument("--rep", type=int, default=10, help="ms of replays per sweep point (headlines: 5x)")
    p.add_argument("--smoke", action="store_true", help="CPU check: tiny shapes under TRITON_INTERPRET=1")
    return p.parse_args(argv)


def fp8_copies(bench: Bench, n: int, k: int) -> tuple[list, list]:
    """Weight copies, bf16 and their per-channel e4m3 quantization (the --quantization fp8 arithmetic)."""
    from pagoda.kernels.quant_fp8_ref import quantize_weight_fp8_ref

    bf16 = bench.weights(n, k)
    return bf16, [quantize_weight_fp8_ref(w) for w in bf16]


def scaled_gemv_candidates(n: int, k: int, num_sms: int, smoke: bool):
    """Tiles (64 or 128 weight rows: one or two warpgroup MMAs) x K steps x pipeline depths that fit
    in shared memory, each at the split-K that gives every SM a program; split-K itself is swept
    on the best tile (scaled_gemv_sweep)."""
    from pagoda.kernels.scaled_gemv import MAX_ROWS, ScaledGemvConfig

    if smoke:
        return [ScaledGemvConfig(64, 32, 2, 4, 2), ScaledGemvConfig(128, 64, 1, 4, 2)]
    out = []
    for bn, bk, stages in itertools.product((64, 128), (128, 256, 512), (3, 4, 6)):
        if (bn + MAX_ROWS) * bk * stages > 200 * 1024 or bk > k:
            continue
        split = 1
        while -(-n // bn) * split < num_sms and k >= 2 * split * 2 * bk:
            split *= 2
        out.append(ScaledGemvConfig(bn, bk, split, 4, stages))
    return out


def gemv2_candidates(m: int, n: int, k: int, num_sms: int, smoke: bool):
    """Row blocks x K steps x warps with K steps of at least 8 values x 32 lanes x warps (x then
    shares the weights' layout) and at most 64 accumulators a thread, at the split-K that gives
    every SM two programs; split-K itself is swept on the best tile."""
    from pagoda.kernels.gemv_fp8 import Fp8GemvConfig

    if smoke:
        return [Fp8GemvConfig(16, 32, 2, 4), Fp8GemvConfig(8, 64, 1, 4)]
    m_pad = 1 << (m - 1).bit_length()
    out = []
    for bn, bk, warps in itertools.product((4, 8, 16, 32), (1024, 2048, 4096), (4, 8)):
        if bk < 8 * 32 * warps or bk > max(1024, k) or m_pad * bn * bk // (8 * 32 * warps) > 64:
            continue
        split = 1
        while -(-n // bn) * split < 2 * num_sms and k >= 2 * split * 2 * bk:
            split *= 2
        out.append(Fp8GemvConfig(bn, bk, split, warps))
    return out


def config_sweep(bench: Bench, n: int, k: int, weights, call, default_cfg, candidates, label) -> list[dict]:
    """Each candidate launch (call(w, cfg)), then split-K 1..8 on the fastest."""
    points: dict = {}

    def measure(cfg):
        if cfg in points:
            return
        try:
            points[cfg] = bench.timed(lambda w: call(w, cfg), weights, n * k, bench.rep)
        except Exception as exc:  # e.g. out of shared memory for this tile
            print(f"    {cfg}: skipped ({type(exc).__name__}: {str(exc)[:80]})")

    measure(default_cfg)
    for cfg in candidates:
        measure(cfg)
    if not points:
        return []
    top = min(points, key=lambda c: points[c]["ms"])
    for split in (1, 2, 4, 8)[: 2 if bench.smoke else 4]:
        if k >= split * top.block_k:
            measure(dataclasses.replace(top, split_k=split))
    print(f"    swept {len(points)} {label} launches")
    return sorted((dict(config=dataclasses.asdict(c), **p) for c, p in points.items()), key=lambda p: p["ms"])


def bench_shape(bench: Bench, name: str, m: int, n: int, k: int, act, do_sweep: bool, best: dict,
                sweep_old: bool = False) -> dict:
    import torch

    from pagoda.kernels import ops
    from pagoda.kernels.gemv import GemvConfig, fp8_launch, gemv
    from pagoda.kernels.gemv_fp8 import MAX_ROWS as GEMV2_MAX_ROWS
    from pagoda.kernels.gemv_fp8 import Fp8GemvConfig, fp8_gemv_config
    from pagoda.kernels.gemv_fp8 import fp8_gemv as gemv2_kernel
    from pagoda.kernels.gemv_ref import gemv_ref
    from pagoda.kernels.scaled_gemv import ScaledGemvConfig, scaled_gemv, scaled_gemv_config
    from pagoda.kernels.scaled_gemv_ref import scaled_gemv_ref

    bf16, fp8 = fp8_copies(bench, n, k)
    x = torch.randn(m, 2 * k if act else k, device=bench.device).bfloat16()
    rep = bench.rep * 5
    silu = act == "silu_mul"
    prequantized = ops.quantize_fp8(x, silu_mul=silu)  # what the norm hands qkv_proj and gate_up_proj

    def quantized():  # the input as the scaled paths see it, quantized here unless the norm did it
        return prequantized if name in NORM_QUANTIZED else ops.quantize_fp8(x, silu_mul=silu)

    def scaled_mm(w):
        q, scale_a = quantized()
        return torch._scaled_mm(q, w[0].t(), scale_a=scale_a, scale_b=w[1].view(1, -1), out_dtype=x.dtype)

    def bf16_runtime(w):
        return ops.silu_and_mul_linear(x, w) if act else ops.linear(x, w)

    def fp8_gemv(w, cfg):
        return gemv(x, w[0], weight_scale=w[1], act=act, config=cfg)

    def gemv2(w, cfg):
        return gemv2_kernel(x, w[0], w[1], act=act, config=cfg)

    def dot(w, cfg):
        q, scale_a = quantized()
        return scaled_gemv(q, scale_a, w[0], w[1], out_dtype=x.dtype, config=cfg)

    weight_only = gemv_ref(x, fp8[0][0], weight_scale=fp8[0][1], act=act)
    both_quantized = scaled_gemv_ref(*prequantized, *fp8[0], out_dtype=x.dtype)
    unquantized = gemv_ref(x, bf16[0], act=act).float()
    row = dict(name=name, m=m, n=n, k=k, act=act, fp8_weight_bytes=n * k, copies=len(fp8),
               input_quantized_by_norm=name in NORM_QUANTIZED)
    row["scaled_mm"] = dict(**bench.timed(scaled_mm, fp8, n * k, rep), max_abs_err=max_abs_err(scaled_mm(fp8[0]), both_quantized))
    row["bf16"] = bench.timed(bf16_runtime, bf16, n * k * 2, rep)

    def timed(call, cfg, want):
        got = call(fp8[0], cfg)
        return dict(config=dataclasses.asdict(cfg), **bench.timed(lambda w: call(w, cfg), fp8, n * k, rep),
                    max_abs_err=max_abs_err(got, want), rel_err_vs_bf16_weights=rel_err(got, unquantized))

    def attempt(label, fn):
        """row[label] = fn(); a new kernel that fails to build or run is recorded, not fatal."""
        try:
            row[label] = fn()
        except Exception as exc:
            row.setdefault("errors", {})[label] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(f"    {label}: FAILED ({row['errors'][label][:120]})")

    if m <= GEMV_MAX_ROWS:
        launch = fp8_launch(m, n, k, act, bench.device)
        row["fp8_gemv"] = timed(fp8_gemv, launch, weight_only)
        if do_sweep and sweep_old:
            points = sweep(bench, m, n, k, x, fp8, launch, call=fp8_gemv, weight_bytes=1)
            row["sweep"] = points
            row["fp8_best"] = timed(fp8_gemv, GemvConfig(**points[0]["config"]), weight_only)
    if m <= GEMV2_MAX_ROWS:
        default_v2 = fp8_gemv_config(m, n, k, bench.num_sms)
        attempt("gemv2", lambda: timed(gemv2, default_v2, weight_only))
        if do_sweep:
            points = config_sweep(bench, n, k, fp8, gemv2, default_v2,
                                  gemv2_candidates(m, n, k, bench.num_sms, bench.smoke), "gemv2")
            row["gemv2_sweep"] = points
            if points:
                best["gemv2", name] = Fp8GemvConfig(**points[0]["config"])
        if ("gemv2", name) in best:
            attempt("gemv2_best", lambda: timed(gemv2, best["gemv2", name], weight_only))
    default_dot = scaled_gemv_config(n, k, bench.num_sms)
    attempt("scaled_gemv", lambda: timed(dot, default_dot, both_quantized))
    if do_sweep:
        points = config_sweep(bench, n, k, fp8, dot, default_dot,
                              scaled_gemv_candidates(n, k, bench.num_sms, bench.smoke), "scaled_gemv")
        row["scaled_gemv_sweep"] = points
        if points:
            best["scaled_gemv", name] = ScaledGemvConfig(**points[0]["config"])
    if ("scaled_gemv", name) in best:
        attempt("scaled_gemv_best", lambda: timed(dot, best["scaled_gemv", name], both_quantized))
    paths = [p for p in PATHS if p in row]
    fastest = min(paths, key=lambda p: row[p]["ms"]) if paths else "scaled_mm"  # (every new kernel failed)
    row["fastest"] = fastest
    for base in ("scaled_mm", "bf16"):
        row[f"speedup_vs_{base}"] = round(row[base]["ms"] / row[fastest]["ms"], 3)
    us = {p: f"{row[p]['ms'] * 1e3:6.1f} us ({row[p]['tb_per_s']:.2f})" for p in ("scaled_mm", "bf16", *paths)}
    print(f"  M={m} {name:13s} N={n:6d} K={k:5d}: " + ", ".join(f"{p} {t}" for p, t in us.items())
          + f"; fastest {fastest} err {row[fastest]['max_abs_err']:.3g}")
    return row


def rel_err(got, want) -> float:
    """Relative Frobenius distance: e4m3's rounding of the weights (and of x), about 3-5%."""
    return round(float((got.float() - want).norm() / want.norm()), 5)


def bench_norm_quant(bench: Bench, rows: int, hidden: int) -> dict:
    """RMSNorm(x + residual) quantized to e4m3 per token: fused kernel vs rms_norm + quantize_fp8."""
    import torch

    from pagoda.kernels import ops
    from pagoda.kernels.norm_quant_ref import rms_norm_quant_fp8_ref

    x, r = (torch.randn(rows, hidden, device=bench.device).bfloat16() for _ in range(2))
    w = (torch.rand(hidden, device=bench.device) + 0.5).bfloat16()

    def fused():
        return ops.rms_norm_quant_fp8(x, w, 1e-5, r)

    def unfused():
        out, new_r = ops.rms_norm(x, w, 1e-5, r)
        return ops.quantize_fp8(out), new_r

    def norm_only():
        return ops.rms_norm(x, w, 1e-5, r)

    timing = {label: round(bench.time_ms(fn, bench.rep), 5) for label, fn in
              (("fused_ms", fused), ("unfused_ms", unfused), ("norm_only_ms", norm_only))}
    (q, s), new_r = fused()
    (q_ref, s_ref), r_ref = rms_norm_quant_fp8_ref(x, w, 1e-5, r)
    same = float((q.float() == q_ref.float()).float().mean())
    scale_err = float(((s - s_ref).abs() / s_ref).max())
    ok = same > 0.99 and scale_err < 1e-2 and torch.equal(new_r, r_ref)
    out = dict(rows=rows, hidden=hidden, **timing, speedup_vs_unfused=round(timing["unfused_ms"] / timing["fused_ms"], 3),
               q_equal_fraction=round(same, 5), scale_max_rel_err=scale_err, residual_equal=torch.equal(new_r, r_ref), ok=ok)
    print(f"  norm+quant rows={rows:5d}: fused {timing['fused_ms'] * 1e3:6.1f} us, unfused {timing['unfused_ms'] * 1e3:6.1f} us,"
          f" norm alone {timing['norm_only_ms'] * 1e3:6.1f} us; q equal {same:.4f} {'ok' if ok else 'MISMATCH'}")
    return out


def entry(r: dict) -> str | None:
    """An FP8_SMALL_M line where the fastest FP8 path beats quantize + _scaled_mm and passed its check."""
    top = r[r["fastest"]]
    if top["ms"] >= r["scaled_mm"]["ms"] or top["max_abs_err"] > MAX_ABS_ERR:
        return None
    path, cls = ENTRY[r["fastest"]]
    cfg = ", ".join(f"{k}={v}" for k, v in r[r["fastest"]]["config"].items())
    return f"    ({r['m']}, {r['n']}, {r['k']}, {r['act']!r}): Fp8Launch({path!r}, {cls}({cfg})),"


def main(argv=None) -> int:
    args = parse_args(argv)
    started = begin(args)
    if started is None:
        return 2
    bench, meta = started
    import torch

    start = time.perf_counter()
    rows, best = [], {}
    # sweep rows first: their best gemv2 and scaled_gemv launches are reused at the other row counts
    order = sorted(args.rows, key=lambda m: (m not in args.sweep_rows, m))
    for m in order:
        for name, (n, k, act) in (SMOKE_SHAPES if args.smoke else SHAPES).items():
            rows.append(bench_shape(bench, name, m, n, k, act, m in args.sweep_rows, best, args.sweep_old))
            if not args.smoke:
                torch.cuda.empty_cache()  # the rotation copies of the last shape
        print(f"  ({time.perf_counter() - start:.0f} s so far)")
    rows.sort(key=lambda r: r["m"])
    hidden = 256 if args.smoke else 4096
    norms = [bench_norm_quant(bench, m, hidden) for m in (SMOKE_NORM_ROWS if args.smoke else NORM_ROWS)]

    # Per decode step, the 32 layers' four projections (the LM head stays bf16 either way).
    def step(m, path):  # a path a shape lacks counts as missing (None)
        times = [r[path]["ms"] for r in rows if r["m"] == m and path in r]
        return round(LAYERS * sum(times), 4) if len(times) == sum(r["m"] == m for r in rows) else None

    step_ms = {m: {p: step(m, p) for p in ("scaled_mm", "bf16", *PATHS)} for m in args.rows}
    for m in args.rows:
        step_ms[m]["fastest"] = round(LAYERS * sum(r[r["fastest"]]["ms"] for r in rows if r["m"] == m), 4)
    checked = ("scaled_mm", *PATHS)
    failed = [r for r in rows if max(r[p]["max_abs_err"] for p in checked if p in r) > MAX_ABS_ERR or "errors" in r]
    failed_norms = [n for n in norms if not n["ok"]]
    entries = [e for e in map(entry, rows) if e]
    body = dict(peak_tb_per_s=PEAK_TB_PER_S, figure="weight bytes / CUDA-graph replay median",
                num_sms=bench.num_sms, seconds=round(time.perf_counter() - start, 1), layer_ms_per_step=step_ms,
                shapes=rows, norm_quant=norms, fp8_small_m_entries=entries, max_abs_err_allowed=MAX_ABS_ERR)
    table = [f"{'M':>2s} {'shape':13s} {'scaled_mm us':>12s} {'bf16 TB/s':>10s} {'GEMV TB/s':>9s} "
             f"{'GEMV2 TB/s':>10s} {'dot TB/s':>8s} {'fastest':>16s} {'vs mm':>6s}"]

    def tb(r, *paths):
        return max((r[p]["tb_per_s"] for p in paths if p in r), default=float("nan"))

    for r in rows:
        table.append(f"{r['m']:2d} {r['name']:13s} {r['scaled_mm']['ms'] * 1e3:12.1f} {r['bf16']['tb_per_s']:10.2f} "
                     f"{tb(r, 'fp8_gemv', 'fp8_best'):9.2f} {tb(r, 'gemv2', 'gemv2_best'):10.2f} "
                     f"{tb(r, 'scaled_gemv', 'scaled_gemv_best'):8.2f} {r['fastest']:>16s} {r['speedup_vs_scaled_mm']:6.2f}")
    table.append(f"\nlinear layers per decode step (ms, 32 layers): {step_ms}")
    failure = None
    if failed or failed_norms:
        failure = (f"{len(failed)} FP8 results failed to run or disagree with their references beyond {MAX_ABS_ERR}; "
                   f"{len(failed_norms)} fused norm+quant results disagree with rms_norm_quant_fp8_ref")
    return report(args, meta, "gemv-fp8", body, table,
                  {"FP8_SMALL_M entries (pagoda.kernels.fp8_dispatch)": entries}, failure, start)


if __name__ == "__main__":
    sys.exit(main())
