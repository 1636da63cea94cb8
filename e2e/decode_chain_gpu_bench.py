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
import json
import os
import sys
import time
from pathlib import Path

from decode_chain import CONTEXT, HEAD_DIM, HEADS, HIDDEN, INTER, KV_HEADS, LAYERS, Chain, run_chain
from decode_chain_sweeps import rope_sweep, stages, sweep, tma_sweep

HERE = Path(__file__).resolve().parent


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
