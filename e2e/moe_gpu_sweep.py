"""Where one bf16 MoE layer of W5's shape spends its GPU time, and which tiles suit it.

Run on the H200 from the repository root, after `source e2e/gpu_env.sh` (about two minutes):
    python3 e2e/moe_gpu_sweep.py [--out DIR] [--tokens 256 8192]
and on the CPU first, to check the script (tiny shapes, Triton's interpreter, times that mean
nothing):
    .venv/bin/python e2e/moe_gpu_sweep.py --smoke --out /tmp/moe-sweep-smoke

The layer is Qwen3-30B-A3B's (hidden 2048, 128 experts of inter 768, top-8; its 1.2 GB of experts
is far past the L2, so one copy is cold enough). For each token count (256: a W5 decode step at
256 seats; 8192: a full prefill chunk) it times, as CUDA-graph replays:
- routing: the torch reference (five ops) and the Triton kernel (moe_route.py);
- grouping by expert: the torch reference (fused_moe_ref.align_by_expert_ref) and the Triton
  kernels (moe_align.py);
- the whole fused_moe at each candidate tile (block_m, block_n, block_k, warps, stages), the
  default first, each checked against fused_moe_ref in fp32.
One JSON (moe-sweep-pagoda-DATE.json) goes to --out (default $OUT, else e2e/results/).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gemv_gpu_bench import begin, max_abs_err, report  # noqa: E402

SHAPE = dict(hidden=2048, inter=768, experts=128, top_k=8)
SMOKE_SHAPE = dict(hidden=48, inter=24, experts=6, top_k=2)
# (block_m, block_n, block_k, num_warps, num_stages); block_n is per projection (gate and up each)
DECODE_TILES = [(16, 64, 128, 4, 3), (16, 64, 128, 4, 4), (16, 64, 256, 4, 2), (16, 128, 128, 4, 2),
                (16, 128, 128, 4, 3), (32, 64, 128, 4, 2), (32, 64, 128, 4, 4), (32, 128, 128, 4, 2),
                (32, 128, 64, 4, 4), (16, 32, 256, 4, 3)]
PREFILL_TILES = [(128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (64, 128, 64, 4, 3), (64, 64, 64, 4, 4),
                 (128, 64, 64, 4, 4), (64, 128, 32, 4, 4), (128, 128, 32, 8, 4), (128, 64, 64, 8, 4)]
MAX_ABS_ERR = 0.0625  # outputs of order 1, a few bf16 ulps from the fp32 reference


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "results"))
    p.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 1024, 8192])
    p.add_argument("--tiles-file", type=Path, default=None,
                   help="merge each count's best tile into this moe_tiles.json (default: kernels/moe_tiles.json; "
                        "with --smoke, OUT/moe_tiles.json)")
    p.add_argument("--rep", type=int, default=40, help="ms of replays per point")
    p.add_argument("--smoke", action="store_true", help="CPU check: tiny shapes under TRITON_INTERPRET=1")
    return p.parse_args(argv)


def as_config(tile) -> dict:
    bm, bn, bk, warps, stages = tile
    return dict(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)


def bench_tokens(bench, shape: dict, tokens: int) -> dict:
    from pagoda.kernels.fused_moe import default_config, fused_moe
    from pagoda.kernels.fused_moe_ref import align_by_expert_ref, fused_moe_ref, route_ref
    from pagoda.kernels.moe_align import align_by_expert
    from pagoda.kernels.moe_route import moe_route

    torch = bench.torch
    h, i, e, k = shape["hidden"], shape["inter"], shape["experts"], shape["top_k"]
    x = torch.randn(tokens, h, device=bench.device).bfloat16()
    w13 = (torch.randn(e, 2 * i, h, device=bench.device) * h**-0.5).bfloat16()
    w2 = (torch.randn(e, h, i, device=bench.device) * i**-0.5).bfloat16()
    logits = torch.randn(tokens, e, device=bench.device).bfloat16()
    weights, ids = route_ref(logits, k, renormalize=True)
    row = dict(tokens=tokens, experts_touched=int(torch.unique(ids).numel()))
    row["route_ms"] = dict(torch=bench.time_ms(lambda: route_ref(logits, k, True), bench.rep),
                           triton=bench.time_ms(lambda: moe_route(logits, k, True), bench.rep))
    bm = default_config(ids.numel(), e, x.device)["block_m"]
    row["align_ms"] = dict(torch=bench.time_ms(lambda: align_by_expert_ref(ids, e, bm), bench.rep),
                           triton=bench.time_ms(lambda: align_by_expert(ids, e, bm), bench.rep))
    want = fused_moe_ref(x.float(), w13.float(), w2.float(), weights.float(), ids)
    default = default_config(ids.numel(), e, x.device)
    tiles = [tuple(default[n] for n in ("block_m", "block_n", "block_k", "num_warps", "num_stages"))]
    if bench.smoke:
        tiles.append((16, 16, 16, 1, 1))
    else:
        tiles += [t for t in (DECODE_TILES if tokens <= 512 else PREFILL_TILES) if t != tiles[0]]
    expert_bytes = row["experts_touched"] * 3 * h * i * 2
    points = []
    for tile in tiles:
        cfg = as_config(tile)
        try:
            err = max_abs_err(fused_moe(x, w13, w2, weights, ids, config=cfg), want)
            ms = bench.time_ms(lambda cfg=cfg: fused_moe(x, w13, w2, weights, ids, config=cfg), bench.rep)
        except Exception as exc:  # a tile past the shared memory: recorded, not fatal
            points.append(dict(tile=tile, error=f"{type(exc).__name__}: {str(exc)[:200]}"))
            continue
        points.append(dict(tile=tile, ms=round(ms, 5), max_abs_err=err,
                           tb_per_s=round(expert_bytes / (ms * 1e-3) / 1e12, 3)))
    row["tiles"] = points
    timed = [p for p in points if "ms" in p]
    row["best"] = min(timed, key=lambda p: p["ms"]) if timed else None
    row["default"] = points[0]
    return row


def save_best(path: Path | None, gpu: str, shape: dict, rows: list[dict]) -> Path:
    """Merge each token count's fastest tile into moe_tiles.json under this GPU and shape."""
    import json

    import torch

    from pagoda.kernels import moe_tiles

    path = path or moe_tiles.TILES_FILE
    table = json.loads(path.read_text()) if path.exists() else {}
    key = moe_tiles.shape_key(shape["experts"], shape["hidden"], shape["inter"], torch.bfloat16)
    by_tokens = table.setdefault(gpu, {}).setdefault(key, {})
    for row in rows:
        if row["best"]:
            by_tokens[str(row["tokens"])] = list(row["best"]["tile"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return path


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    begun = begin(args)
    if begun is None:
        return 2
    bench, meta = begun
    shape = SMOKE_SHAPE if args.smoke else SHAPE
    tokens = [3, 40] if args.smoke else args.tokens
    rows, failed = [], None
    table = ["tokens  route torch/triton ms   align torch/triton ms   default tile ms        best tile ms"]
    for t in tokens:
        row = bench_tokens(bench, shape, t)
        rows.append(row)
        d, b = row["default"], row["best"] or {}
        table.append(f"{t:>6}  {row['route_ms']['torch']:.4f} / {row['route_ms']['triton']:.4f}      "
                     f"{row['align_ms']['torch']:.4f} / {row['align_ms']['triton']:.4f}      "
                     f"{d.get('ms', float('nan')):.4f} {d['tile']}  {b.get('ms', float('nan')):.4f} {b.get('tile')}")
        for p in row["tiles"]:
            if "ms" in p and not p["max_abs_err"] <= MAX_ABS_ERR:
                failed = f"tile {p['tile']} at {t} tokens: max abs err {p['max_abs_err']:.3g} > {MAX_ABS_ERR}"
    tiles_file = args.tiles_file or (args.out / "moe_tiles.json" if args.smoke else None)
    if not failed:
        tiles_file = save_best(tiles_file, "cpu" if args.smoke else bench.torch.cuda.get_device_name(0), shape, rows)
        table.append(f"best tiles merged into {tiles_file}")
    body = dict(shape=shape, rows=rows, max_abs_err_bound=MAX_ABS_ERR, smoke=args.smoke)
    return report(args, meta, "moe-sweep", body, table, {}, failed, started)


if __name__ == "__main__":
    sys.exit(main())
