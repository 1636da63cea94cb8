"""Decode attention at W2's one sequence: 32 layers' paged_attention_decode calls (8 KV heads, 32 query
heads, head_dim 128, bf16 cache), each layer with its own cache, captured as one CUDA graph, over
the contexts W2 walks (128 to 384 tokens) and a grid of launches: the split count, the tile (block_n,
warps, stages). The runtime's own launch comes first: W2's graphs pass max_model_len (2048) as the
length hint, so it splits by that, not by the context.

Run on the H200 from the repository root, after `source e2e/gpu_env.sh` (about a minute):
    python3 e2e/decode_attention_w2_bench.py [--out DIR]
and on the CPU to check the script (Triton's interpreter, no timing):
    .venv/bin/python e2e/decode_attention_w2_bench.py --smoke
One JSON (decode-attention-w2-pagoda-DATE.json) goes to --out (default $OUT, else e2e/results/).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYERS, KV_HEADS, GROUP, HEAD_DIM, BLOCK, HINT = 32, 8, 4, 128, 16, 2048
CONTEXTS = (128, 256, 384)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or HERE / "results"))
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--smoke", action="store_true")
    return p.parse_args(argv)


def launches(smoke: bool) -> list[dict]:
    """The runtime's launch ({}), then splits x tile."""
    if smoke:
        return [{}, dict(num_splits=2, block_n=16, num_warps=2, num_stages=2)]
    grid = [dict(num_splits=s, block_n=n, num_warps=w, num_stages=st)
            for s, n, w, st in itertools.product((2, 4, 8, 16), (16, 32, 64), (2, 4), (2, 3))]
    return [{}] + grid


def time_graph(torch, fn, replays: int) -> float:
    """Microseconds a layer: fn (every layer's call) captured as one graph, its median replay."""
    from decode_chain import median_replay_ms  # this folder: the chain bench's timing

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_replay_ms(torch, graph, replays, warmup=5) * 1000 / LAYERS


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from pagoda.kernels import ops
    from pagoda.kernels.paged_attention_decode import paged_attention_decode
    from pagoda.runtime.tools.bench.results import environment

    device = torch.device("cpu" if args.smoke else "cuda")
    ops.configure(pdl=True, device=device)
    layers, contexts = (2, (40,)) if args.smoke else (LAYERS, CONTEXTS)
    blocks = HINT // BLOCK
    caches = [[torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, device=device).to(torch.bfloat16) for _ in range(2)]
              for _ in range(layers)]
    q = torch.randn(1, KV_HEADS * GROUP, HEAD_DIM, device=device).to(torch.bfloat16)
    tables = torch.arange(blocks, device=device, dtype=torch.int32)[None, :]
    qsl = torch.tensor([0, 1], device=device, dtype=torch.int32)
    record = {"workload": "decode-attention-w2", "backend": "pagoda", **environment(),
              "command": "python " + " ".join(sys.argv), "hint": HINT, "results": {}}
    for context in contexts:
        seq_lens = torch.tensor([context], device=device, dtype=torch.int32)
        rows, want = [], None

        def chain(launch, seq_lens=seq_lens):
            return [paged_attention_decode(q, kc, vc, tables, seq_lens, qsl, HEAD_DIM ** -0.5, max_seq_len=HINT,
                                           **launch) for kc, vc in caches]

        for launch in launches(args.smoke):
            try:
                out = chain(launch)[-1]
                want = out if want is None else want
                err = float((out.float() - want.float()).abs().max())
                us = None if args.smoke else time_graph(torch, lambda launch=launch: chain(launch), args.replays)
            except Exception as exc:  # a tile out of shared memory
                print(f"  {context} {launch}: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            rows.append(dict(launch=launch or "runtime", us_per_layer=us and round(us, 3), max_abs_diff=err))
        rows.sort(key=lambda r: r["us_per_layer"] or 0.0)
        runtime = next(r for r in rows if r["launch"] == "runtime")
        record["results"][str(context)] = dict(runtime=runtime, best=rows[:8])
        print(f"context {context}: runtime {runtime['us_per_layer']} us, best {rows[0]}", flush=True)
    if not args.smoke:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"decode-attention-w2-pagoda-{time.strftime('%Y-%m-%d')}.json"
        path.write_text(json.dumps(record, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
