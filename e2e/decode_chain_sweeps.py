"""The launch sweeps of e2e/decode_chain_gpu_bench.py: each projection's GEMV launch (sweep), the TMA
GEMV's tiles (tma_sweep), the rope fold's qkv launch (rope_sweep) and every launch's num_stages
(stages), each timed inside the whole decode chain with PDL on, the others at their best so far."""

from __future__ import annotations

import dataclasses
import itertools
import time

from decode_chain import FOLDED, SHAPES, Chain, run_chain


def candidates(name: str, smoke: bool, first=None):
    """1-row launches of the FP8 GEMV to try for a projection: the runtime's own (first), then
    tiles of 16 to 128 weights a thread, fold 16 (one 16-byte load) or 1, in a fixed shuffled order,
    so that a time budget samples the whole grid."""
    import random

    from pagoda.kernels.gemv import GemvConfig

    if smoke:
        return [GemvConfig(16, 32, 1, 4, 1, fold=16), GemvConfig(8, 64, 1, 4, 1, fold=1)]
    n, k, act = SHAPES[name]
    n = n // 2 if act == "silu_mul_out" else n  # output rows: each program reads its rows of both halves
    grid = []
    # up to a whole 4096-wide row per chunk: the first chunk is loaded before the PDL wait, so a
    # program that holds all its K streams its whole share while the kernels before it still run
    for bn, bk, warps, fold in itertools.product((2, 4, 8, 16, 32), (256, 512, 1024, 2048, 4096), (4, 8), (1, 16)):
        if bn * bk // (warps * 32) in (16, 32, 64, 128) and bk <= k and n // bn >= 132:
            grid.append(GemvConfig(bn, bk, 1, warps, 1, fold=fold))
    random.Random(0).shuffle(grid)
    head = [first] if first is not None else []
    return head + [c for c in grid if c not in head]


def fastest(torch, chain: Chain, args, name: str, tiles, table: dict) -> dict:
    """Times the chain, PDL on, with table[name] (chain.configs or chain.tma_configs) at each of
    `tiles` in turn, within --budget-s, and leaves the fastest there: the tried count and the best six."""
    points, began = [], time.perf_counter()
    for cfg in tiles:
        if time.perf_counter() - began > args.budget_s:
            break
        table[name] = cfg
        try:
            ms, _ = run_chain(torch, chain, True, max(20, args.replays // 4), args.smoke)
        except Exception as exc:  # out of registers or shared memory for this tile
            print(f"  {name} {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        points.append((ms if ms is not None else 0.0, cfg))
    points.sort(key=lambda p: p[0])
    table[name] = points[0][1]
    best = [dict(ms=round(ms, 4), config=dataclasses.asdict(cfg)) for ms, cfg in points[:6]]
    print(f"  {name}: best of {len(points)} {best[0]}", flush=True)
    return dict(tried=len(points), best=best)


def sweep(torch, chain: Chain, args) -> dict:
    """Each folded projection's launch over candidates(), PDL on, the others at their best so far."""
    out = {}
    for name in FOLDED:
        runtime = None if args.smoke else chain.runtime_config(name, chain.x.new_empty(1, SHAPES[name][1]))
        out[name] = dict(runtime=runtime and dataclasses.asdict(runtime),
                         **fastest(torch, chain, args, name, candidates(name, args.smoke, runtime), chain.configs))
    return out


def tma_sweep(torch, chain: Chain, args) -> dict:
    """The glu+tma chain, PDL on: each projection's TMA tile over a grid (within --budget-s), the
    others at their best so far; then the chain at the winners. Prints fp8_dispatch.TMA_TILES entries."""
    from pagoda.kernels.gemv_tma import TmaGemvConfig

    chain.folds = frozenset(("glu", "tma"))
    grid = [TmaGemvConfig(bn, bk, w, st) for bn, bk, st, w in itertools.product((8, 16, 32, 64), (128, 256), (3, 4, 6), (4, 8))]
    if args.smoke:
        grid = [TmaGemvConfig(8, 32, 1, 2), TmaGemvConfig(16, 64, 1, 3)]
    out = {name: fastest(torch, chain, args, name, grid, chain.tma_configs) for name in FOLDED}
    for on in (False, True):
        ms, _ = run_chain(torch, chain, on, args.replays, args.smoke)
        out[f"best_pdl_{'on' if on else 'off'}_ms"] = ms and round(ms, 4)
    for name, cfg in chain.tma_configs.items():  # keyed as fp8_dispatch looks them up: the weight's N
        print(f"    {SHAPES[name]}: {cfg},")
    print(f"  tma at the swept tiles: off {out['best_pdl_off_ms']} on {out['best_pdl_on_ms']}", flush=True)
    chain.tma_configs, chain.folds = {}, frozenset(("glu",))
    return out


def rope_sweep(torch, chain: Chain, args) -> dict:
    """The glu+rope chain, PDL on: qkv_proj's launch of the rope fold over candidates() with one K
    split and block_n dividing head_dim / 2, within --budget-s; prints fp8_dispatch.ROPE_KV_TILES' entry."""
    chain.folds = frozenset(("glu", "rope"))
    half = chain.d["head_dim"] // 2
    runtime = None if args.smoke else chain.runtime_config("qkv_proj", chain.x.new_empty(1, SHAPES["qkv_proj"][1]))
    tiles = [c for c in candidates("qkv_proj", args.smoke, runtime) if c.split_k == 1 and half % c.block_n == 0]
    out = fastest(torch, chain, args, "qkv_proj", tiles, chain.configs)
    for on in (False, True):
        ms, _ = run_chain(torch, chain, on, args.replays, args.smoke)
        out[f"best_pdl_{'on' if on else 'off'}_ms"] = ms and round(ms, 4)
    n, k, _ = SHAPES["qkv_proj"]
    print(f"    ({n}, {k}): {chain.configs.get('qkv_proj')},")
    print(f"  rope at the swept launch: off {out['best_pdl_off_ms']} on {out['best_pdl_on_ms']}", flush=True)
    chain.configs.pop("qkv_proj", None)
    chain.folds = frozenset(("glu",))
    return out


def stages(torch, chain: Chain, args) -> dict:
    """The chain at the engine's folds, PDL on, with every GEMV launch at each num_stages asked for."""
    out = {}
    for n in [int(s) for s in args.stages.split(",")]:
        for name in FOLDED:
            cfg = chain.runtime_config(name, chain.x.new_empty(1, SHAPES[name][1]))
            chain.configs[name] = dataclasses.replace(cfg, num_stages=n)
        try:
            ms, _ = run_chain(torch, chain, True, args.replays, args.smoke)
            out[str(n)] = round(ms, 4)
        except Exception as exc:  # out of shared memory for this depth
            out[str(n)] = f"{type(exc).__name__}: {str(exc)[:80]}"
        print(f"  num_stages {n}: {out[str(n)]}", flush=True)
    chain.configs.clear()
    return out
