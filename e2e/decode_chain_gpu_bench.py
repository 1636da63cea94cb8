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
- sweep (FP8, PDL on): each projection's GEMV launch over a grid of tiles, the other three at their
  best so far; then the chain at the winners, both ways.
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
          "gate_up_proj": (2 * INTER, 4096, None), "down_proj": (4096, INTER, "silu_mul")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "results"))
    p.add_argument("--dtype", choices=("fp8", "bf16", "both"), default="both")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--budget-s", type=float, default=45.0, help="seconds of sweep per projection")
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

    def linear(self, layer, name, x):
        from pagoda.kernels import ops

        act = SHAPES[name][2]
        if self.fp8:
            w, s = layer[name]
            cfg = self.configs.get(name)
            if cfg is None and not x.is_cuda:  # the smoke run: the interpreter, the heuristic launch
                return ops.fp8_gemv(x, w, s, act=act)
            if cfg is None:
                launch = ops.fp8_path(x, w, None, act)
                assert launch.path == "gemv", f"{name}: the runtime takes {launch.path} at one row"
                cfg = launch.config
            return ops.fp8_gemv(x, w, s, act=act, config=cfg)
        (w,) = layer[name]
        return ops.silu_and_mul_linear(x, w) if act else ops.linear(x, w)

    def forward(self):
        from pagoda.kernels import ops
        from pagoda.kernels.paged_attention_decode import paged_attention_decode

        d = self.d
        x, residual = self.x, None
        for layer in self.layers:
            if residual is None:
                h, residual = ops.rms_norm(x, layer["norms"][0], 1e-5), x
            else:
                h, residual = ops.rms_norm(x, layer["norms"][0], 1e-5, residual)
            qkv = self.linear(layer, "qkv_proj", h)
            q_end, k_end = d["heads"] * d["head_dim"], (d["heads"] + d["kv_heads"]) * d["head_dim"]
            q = qkv[:, :q_end].view(1, d["heads"], d["head_dim"])
            k = qkv[:, q_end:k_end].view(1, d["kv_heads"], d["head_dim"])
            v = qkv[:, k_end:].view(1, d["kv_heads"], d["head_dim"])
            kc, vc = layer["cache"]
            q = ops.rotary_kv_cache(self.positions, q, k, v, self.cos_sin, kc, vc, self.slot)
            attn = paged_attention_decode(q, kc, vc, self.block_tables, self.seq_lens, self.qsl,
                                          d["head_dim"] ** -0.5, max_seq_len=d["context"])
            o = self.linear(layer, "o_proj", attn.view(1, -1))
            h, residual = ops.rms_norm(o, layer["norms"][1], 1e-5, residual)
            x = self.linear(layer, "down_proj", self.linear(layer, "gate_up_proj", h))
        return x + residual


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
        for _ in range(10):
            graph.replay()
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        result = out.clone()
        del graph
        return sorted(times)[len(times) // 2], result
    finally:
        pdl.ENABLED = False


def candidates(name: str, smoke: bool, first=None):
    """1-row launches of the FP8 GEMV to try for a projection: the runtime's own (first), then
    tiles of 16 to 128 weights a thread, fold 16 (one 16-byte load) or 1, in a fixed shuffled order,
    so that a time budget samples the whole grid."""
    import random

    from pagoda.kernels.gemv import GemvConfig

    if smoke:
        return [GemvConfig(16, 32, 1, 4, 1, fold=16), GemvConfig(8, 64, 1, 4, 1, fold=1)]
    n, k, _ = SHAPES[name]
    grid = []
    # up to a whole 4096-wide row per chunk: the first chunk is loaded before the PDL wait, so a
    # program that holds all its K streams its whole share while the kernels before it still run
    for bn, bk, warps, fold in itertools.product((2, 4, 8, 16, 32), (256, 512, 1024, 2048, 4096), (4, 8), (1, 16)):
        if bn * bk // (warps * 32) in (16, 32, 64, 128) and bk <= k and n // bn >= 132:
            grid.append(GemvConfig(bn, bk, 1, warps, 1, fold=fold))
    random.Random(0).shuffle(grid)
    head = [first] if first is not None else []
    return head + [c for c in grid if c not in head]


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
        res = {}
        for on in (False, True):
            ms, out = run_chain(torch, chain, on, args.replays, args.smoke)
            res[f"pdl_{'on' if on else 'off'}_ms"] = ms and round(ms, 4)
            res.setdefault("outputs", []).append(out)
        res["same_bits"] = bool(torch.equal(*res.pop("outputs")))
        print(f"{dtype}: chain {res}", flush=True)
        if dtype == "fp8" and not args.no_sweep:
            sweep = {}
            for name in SHAPES:
                points = []
                n, k, act = SHAPES[name]
                runtime = None if args.smoke else ops.fp8_path(
                    chain.x.new_empty(1, 2 * k if act else k), chain.layers[0][name][0], None, act).config
                began = time.perf_counter()
                for cfg in candidates(name, args.smoke, runtime):
                    if time.perf_counter() - began > args.budget_s:
                        break
                    chain.configs[name] = cfg
                    try:
                        ms, _ = run_chain(torch, chain, True, max(20, args.replays // 4), args.smoke)
                    except Exception as exc:  # out of registers or shared memory for this tile
                        print(f"  {name} {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
                        continue
                    points.append((ms if ms is not None else 0.0, cfg))
                points.sort(key=lambda p: p[0])
                chain.configs[name] = points[0][1]
                sweep[name] = dict(tried=len(points), runtime=runtime and dataclasses.asdict(runtime),
                                   best=[dict(ms=round(ms, 4), config=dataclasses.asdict(cfg)) for ms, cfg in points[:6]])
                print(f"  {name}: best of {len(points)} {sweep[name]['best'][0]}", flush=True)
            res["sweep"] = sweep
            for on in (False, True):
                ms, _ = run_chain(torch, chain, on, args.replays, args.smoke)
                res[f"best_pdl_{'on' if on else 'off'}_ms"] = ms and round(ms, 4)
            res["best_configs"] = {n: dataclasses.asdict(c) for n, c in chain.configs.items()}
            print(f"fp8 at the swept launches: off {res['best_pdl_off_ms']} on {res['best_pdl_on_ms']}", flush=True)
        record["results"][dtype] = res
        del chain
        torch.cuda.empty_cache() if not args.smoke else None
    record["seconds"] = round(time.perf_counter() - t0, 1)
    record["passed"] = all(r["same_bits"] for r in record["results"].values())
    if not args.smoke:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"decode-chain-pagoda-{time.strftime('%Y-%m-%d')}.json"
        path.write_text(json.dumps(record, indent=1))
        print(f"wrote {path}")
    print(json.dumps({k: v for k, v in record.items() if k != "results"} | {"passed": record["passed"]}))
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
