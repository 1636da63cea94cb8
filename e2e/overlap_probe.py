"""Can a decode step overlap its memory-bound attention with its compute-bound GEMMs?

    python e2e/overlap_probe.py --out DIR [--shapes w1 w4] [--layers 8]

At W1's 256 seats (8B) and W4's 1,024 (0.5B) a decode step is two different machines in turn: the
projections run near the tensor-core ceiling and the attention near the copy bandwidth, so the step
costs their sum while the roofline counts only the bytes. NanoFlow's answer is to split the batch
in two and run one half's attention while the other half runs its GEMMs. Whether that pays depends
on the GPU's block scheduler sharing SMs between a cuBLAS GEMM and a Triton attention launch, which
only a GPU can say; this probe asks it before the runner is changed.

One decoder layer's decode path, built from the engine's own kernels (rms_norm, cuBLAS through
F.linear, paged_attention_decode over a paged cache, silu_and_mul) with distinct random weights and
KV caches per layer, is captured in CUDA graphs in these forms:
  whole          the full batch, one stream (today's decode step)
  halves_serial  the two halves one after the other on one stream (what splitting alone costs)
  halves_overlap the two halves on two streams, forked and joined inside the graph, the second
                 started half a layer late
  halves_pipelined the two halves in NanoFlow's lockstep: each phase runs one half's attention
                 beside the other half's GEMMs, with the streams meeting at every phase boundary
  carveout_N     halves_overlap with cuBLASLt told to leave N SMs free (torch's SM carve-out),
                 so attention always finds SMs to run on
and, to bound the gain, attention alone and the GEMMs alone over the full batch. Writes
overlap-probe-<commit>.json with the median replay time of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from pagoda.kernels import ops
from pagoda.kernels.paged_attention_decode import paged_attention_decode


@dataclass(frozen=True)
class Shape:
    hidden: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int
    batch: int
    context: int  # cached tokens per sequence: W1's mean prompt (576) plus half its 256 outputs


SHAPES = {
    "w1": Shape(4096, 14336, 32, 8, 128, 256, 704),
    "w4": Shape(896, 4864, 14, 2, 64, 1024, 704),
}
BLOCK = 16
EPS = 1e-6


class Layers:
    """Random weights and a filled paged cache per layer, and the decode path over a row range."""

    def __init__(self, s: Shape, n: int, device: str, dtype=torch.bfloat16):
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)

        q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.s = s
        self.w = [dict(norm1=torch.ones(s.hidden, device=device, dtype=dtype),
                       norm2=torch.ones(s.hidden, device=device, dtype=dtype),
                       qkv=w(q_out + 2 * kv_out, s.hidden), o=w(s.hidden, q_out),
                       gate_up=w(2 * s.inter, s.hidden), down=w(s.hidden, s.inter)) for _ in range(n)]
        blocks_per_seq = -(-s.context // BLOCK)
        num_blocks = s.batch * blocks_per_seq
        self.caches = [(w(num_blocks, BLOCK, s.kv_heads, s.head_dim), w(num_blocks, BLOCK, s.kv_heads, s.head_dim))
                       for _ in range(n)]
        # Each sequence's blocks are a shuffled set, as a long-running pool's would be.
        perm = torch.randperm(num_blocks, generator=g, device=device).to(torch.int32)
        self.block_tables = perm.view(s.batch, blocks_per_seq)
        self.seq_lens = torch.full((s.batch,), s.context, dtype=torch.int32, device=device)
        self.q_len = (s.heads * s.head_dim, s.kv_heads * s.head_dim)

    def attention(self, i: int, q: torch.Tensor, rows: slice) -> torch.Tensor:
        s = self.s
        k_cache, v_cache = self.caches[i]
        n = q.shape[0]
        qsl = torch.arange(n + 1, dtype=torch.int32, device=q.device)
        out = paged_attention_decode(q.view(n, s.heads, s.head_dim), k_cache, v_cache, self.block_tables[rows],
                                     self.seq_lens[rows], qsl, s.head_dim ** -0.5, max_seq_len=s.context,
                                     num_splits=1)
        return out.view(n, -1)

    def pre(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Layer i up to its attention: norm and the qkv projection; returns q (a view of qkv)."""
        h = ops.rms_norm(x, self.w[i]["norm1"], EPS)
        return F.linear(h, self.w[i]["qkv"])[:, : self.q_len[0]]

    def post(self, i: int, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Layer i after its attention: o, the residual, norm and the MLP."""
        w = self.w[i]
        x = x + F.linear(a, w["o"])
        h = ops.rms_norm(x, w["norm2"], EPS)
        return x + F.linear(ops.silu_and_mul(F.linear(h, w["gate_up"])), w["down"])

    def forward(self, x: torch.Tensor, rows: slice, parts: str = "all") -> torch.Tensor:
        """x: [rows, hidden]. parts: "all", "attention" (x is q, and each layer's output the next
        one's q) or "gemms" (q stands in for the attention's output)."""
        for i in range(len(self.w)):
            if parts == "attention":
                x = self.attention(i, x, rows)
                continue
            q = self.pre(i, x)
            x = self.post(i, x, q if parts == "gemms" else self.attention(i, q, rows))
        return x


def graphed(fn, warmup: int = 2):
    """Captures fn() in a CUDA graph on a side stream; returns a replay callable."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def median_ms(replay, iters: int = 30) -> float:
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def forms(model: Layers, x: torch.Tensor, carveouts: list[int]) -> dict:
    b = model.s.batch
    halves = (slice(0, b // 2), slice(b // 2, b))
    side = torch.cuda.Stream()

    def overlap():
        # Fork: the second half runs on `side`, the first on the capturing stream; join at the end.
        # The second half starts once the first half's first attention is queued, so the two are
        # offset by half a layer, and then run free.
        main = torch.cuda.current_stream()
        (xa, xb), (ra, rb) = (x[halves[0]], x[halves[1]]), halves
        q = model.pre(0, xa)
        a = model.attention(0, q, ra)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b_out = model.forward(xb, rb)
        xa = model.post(0, xa, a)
        for i in range(1, len(model.w)):
            xa = model.post(i, xa, model.attention(i, model.pre(i, xa), ra))
        main.wait_stream(side)
        return xa, b_out

    def pipelined():
        # NanoFlow's order: in each phase one half runs an attention while the other runs the
        # GEMMs around it; both streams wait for each other at every phase boundary.
        main = torch.cuda.current_stream()
        (xa, xb), (ra, rb) = (x[halves[0]], x[halves[1]]), halves
        n = len(model.w)
        qa = model.pre(0, xa)
        side.wait_stream(main)
        qb = ab = None
        for i in range(n):
            aa = model.attention(i, qa, ra)                      # A: attention i
            with torch.cuda.stream(side):                        # B: GEMMs up to attention i
                if i > 0:
                    xb = model.post(i - 1, xb, ab)
                qb = model.pre(i, xb)
            main.wait_stream(side)
            side.wait_stream(main)
            xa = model.post(i, xa, aa)                           # A: GEMMs up to attention i + 1
            if i + 1 < n:
                qa = model.pre(i + 1, xa)
            with torch.cuda.stream(side):                        # B: attention i
                ab = model.attention(i, qb, rb)
            main.wait_stream(side)
            side.wait_stream(main)
        with torch.cuda.stream(side):
            xb = model.post(n - 1, xb, ab)
        main.wait_stream(side)
        return xa, xb

    q_in = torch.randn(b, model.q_len[0], device=x.device, dtype=x.dtype)
    runs = {
        "whole": lambda: model.forward(x, slice(0, b)),
        "halves_serial": lambda: [model.forward(x[h], h) for h in halves],
        "halves_overlap": overlap,
        "halves_pipelined": pipelined,
        "attention_only": lambda: model.forward(q_in, slice(0, b), parts="attention"),
        "gemms_only": lambda: model.forward(x, slice(0, b), parts="gemms"),
    }
    out = {name: median_ms(graphed(fn)) for name, fn in runs.items()}
    if hasattr(torch._C, "_set_sm_carveout_experimental"):
        default_blas = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")  # the carve-out reaches cuBLASLt only
        out["whole_cublaslt"] = median_ms(graphed(runs["whole"]))
        for n in carveouts:
            torch._C._set_sm_carveout_experimental(n)
            try:
                out[f"carveout_{n}"] = median_ms(graphed(overlap))
                out[f"carveout_{n}_pipelined"] = median_ms(graphed(pipelined))
                out[f"carveout_{n}_whole"] = median_ms(graphed(runs["whole"]))
            finally:
                torch._C._set_sm_carveout_experimental(None)
        torch.backends.cuda.preferred_blas_library(default_blas)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--carveouts", type=int, nargs="*", default=[16, 32, 48])
    args = p.parse_args()
    result = {"commit": os.environ.get("PAGODA_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "layers": args.layers, "shapes": {}}
    for name in args.shapes:
        s = SHAPES[name]
        model = Layers(s, args.layers, "cuda")
        x = torch.randn(s.batch, s.hidden, device="cuda", dtype=torch.bfloat16) * 0.1
        kv_bytes = 2 * s.batch * s.context * s.kv_heads * s.head_dim * 2 * args.layers
        times = forms(model, x, args.carveouts)
        times["serial_sum_bound"] = times["attention_only"] + times["gemms_only"]
        times["max_bound"] = max(times["attention_only"], times["gemms_only"])
        times["attention_tb_per_s"] = kv_bytes / times["attention_only"] / 1e9
        times["overlap_speedup"] = times["whole"] / min(v for k, v in times.items() if k.startswith(("halves_o", "halves_p", "carveout_")) and not k.endswith("_whole"))
        result["shapes"][name] = {"shape": s.__dict__, "ms": times}
        print(name, json.dumps(times, indent=1), flush=True)
        del model
        torch.cuda.empty_cache()
    out = Path(args.out) / f"overlap-probe-{result['commit']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
