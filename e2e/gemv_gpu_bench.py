"""The Triton GEMV against cuBLAS at decode's few rows, on Llama-3.1-8B's linear shapes in bf16.

Run on the H200 from the repository root, after `source e2e/gpu_env.sh` (about 3 minutes):
    python3 e2e/gemv_gpu_bench.py [--out DIR] [--rows 1 4] [--no-sweep]
and on the CPU first, to check the script (tiny shapes, Triton's interpreter, perf_counter times
that mean nothing):
    .venv/bin/python e2e/gemv_gpu_bench.py --smoke --out /tmp/gemv-smoke

For each (N, K) and row count it times F.linear (cuBLAS), the GEMV with its default launch and a
pruned sweep of the launch knobs (tiles x warps first, then stages, fold and split-K on the best
tile), as CUDA-graph replays, the way the engine runs decode. The figure is weight bytes over time.
Each timed call reads the next of several weight copies that together exceed L2 several times
over: in a real step every layer's weights are cold, and a 32 MB o_proj replayed alone would sit
in the 50 MB L2. Then the MLP's down projection with silu_and_mul fused into the GEMV against
silu_and_mul + F.linear. One JSON goes to --out (default $OUT, else e2e/results/), and the best configs are
printed as entries for pagoda.kernels.gemv.FASTER_THAN_CUBLAS where they beat cuBLAS.
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
PEAK_TB_PER_S = 4.25
L2_ROTATION_BYTES = 256 << 20  # weight copies per shape add up to at least this (H200 L2: 50 MB)
LAYERS = 32  # Llama-3.1-8B: the per-step saving counts each layer shape 32 times, lm_head once
SHAPES = {  # name: (N, K)
    "qkv_proj": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (28672, 4096),
    "down_proj": (4096, 14336),
    "lm_head": (128256, 4096),
}
SMOKE_SHAPES = {"odd": (67, 130), "down_like": (48, 256)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "results"))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4], help="rows of x (decode batch)")
    p.add_argument("--no-sweep", action="store_true", help="cuBLAS and the default launch only")
    p.add_argument("--rep", type=int, default=10, help="ms of replays per sweep point (headlines: 5x)")
    p.add_argument("--smoke", action="store_true", help="CPU check: tiny shapes under TRITON_INTERPRET=1")
    return p.parse_args(argv)


class Bench:
    def __init__(self, args):
        import torch

        self.torch, self.smoke, self.rep = torch, args.smoke, args.rep
        self.device = torch.device("cpu" if args.smoke else "cuda")
        self.num_sms = 132 if args.smoke else torch.cuda.get_device_properties(0).multi_processor_count

    def time_ms(self, fn, rep: int) -> float:
        if self.smoke:  # the interpreter: only proves the call runs
            fn()
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        from triton.testing import do_bench_cudagraph

        return do_bench_cudagraph(fn, rep=rep, return_mode="median")

    def weights(self, n: int, k: int) -> list:
        nbytes = n * k * 2
        copies = 2 if self.smoke else max(2, -(-L2_ROTATION_BYTES // nbytes))
        return [self.torch.randn(n, k, device=self.device).div_(k**0.5).bfloat16() for _ in range(copies)]

    def timed(self, call, weights, nbytes: int, rep: int) -> dict:
        """call(w) on each weight copy in turn; weight bytes over the median replay time."""
        cycle = itertools.cycle(weights)
        ms = self.time_ms(lambda: call(next(cycle)), rep)
        return dict(ms=round(ms, 5), tb_per_s=round(nbytes / (ms * 1e-3) / 1e12, 3))


def tile_candidates(m: int, n: int, k: int, num_sms: int, smoke: bool, weight_bytes: int = 2):
    """BLOCK_N x BLOCK_K x warps that load at least 32 bytes of W per thread and step (fewer starve
    HBM) and widen at most 128 weights per thread to fp32 (more cost occupancy), with m
    accumulators of at most 64 fp32 values per thread, folding one 16-byte load, and give every SM
    a row block (split-K is tried later, on the best tile only)."""
    from pagoda.kernels.gemv import VECTOR_BYTES, GemvConfig

    fold = VECTOR_BYTES // weight_bytes
    if smoke:  # blocks small enough that the tiny shapes take several K chunks and a split
        return [GemvConfig(16, 32, 1, 4, 1, fold=fold), GemvConfig(8, 64, 1, 4, 1, fold=1)]
    tiles = []
    block_ks = (128, 256, 512, 1024, 2048)[: 5 if weight_bytes == 1 else 4]  # 2 KB rows at most
    for bn, bk, warps in itertools.product((8, 16, 32, 64), block_ks, (4, 8)):
        threads = warps * 32
        weights, acc = bn * bk // threads, m * bn * bk // (fold * threads)
        fits_k = bk <= max(16, 1 << (k - 1).bit_length())
        if 32 <= weights * weight_bytes and weights <= 128 and acc <= 64 and fits_k and -(-n // bn) >= num_sms:
            tiles.append(GemvConfig(bn, bk, 1, warps, 1, fold=fold))
    return tiles


def sweep(bench: Bench, m, n, k, x, weights, default_cfg, call=None, weight_bytes: int = 2) -> list[dict]:
    """The launch knobs around default_cfg; call(w, cfg) runs one (the bf16 GEMV by default)."""
    from pagoda.kernels.gemv import gemv

    call = call or (lambda w, cfg: gemv(x, w, config=cfg))
    points: dict = {}

    def measure(cfg):
        if cfg in points:
            return
        try:
            p = bench.timed(lambda w: call(w, cfg), weights, n * k * weight_bytes, bench.rep)
        except Exception as exc:  # e.g. out of registers or shared memory for this tile
            print(f"    {cfg}: skipped ({type(exc).__name__}: {str(exc)[:80]})")
            return
        points[cfg] = p

    def best():
        return min(points, key=lambda c: points[c]["ms"])

    measure(default_cfg)
    for cfg in tile_candidates(m, n, k, bench.num_sms, bench.smoke, weight_bytes):
        measure(cfg)
    top = best()
    for stages in (2, 3, 4)[: 0 if weight_bytes == 1 else 1 if bench.smoke else 3]:  # moot for bf16: FP8 skips
        measure(dataclasses.replace(top, num_stages=stages))
    if m * top.block_n * top.block_k <= 128 * 32 * top.num_warps:  # the unfolded product fits
        measure(dataclasses.replace(top, fold=1))
    top = best()
    if -(-n // top.block_n) < 4 * bench.num_sms:  # few row blocks: let K be shared
        for split in (2, 4, 8)[: 1 if bench.smoke else 3]:
            if k >= 2 * split * top.block_k:
                measure(dataclasses.replace(top, split_k=split))
    print(f"    swept {len(points)} launches")
    return sorted(
        (dict(config=dataclasses.asdict(c), **p) for c, p in points.items()), key=lambda p: p["ms"]
    )


def max_abs_err(got, want) -> float:
    return float((got.float() - want.float()).abs().max())


def bench_shape(bench: Bench, name: str, m: int, n: int, k: int, do_sweep: bool) -> dict:
    import torch.nn.functional as F

    from pagoda.kernels.gemv import GemvConfig, gemv, gemv_config

    torch = bench.torch
    nbytes = n * k * 2
    weights = bench.weights(n, k)
    x = torch.randn(m, k, device=bench.device).bfloat16()
    head_rep = bench.rep * 5
    default_cfg = gemv_config(m, n, k, bench.num_sms)
    want = F.linear(x, weights[0])
    fp32 = F.linear(x.float(), weights[0].float())
    row = dict(
        name=name, m=m, n=n, k=k, weight_bytes=nbytes, copies=len(weights),
        cublas=dict(bench.timed(lambda w: F.linear(x, w), weights, nbytes, head_rep),
                    max_abs_err_vs_fp32=max_abs_err(want, fp32)),
        default=dict(config=dataclasses.asdict(default_cfg),
                     **bench.timed(lambda w: gemv(x, w, config=default_cfg), weights, nbytes, head_rep),
                     max_abs_err=max_abs_err(gemv(x, weights[0], config=default_cfg), want),
                     max_abs_err_vs_fp32=max_abs_err(gemv(x, weights[0], config=default_cfg), fp32)),
    )
    del fp32
    if do_sweep:
        row["sweep"] = sweep(bench, m, n, k, x, weights, default_cfg)
        best_cfg = GemvConfig(**row["sweep"][0]["config"])
        row["best"] = dict(
            config=dataclasses.asdict(best_cfg),
            **bench.timed(lambda w: gemv(x, w, config=best_cfg), weights, nbytes, head_rep),
            max_abs_err=max_abs_err(gemv(x, weights[0], config=best_cfg), want),
        )
    top = row.get("best", row["default"])
    row["speedup_vs_cublas"] = round(row["cublas"]["ms"] / top["ms"], 3)
    row["saving_ms"] = round(row["cublas"]["ms"] - top["ms"], 5)
    print(f"  M={m} {name:13s} N={n:6d} K={k:5d}: cuBLAS {row['cublas']['tb_per_s']:.2f} TB/s, "
          f"default {row['default']['tb_per_s']:.2f}, best {top['tb_per_s']:.2f} TB/s "
          f"({row['speedup_vs_cublas']:.2f}x) {top['config']}  err {top['max_abs_err']:.3g}")
    return row


def bench_silu_mul_down(bench: Bench, m: int, n: int, k: int, best_cfg) -> dict:
    """down(silu(gate) * up): silu_and_mul then cuBLAS (the path above 4 rows) vs the fused GEMV."""
    import torch.nn.functional as F

    from pagoda.kernels.activation import silu_and_mul
    from pagoda.kernels.gemv import gemv, gemv_config
    from pagoda.kernels.gemv_ref import gemv_ref

    torch = bench.torch
    nbytes = n * k * 2
    weights = bench.weights(n, k)
    gate_up = torch.randn(m, 2 * k, device=bench.device).bfloat16()
    rep = bench.rep * 5
    want = gemv_ref(gate_up, weights[0], act="silu_mul")
    out = dict(m=m, n=n, k=k, unfused_cublas=bench.timed(lambda w: F.linear(silu_and_mul(gate_up), w),
                                                         weights, nbytes, rep))
    for label, cfg in (("fused_default", gemv_config(m, n, k, bench.num_sms)), ("fused_best", best_cfg)):
        if cfg is None:
            continue
        out[label] = dict(config=dataclasses.asdict(cfg),
                          **bench.timed(lambda w, c=cfg: gemv(gate_up, w, act="silu_mul", config=c),
                                        weights, nbytes, rep),
                          max_abs_err=max_abs_err(gemv(gate_up, weights[0], act="silu_mul", config=cfg), want))
    top = out.get("fused_best", out["fused_default"])
    out["saving_ms"] = round(out["unfused_cublas"]["ms"] - top["ms"], 5)
    print(f"  M={m} silu_mul+down: silu_and_mul + cuBLAS {out['unfused_cublas']['ms'] * 1e3:.1f} us, "
          f"fused {top['ms'] * 1e3:.1f} us ({top['tb_per_s']:.2f} TB/s), err {top['max_abs_err']:.3g}")
    return out


def metadata(smoke: bool) -> dict:
    sys.path.insert(0, str(HERE))
    from kernels_gpu import run_metadata

    if not smoke:
        return run_metadata()
    import datetime

    import torch
    import triton

    return dict(backend="pagoda", gpu="cpu (smoke: TRITON_INTERPRET=1, times mean nothing)",
                commit="smoke", torch=torch.__version__, triton=triton.__version__,
                command=" ".join([Path(sys.executable).name, *sys.argv]),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def begin(args) -> tuple[Bench, dict] | None:
    """The interpreter for --smoke (set before any kernel is decorated), the seed, the metadata;
    None without a GPU."""
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print(f"{Path(sys.argv[0]).name} needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return None
    torch.manual_seed(0)
    bench = Bench(args)
    meta = metadata(args.smoke)
    print(f"{meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}  SMs {bench.num_sms}")
    return bench, meta


def report(args, meta: dict, workload: str, body: dict, table: list[str], entries: dict[str, list[str]],
           failed: str | None, started: float) -> int:
    """The end every GEMV bench shares: the JSON (workload-pagoda-DATE.json) into --out, the
    summary table, the table entries to paste (title -> lines), and exit 1 when a check failed."""
    from kernels_gpu import write_result

    path = write_result(args.out, workload, meta, dict(body, passed=not failed))
    print("\n" + "\n".join(table))
    for title, lines in entries.items():
        if lines:
            print(f"\n{title}:\n" + "\n".join(lines))
    print(f"\nresult: {path} ({time.perf_counter() - started:.0f} s)")
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    started = begin(args)
    if started is None:
        return 2
    bench, meta = started
    import torch

    from pagoda.kernels.gemv import GemvConfig

    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    start = time.perf_counter()
    rows, silu, saving = [], [], {}
    for m in args.rows:
        for name, (n, k) in shapes.items():
            rows.append(bench_shape(bench, name, m, n, k, not args.no_sweep))
            if not args.smoke:
                torch.cuda.empty_cache()  # the rotation copies of the last shape
        down_name = "down_like" if args.smoke else "down_proj"
        down = next(r for r in rows if r["m"] == m and r["name"] == down_name)
        best = GemvConfig(**down["best"]["config"]) if "best" in down else None
        silu.append(bench_silu_mul_down(bench, m, down["n"], down["k"], best))
        layer = [r["saving_ms"] * (1 if r["name"] == "lm_head" else LAYERS) for r in rows if r["m"] == m]
        saving[m] = round(sum(layer) + LAYERS * (silu[-1]["saving_ms"] - down["saving_ms"]), 4)
        print(f"  M={m}: estimated saving per decode step {saving[m]:.3f} ms "
              f"({time.perf_counter() - start:.0f} s so far)")

    failed = [r for r in rows if r.get("best", r["default"])["max_abs_err"] > 0.125]
    failed += [s for s in silu if s.get("fused_best", s["fused_default"])["max_abs_err"] > 0.125]
    # The runtime takes the GEMV only where it beats cuBLAS (FASTER_THAN_CUBLAS), at its best launch.
    tuned = [f"    ({r['m']}, {r['n']}, {r['k']}, None): {GemvConfig(**r.get('best', r['default'])['config'])!r},"
             for r in rows if r.get("best", r["default"])["ms"] < r["cublas"]["ms"]]
    tuned += [f"    ({s['m']}, {s['n']}, {s['k']}, 'silu_mul'): "
              f"{GemvConfig(**s.get('fused_best', s['fused_default'])['config'])!r},"
              for s in silu if s.get("fused_best", s["fused_default"])["ms"] < s["unfused_cublas"]["ms"]]
    body = dict(peak_tb_per_s=PEAK_TB_PER_S, figure="weight bytes / CUDA-graph replay median",
                num_sms=bench.num_sms, seconds=round(time.perf_counter() - start, 1),
                est_step_saving_ms=saving, shapes=rows, silu_mul_down=silu, tuned_entries=tuned)
    table = [f"{'M':>2s} {'shape':13s} {'cuBLAS TB/s':>12s} {'default':>8s} {'best':>8s} {'speedup':>8s}"]
    for r in rows:
        top = r.get("best", r["default"])
        table.append(f"{r['m']:2d} {r['name']:13s} {r['cublas']['tb_per_s']:12.2f} {r['default']['tb_per_s']:8.2f} "
                     f"{top['tb_per_s']:8.2f} {r['speedup_vs_cublas']:8.2f}")
    failure = f"{len(failed)} results disagree with F.linear beyond 0.125" if failed else None
    return report(args, meta, "gemv", body, table, {"FASTER_THAN_CUBLAS entries (pagoda.kernels.gemv)": tuned},
                  failure, start)


if __name__ == "__main__":
    sys.exit(main())
