"""One decode token of Llama-3.1-8B's 32 layers at one row, as the runtime's kernels run it, with and
without programmatic dependent launch (kernels/pdl.py), and the FP8 GEMV's launches swept in place.

Run on the H200 from the repository root, after `source e2e/gpu_env.sh` (about 3 minutes):
    python3 e2e/decode_chain_gpu_bench.py [--out DIR] [--dtype fp8|bf16|both] [--no-sweep]
and on the CPU first, to check the script (two tiny layers, Triton's interpreter, no timing):
    .venv/bin/python e2e/decode_chain_gpu_bench.py --smoke

Each layer is the chain W2 replays per token: RMSNorm (+ residual), qkv GEMV, rotary + KV write,
split-KV decode attention over 512 cached positions and its merge, o GEMV, RMSNorm, gate_up GEMV,
down GEMV with SiLU fused (bf16: ops.linear's choice, cuBLAS where it wins). Every layer has its own
weights and cache, so nothing is warm in L2 that would not be in a real step; the LM head is left out.
The 32 layers are captured as one CUDA graph and replayed; the figure is the median replay.

- chain: PDL off and on at the runtime's launches (FP8: kernels/fp8_dispatch's 1-row entries), and
  the hidden state after 32 layers must be the same bits both ways (PDL moves when a kernel starts,
  never what it computes; a missing wait would show here as a race).
- variants: the GEMV folds (FP8: "norm", the RMSNorm in the qkv and gate_up GEMVs with a pass over
  the row for rstd; "sumsq", the same from sums of squares that o_proj and down write as they add
  to the residual stream; "glu", silu(gate) * up in gate_up's epilogue and a plain down GEMV, the
  engine's --fold-gemv; "tma", every GEMV the one-row TMA kernel of kernels/gemv_tma.py, paired
  with glu; "rope", the qkv GEMV rotating q and k and writing the cache in its epilogue,
  kernels/gemv_rope.py, the engine's --fold-rope-kv, FP8 and bf16) and the decode attention's
  merge in its own kernel (kernels/paged_attention_decode.FUSED_MERGE), each on and off, PDL off and
  on; the folds change the rounding of rstd only, so their output is compared, not bit for bit
  (glu and rope change nothing: 0 on the GPU; --smoke runs the unfused pieces' torch references).
- sweep (FP8, PDL on, the engine's default folds: glu): each projection's GEMV launch over a grid
  of tiles, the other three at their best so far; then the chain at the winners, both ways.
- profile (--profile): the kernels of one eager token at the defaults, PDL off, microseconds each.
One JSON (decode-chain-pagoda-DATE.json) goes to --out (default $OUT, else e2e/results/).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 32, 4096, 32, 8, 128, 14336
CONTEXT, BLOCK = 512, 16
# projection: (N, K, act)
SHAPES = {"qkv_proj": (6144, 4096, None), "o_proj": (4096, 4096, None),
          "gate_up_proj": (2 * INTER, 4096, None), "down_proj": (4096, INTER, "silu_mul"),
          # with the folds: gate_up with silu(gate) * up in its epilogue, down fed the activation
          "gate_up_glu": (2 * INTER, 4096, "silu_mul_out"), "down_plain": (4096, INTER, None)}
WEIGHTS = {"gate_up_glu": "gate_up_proj", "down_plain": "down_proj"}  # the projection a variant reads
UNFOLDED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
FOLDED = ("qkv_proj", "o_proj", "gate_up_glu", "down_plain")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "results"))
    p.add_argument("--dtype", choices=("fp8", "bf16", "both"), default="both")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--variants", default=None,
                   help="comma-separated fold sets to run, '+' between folds (none,glu,sumsq+glu); "
                        "default: every one")
    p.add_argument("--merge", choices=("kernel", "fused", "both"), default="both")
    p.add_argument("--tma-sweep", action="store_true",
                   help="the glu+tma chain over a grid of TMA GEMV tiles, one tile for all four projections")
    p.add_argument("--rope-sweep", action="store_true",
                   help="the glu+rope chain over qkv_proj's launches of the rope fold (one split, block_n | 64)")
    p.add_argument("--stages", default=None,
                   help="comma-separated num_stages (2,3,4): the chain at the engine's folds with every FP8 GEMV "
                        "launch's num_stages set to each (Triton's pipeliner over the weight loads)")
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--budget-s", type=float, default=45.0, help="seconds of sweep per projection")
    p.add_argument("--profile", action="store_true", help="per-kernel times of one token (torch.profiler)")
    p.add_argument("--smoke", action="store_true")
    return p.parse_args(argv)


class Chain:
    """32 layers of weights, caches and the decode step's metadata, and the forward of one token."""

    def __init__(self, torch, device, fp8: bool, dims: dict):
        from pagoda.kernels.quant_fp8_ref import quantize_weight_fp8_ref

        self.torch, self.fp8, self.d = torch, fp8, dims
        d, bf16 = dims, torch.bfloat16
        shapes = {"qkv_proj": ((d["heads"] + 2 * d["kv_heads"]) * d["head_dim"], d["hidden"]),
                  "o_proj": (d["hidden"], d["heads"] * d["head_dim"]),
                  "gate_up_proj": (2 * d["inter"], d["hidden"]), "down_proj": (d["hidden"], d["inter"])}
        self.layers = []
        blocks = d["context"] // BLOCK + 1
        for _ in range(d["layers"]):
            layer = {}
            for name, (n, k) in shapes.items():
                w = (torch.randn(n, k, device=device) / k**0.5).to(bf16)
                layer[name] = quantize_weight_fp8_ref(w) if fp8 else (w,)
            layer["norms"] = [torch.ones(d["hidden"], device=device, dtype=bf16) + 0.01 * torch.randn(
                d["hidden"], device=device, dtype=bf16) for _ in range(2)]
            layer["cache"] = [torch.randn(blocks, BLOCK, d["kv_heads"], d["head_dim"], device=device).to(bf16)
                              for _ in range(2)]
            self.layers.append(layer)
        self.configs = {}  # projection -> GemvConfig overriding the runtime's launch (FP8 only)
        self.folds = frozenset()  # FP8: "norm" (the norms into the next GEMV), "glu" (silu(gate) * up),
        # "sumsq", "tma" (see the docstring)
        self.tma_configs = {}  # projection -> kernels.gemv_tma.TmaGemvConfig for "tma" (absent: its default)
        self.x = torch.randn(1, d["hidden"], device=device).to(bf16)
        self.positions = torch.tensor([d["context"] - 1], device=device)
        half = d["head_dim"] // 2
        inv = 1.0 / (10000 ** (torch.arange(half, device=device).float() / half))
        angles = torch.arange(d["context"] + 1, device=device).float()[:, None] * inv[None, :]
        self.cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
        self.slot = torch.tensor([d["context"] - 1], device=device)
        self.block_tables = torch.arange(blocks, device=device, dtype=torch.int32)[None, :]
        self.seq_lens = torch.tensor([d["context"]], device=device, dtype=torch.int32)
        self.qsl = torch.tensor([0, 1], device=device, dtype=torch.int32)

    def runtime_config(self, name, x):
        """The launch the runtime takes for a projection at one row (None on the CPU: the heuristic)."""
        from pagoda.kernels import fp8_dispatch, ops

        n, k, act = SHAPES[name]
        if not x.is_cuda:
            return None
        if act == "silu_mul_out":
            launch = fp8_dispatch.fused_glu(1, n, k, x.device)
        else:
            launch = ops.fp8_path(x, self.layers[0][WEIGHTS.get(name, name)][0], None, act)
        assert launch is not None and launch.path == "gemv", f"{name}: the runtime takes no GEMV at one row"
        return launch.config

    def linear(self, layer, name, x, norm=None, add_to=None):
        """The projection's output; with add_to (the residual stream), it is added there in place and
        (the stream, its squares summed per program) comes back, for the next GEMV's norm."""
        from pagoda.kernels import ops
        from pagoda.kernels.gemv import ResidualSumsq, gemv_config

        act = SHAPES[name][2]
        if self.fp8:
            w, s = layer[WEIGHTS.get(name, name)]
            if "tma" in self.folds and act != "silu_mul" and norm is None and add_to is None:
                from pagoda.kernels.gemv_tma import gemv_tma

                return gemv_tma(x, w, s, config=self.tma_configs.get(name), epilogue="silu_mul" if act else None)
            cfg = self.configs.get(name) or self.runtime_config(name, x)
            if act == "silu_mul_out":
                return ops.fp8_gemv(x, w, s, config=cfg, norm=norm, epilogue="silu_mul")
            if add_to is not None:
                block_n = (cfg or gemv_config(1, w.shape[0], w.shape[1], weight_bytes=1)).block_n
                sumsq = self.torch.empty(-(-w.shape[0] // block_n), dtype=self.torch.float32, device=x.device)
                ops.fp8_gemv(x, w, s, act=act, config=cfg, out=add_to, residual_sumsq=ResidualSumsq(add_to, sumsq))
                return add_to, sumsq
            return ops.fp8_gemv(x, w, s, act=act, config=cfg, norm=norm)
        (w,) = layer[name]
        return ops.silu_and_mul_linear(x, w) if act else ops.linear(x, w)

    def rope_qkv(self, layer, h, kc, vc):
        """The rotated query of the qkv GEMV with rotary and the cache write in its epilogue
        (kernels/gemv_rope.py, the engine's --fold-rope-kv), at the runtime's qkv launch, one split."""
        from pagoda.kernels import gemv as gemv_kernels
        from pagoda.kernels.gemv_rope import RopeKv, gemv_rope_kv

        d = self.d
        w, s = layer["qkv_proj"] if self.fp8 else (layer["qkv_proj"][0], None)
        n, k = w.shape
        cfg = self.configs.get("qkv_proj") if self.fp8 else None
        if cfg is None and h.is_cuda:
            cfg = self.runtime_config("qkv_proj", h) if self.fp8 else gemv_kernels.measured_win(1, n, k, None, h.device)
        cfg = cfg or gemv_kernels.gemv_config(1, n, k, weight_bytes=1 if self.fp8 else 2)
        cfg = dataclasses.replace(cfg, split_k=1, block_n=min(cfg.block_n, d["head_dim"] // 2))
        rope = RopeKv(self.positions, self.cos_sin, kc, vc, self.slot, d["heads"], d["kv_heads"])
        return gemv_rope_kv(h, w, None, rope, weight_scale=s, config=cfg).view(1, d["heads"], d["head_dim"])

    def normed(self, x, weight, residual):
        """(the next GEMV's input, its norm fold or None, the residual stream after the norm)."""
        from pagoda.kernels import ops
        from pagoda.kernels.gemv import GemvNorm

        if "norm" in self.folds:
            residual_out = None if residual is None else self.torch.empty_like(x)
            return x, GemvNorm(weight, 1e-5, residual, residual_out), (x if residual is None else residual_out)
        if residual is None:
            return ops.rms_norm(x, weight, 1e-5), None, x
        h, residual = ops.rms_norm(x, weight, 1e-5, residual)
        return h, None, residual

    def forward(self):
        from pagoda.kernels import ops
        from pagoda.kernels.gemv import GemvNorm
        from pagoda.kernels.paged_attention_decode import paged_attention_decode

        d = self.d
        x, residual, sumsq = self.x, None, None
        summed = "sumsq" in self.folds  # o_proj and down add to the stream and sum its squares
        for layer in self.layers:
            if sumsq is not None:
                h, norm = residual, GemvNorm(layer["norms"][0], 1e-5, sumsq=sumsq)
            else:
                h, norm, residual = self.normed(x, layer["norms"][0], residual)
                residual = residual.clone() if summed else residual  # the stream is written in place
            kc, vc = layer["cache"]
            if "rope" in self.folds and norm is None:  # one kernel: qkv, rotary and the cache write
                q = self.rope_qkv(layer, h, kc, vc)
            else:
                qkv = self.linear(layer, "qkv_proj", h, norm)
                q_end, k_end = d["heads"] * d["head_dim"], (d["heads"] + d["kv_heads"]) * d["head_dim"]
                q = qkv[:, :q_end].view(1, d["heads"], d["head_dim"])
                k = qkv[:, q_end:k_end].view(1, d["kv_heads"], d["head_dim"])
                v = qkv[:, k_end:].view(1, d["kv_heads"], d["head_dim"])
                q = ops.rotary_kv_cache(self.positions, q, k, v, self.cos_sin, kc, vc, self.slot)
            attn = paged_attention_decode(q, kc, vc, self.block_tables, self.seq_lens, self.qsl,
                                          d["head_dim"] ** -0.5, max_seq_len=d["context"])
            if summed:
                h, sumsq = self.linear(layer, "o_proj", attn.view(1, -1), add_to=residual)
                norm = GemvNorm(layer["norms"][1], 1e-5, sumsq=sumsq)
            else:
                o = self.linear(layer, "o_proj", attn.view(1, -1))
                h, norm, residual = self.normed(o, layer["norms"][1], residual)
            up, down = ("gate_up_glu", "down_plain") if "glu" in self.folds else ("gate_up_proj", "down_proj")
            act = self.linear(layer, up, h, norm)
            if summed:
                _, sumsq = self.linear(layer, down, act, add_to=residual)
            else:
                x = self.linear(layer, down, act)
        return residual if summed else x + residual


def run_chain(torch, chain: Chain, pdl_on: bool, replays: int, smoke: bool) -> tuple[float | None, object]:
    """(median ms per replay of the captured chain, its output) with PDL on or off."""
    from pagoda.kernels import pdl

    pdl.ENABLED = pdl_on and not smoke
    try:
        if smoke:
            return None, chain.forward().clone()
        torch.cuda.synchronize()
        out = chain.forward()  # builds the kernels outside the capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            chain.forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain.forward()
        ms = median_replay_ms(torch, graph, replays)
        result = out.clone()
        del graph
        return ms, result
    finally:
        pdl.ENABLED = False


def median_replay_ms(torch, graph, replays: int, warmup: int = 10) -> float:
    """The median of `replays` timed replays of a captured CUDA graph, after `warmup` untimed ones."""
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


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


def merge_switch():
    """kernels/paged_attention_decode's FUSED_MERGE module, or None where it has no such switch."""
    from pagoda.kernels import paged_attention_decode

    return paged_attention_decode if hasattr(paged_attention_decode, "FUSED_MERGE") else None


def run_variants(torch, chain: Chain, args) -> dict:
    """Every fold and merge setting, PDL off and on: ms per token, PDL's same-bits check, and the
    largest difference of each setting's output from the unfolded two-kernel-merge chain's."""
    merge = merge_switch()
    res, base = {}, None
    fold_sets = (((), ("norm",), ("glu",), ("norm", "glu"), ("sumsq",), ("sumsq", "glu"), ("glu", "rope"))
                 if chain.fp8 else ((), ("rope",)))
    if args.variants:
        asked = tuple(() if v == "none" else tuple(v.split("+")) for v in args.variants.split(","))
        # bf16 layers take the rope fold only (the others are FP8 GEMV epilogues)
        fold_sets = asked if chain.fp8 else tuple(f for f in asked if set(f) <= {"rope"}) or fold_sets
    merges = {"kernel": (False,), "fused": (True,), "both": (False, True)}[args.merge]
    for folds in fold_sets:
        for fused_merge in (merges if merge else (False,)):
            chain.folds = frozenset(folds)
            if merge:
                merge.FUSED_MERGE = fused_merge
            name = f"folds_{'+'.join(folds) or 'none'}_merge_{'fused' if fused_merge else 'kernel'}"
            outs, entry = [], {}
            for on in (False, True):
                ms, out = run_chain(torch, chain, on, args.replays, args.smoke)
                entry[f"pdl_{'on' if on else 'off'}_ms"] = ms and round(ms, 4)
                outs.append(out)
            entry["same_bits"] = bool(torch.equal(*outs))
            base = outs[0] if base is None else base
            entry["max_abs_diff_from_unfused"] = float((outs[0].float() - base.float()).abs().max())
            res[name] = entry
            print(f"  {name}: {entry}", flush=True)
    chain.folds = frozenset(("glu",) if chain.fp8 else ())  # the engine's defaults, for the sweep
    if merge:
        merge.FUSED_MERGE = True
    return res


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


def profile(torch, chain: Chain) -> dict:
    """Microseconds per kernel name over one eager token at the defaults, PDL off (the sum of each
    kernel's own time: what a fold or a faster launch can take away)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    chain.forward()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            chain.forward()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and ev.count:
            us = getattr(ev, "device_time_total", None) or ev.cuda_time_total
            kernels[ev.key[:90]] = dict(us_per_token=round(us / 5, 1), launches_per_token=ev.count // 5)
    return dict(sorted(kernels.items(), key=lambda kv: -kv[1]["us_per_token"]))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from pagoda.kernels import ops
    from pagoda.runtime.tools.bench.results import environment

    device = torch.device("cpu" if args.smoke else "cuda")
    ops.configure(device=device)
    dims = dict(layers=LAYERS, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, inter=INTER,
                context=CONTEXT)
    if args.smoke:
        dims = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=128, context=48)
    record = {"workload": "decode-chain", "backend": "pagoda", **environment(), "dims": dims,
              "command": "python " + " ".join(sys.argv), "replays": args.replays, "results": {}}
    t0 = time.perf_counter()
    for dtype in (("fp8", "bf16") if args.dtype == "both" else (args.dtype,)):
        torch.manual_seed(0)
        chain = Chain(torch, device, dtype == "fp8", dims)
        print(f"{dtype}:", flush=True)
        res = {"variants": run_variants(torch, chain, args)}
        if args.profile and not args.smoke:
            res["profile"] = profile(torch, chain)
            print(json.dumps(dict(list(res["profile"].items())[:14]), indent=0), flush=True)
        if dtype == "fp8" and args.tma_sweep:
            res["tma_sweep"] = tma_sweep(torch, chain, args)
        if dtype == "fp8" and args.rope_sweep:
            res["rope_sweep"] = rope_sweep(torch, chain, args)
        if dtype == "fp8" and args.stages and not args.smoke:
            res["stages"] = stages(torch, chain, args)
        if dtype == "fp8" and not args.no_sweep:
            res["sweep"] = sweep(torch, chain, args)
            for on in (False, True):
                ms, _ = run_chain(torch, chain, on, args.replays, args.smoke)
                res[f"best_pdl_{'on' if on else 'off'}_ms"] = ms and round(ms, 4)
            res["best_configs"] = {n: dataclasses.asdict(c) for n, c in chain.configs.items()}
            print(f"fp8 at the swept launches: off {res['best_pdl_off_ms']} on {res['best_pdl_on_ms']}", flush=True)
        record["results"][dtype] = res
        del chain
        torch.cuda.empty_cache() if not args.smoke else None
    record["seconds"] = round(time.perf_counter() - t0, 1)
    record["passed"] = all(v["same_bits"] for r in record["results"].values() for v in r["variants"].values())
    if not args.smoke:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"decode-chain-pagoda-{time.strftime('%Y-%m-%d')}.json"
        path.write_text(json.dumps(record, indent=1))
        print(f"wrote {path}")
    print(json.dumps({k: v for k, v in record.items() if k != "results"} | {"passed": record["passed"]}))
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
