"""Microbenchmarks for e2e/kernels_gpu.py: achieved bandwidth or TFLOP/s against the H200 ceilings
(BENCHMARKS.md: 4.25 TB/s copy, 780 TFLOP/s bf16 matmul). Times are triton.testing.do_bench
medians of the public entry points, launched as the runtime launches them (with hints)."""

from __future__ import annotations

import contextlib
import itertools
import math

import torch
import torch.nn.functional as F
from kernels_gpu_cases import paged_batch, rope_cache
from triton.testing import do_bench, do_bench_cudagraph

import pagoda.kernels.paged_attention_decode as decode_module
from pagoda.kernels.activation import silu_and_mul
from pagoda.kernels.kv_cache import write_kv_cache
from pagoda.kernels.norm import rms_norm
from pagoda.kernels.paged_attention_decode import choose_num_splits, paged_attention_decode
from pagoda.kernels.paged_attention_prefill import paged_attention_prefill
from pagoda.kernels.rotary import rotary_embedding
from pagoda.kernels.sampling import sample

PEAK_TB_PER_S = 4.25
PEAK_TFLOP_PER_S = 780.0
BF16 = torch.bfloat16
# the W1 model's attention: 32 query heads over 8 KV heads of 128
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def median_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_median_ms(fn) -> float:
    """GPU time of fn replayed from a CUDA graph: no Python launch cost, as the engine runs decode."""
    return do_bench_cudagraph(fn, rep=100, return_mode="median")


def bandwidth_point(nbytes: int, ms: float, **shape) -> dict:
    tb_per_s = nbytes / (ms * 1e-3) / 1e12
    return dict(
        shape,
        ms=round(ms, 4),
        bytes=nbytes,
        achieved_tb_per_s=round(tb_per_s, 3),
        fraction_of_peak=round(tb_per_s / PEAK_TB_PER_S, 3),
    )


def decode_args(batch: int, context: int, block_size: int, device) -> tuple:
    return paged_batch(
        [1] * batch,
        [context] * batch,
        KV_HEADS,
        HEADS // KV_HEADS,
        HEAD_DIM,
        block_size,
        BF16,
        device,
        poison=False,
    )


def decode_point(batch: int, context: int, block_size: int, device, args=None, **launch) -> dict:
    args = args or decode_args(batch, context, block_size, device)
    scale = HEAD_DIM**-0.5
    # The engine replays decode from CUDA graphs, so the figure is the graph-replay time; the eager
    # time adds Python's launch cost of one or two Triton kernels (~20-40 us), kept for reference.
    step = lambda: paged_attention_decode(*args, scale, max_seq_len=context, **launch)  # noqa: E731
    eager_ms = median_ms(step)
    ms = graph_median_ms(step)
    elem = 2
    kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * elem
    io_bytes = 2 * batch * HEADS * HEAD_DIM * elem + args[3].numel() * 4
    splits = launch.get("num_splits") or choose_num_splits(batch, KV_HEADS, context, device)
    return bandwidth_point(
        kv_bytes + io_bytes,
        ms,
        batch=batch,
        context=context,
        block_size=block_size,
        num_splits=splits,
        eager_launch_ms=round(eager_ms, 4),
        **{k: v for k, v in launch.items() if k != "num_splits"},
    )


def bench_decode(device, block_size: int, quick: bool) -> list[dict]:
    batches = (64, 256) if quick else (64, 128, 256)
    contexts = (512, 8192) if quick else (512, 1024, 2048, 4096, 8192)
    points = []
    for batch, context in itertools.product(batches, contexts):
        points.append(decode_point(batch, context, block_size, device))
        print(f"  decode batch {batch:4d} ctx {context:5d}: {points[-1]['achieved_tb_per_s']:.2f} TB/s")
        torch.cuda.empty_cache()
    return points


def sweep_decode(device, block_size: int) -> list[dict]:
    shapes = [(64, 512), (64, 4096), (256, 1024), (256, 8192)]
    inputs = {shape: decode_args(*shape, block_size, device) for shape in shapes}  # built once
    results = []
    for block_n, warps, stages in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3, 4)):
        knobs = dict(block_n=block_n, num_warps=warps, num_stages=stages)
        try:
            pts = [decode_point(b, c, block_size, device, inputs[b, c], **knobs) for b, c in shapes]
        except Exception as exc:  # e.g. out of shared memory for this tile
            print(f"  sweep decode {knobs}: skipped ({type(exc).__name__})")
            continue
        worst = min(p["achieved_tb_per_s"] for p in pts)
        results.append(dict(knobs, worst_tb_per_s=worst, points=pts))
        print(f"  sweep decode {knobs}: worst {worst:.2f} TB/s")
    # The split count at the small corner, where launch and merge costs weigh most.
    for splits in (1, 2, 4):
        p = decode_point(64, 512, block_size, device, inputs[64, 512], num_splits=splits)
        results.append(dict(num_splits=splits, worst_tb_per_s=p["achieved_tb_per_s"], points=[p]))
        print(f"  sweep decode splits {splits} at batch 64 ctx 512: {p['achieved_tb_per_s']:.2f} TB/s")
    return sorted(results, key=lambda r: -r["worst_tb_per_s"])


@contextlib.contextmanager
def decode_rule(**constants):
    """Swap the decode launch rule's module constants for one measurement."""
    saved = {k: getattr(decode_module, k) for k in constants}
    for k, v in constants.items():
        setattr(decode_module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(decode_module, k, v)


DECODE_RULES = {  # the rule before 080f2dd, against the module's own (the runtime's)
    "before: 4 programs/SM, thin tile": dict(PROGRAMS_PER_SM=4, FAT_TILE_BELOW=0),
    "now": {},
}


def sweep_decode_rules(device, block_size: int) -> dict:
    """Whole launch rules in one run: on the grid of BENCHMARKS.md (batch 64-256), and on the small
    batches the engine also runs (1-48), where the split count decides. Then repeats of the corner."""
    shapes = list(itertools.product((64, 128, 256), (512, 1024, 2048, 4096, 8192)))
    shapes += list(itertools.product((1, 8, 16, 32, 48), (512, 2048, 8192)))
    inputs = {}
    rules = []
    for name, constants in DECODE_RULES.items():
        points = []
        with decode_rule(**constants):
            for batch, context in shapes:
                if (batch, context) not in inputs and batch * context <= 64 * 8192:
                    inputs[batch, context] = decode_args(batch, context, block_size, device)
                points.append(decode_point(batch, context, block_size, device, inputs.get((batch, context))))
        grid = [p for p in points if p["batch"] >= 64]
        worst = min(p["achieved_tb_per_s"] for p in grid)
        rules.append(dict(rule=name, constants=constants, worst_grid_tb_per_s=worst, points=points))
        print(f"  rule {name}: grid worst {worst:.3f}; "
              + " ".join(f"{p['batch']}/{p['context']}:{p['achieved_tb_per_s']:.2f}(s{p['num_splits']})"
                         for p in points), flush=True)
    del inputs
    torch.cuda.empty_cache()
    corner = decode_args(64, 512, block_size, device)
    repeats = [decode_point(64, 512, block_size, device, corner)["achieved_tb_per_s"] for _ in range(5)]
    print(f"  corner repeats (default rule): {repeats}", flush=True)
    return dict(rules=rules, corner_repeats=repeats)


def prefill_point(q_lens, seq_lens, block_size, device, args=None, **launch) -> dict:
    args = args or paged_batch(
        q_lens, seq_lens, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM, block_size, BF16, device, poison=False
    )
    ms = median_ms(
        lambda: paged_attention_prefill(*args, HEAD_DIM**-0.5, max_query_len=max(q_lens), **launch)
    )
    # each query row at position p attends to p + 1 keys: 2 matmuls of 2 * D flops per key
    keys = sum(sum(range(s - q + 1, s + 1)) for q, s in zip(q_lens, seq_lens))
    flops = 4 * HEADS * HEAD_DIM * keys
    tflop_per_s = flops / (ms * 1e-3) / 1e12
    return dict(
        q_lens=q_lens,
        seq_lens=seq_lens,
        block_size=block_size,
        ms=round(ms, 4),
        flops=flops,
        achieved_tflop_per_s=round(tflop_per_s, 1),
        fraction_of_peak=round(tflop_per_s / PEAK_TFLOP_PER_S, 3),
        **launch,
    )


def sdpa_peer(batch: int, seq: int, device) -> dict:
    """torch's own causal SDPA (flash backend) on the same 4k shape, contiguous K/V, for scale."""
    q = torch.randn(batch, HEADS, seq, HEAD_DIM, dtype=BF16, device=device)
    k = torch.randn(batch, KV_HEADS, seq, HEAD_DIM, dtype=BF16, device=device)
    v = torch.randn_like(k)
    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    flops = 4 * HEADS * HEAD_DIM * batch * seq * (seq + 1) // 2
    return dict(
        batch=batch, seq=seq, ms=round(ms, 4), achieved_tflop_per_s=round(flops / (ms * 1e-3) / 1e12, 1)
    )


def bench_prefill(device, block_size: int) -> tuple[list[dict], dict | None]:
    points = [
        prefill_point([4096] * 4, [4096] * 4, block_size, device),  # fresh 4k prompts
        prefill_point([1024] * 8, [4096] * 8, block_size, device),  # 1k chunks over a 3k cached prefix
        prefill_point([512] * 16, [512] * 16, block_size, device),  # W1-sized prompts
    ]
    for p in points:
        print(f"  prefill q {p['q_lens'][0]} / ctx {p['seq_lens'][0]}: {p['achieved_tflop_per_s']} TFLOP/s")
    try:
        peer = sdpa_peer(4, 4096, device)
    except Exception as exc:  # the peer is context only; its absence must not hide our figure
        print(f"  sdpa peer unavailable: {exc}")
        peer = None
    return points, peer


def sweep_prefill(device, block_size: int) -> list[dict]:
    q_lens = seq_lens = [4096] * 4
    args = paged_batch(
        q_lens, seq_lens, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM, block_size, BF16, device, poison=False
    )
    results = []
    for bm, bn, warps, stages in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)):
        knobs = dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
        try:
            p = prefill_point(q_lens, seq_lens, block_size, device, args, **knobs)
        except Exception as exc:
            print(f"  sweep prefill {knobs}: skipped ({type(exc).__name__})")
            continue
        results.append(p)
        print(f"  sweep prefill {knobs}: {p['achieved_tflop_per_s']} TFLOP/s")
    return sorted(results, key=lambda r: -r["achieved_tflop_per_s"])


def bench_elementwise(device) -> dict[str, list[dict]]:
    tokens, hidden, inter = 8192, 4096, 14336
    x = torch.randn(tokens, hidden, dtype=BF16, device=device)
    res = torch.randn_like(x)
    w = torch.randn(hidden, dtype=BF16, device=device)
    out = {}
    ms = median_ms(lambda: rms_norm(x, w, 1e-5, res))
    out["rms_norm"] = [
        bandwidth_point(4 * x.numel() * 2 + hidden * 2, ms, tokens=tokens, hidden=hidden, residual=True)
    ]
    ms = median_ms(lambda: rms_norm(x, w, 1e-5))
    out["rms_norm"].append(
        bandwidth_point(2 * x.numel() * 2 + hidden * 2, ms, tokens=tokens, hidden=hidden, residual=False)
    )

    qkv = torch.randn(tokens, HEADS + 2 * KV_HEADS, HEAD_DIM, dtype=BF16, device=device)
    q, k = qkv[:, :HEADS], qkv[:, HEADS : HEADS + KV_HEADS]
    positions = torch.randint(0, 8192, (tokens,), device=device)
    cache = rope_cache(HEAD_DIM, 8192, device)
    moved = 2 * tokens * (HEADS + KV_HEADS) * HEAD_DIM * 2 + tokens * (HEAD_DIM * 4 + 8)
    out["rotary_embedding"] = [
        bandwidth_point(
            moved, median_ms(lambda: rotary_embedding(positions, q, k, cache)), tokens=tokens, inplace=False
        ),
        bandwidth_point(
            moved,
            median_ms(lambda: rotary_embedding(positions, q, k, cache, inplace=True)),
            tokens=tokens,
            inplace=True,
        ),
    ]

    gate_up = torch.randn(tokens, 2 * inter, dtype=BF16, device=device)
    ms = median_ms(lambda: silu_and_mul(gate_up))
    out["silu_and_mul"] = [bandwidth_point(3 * tokens * inter * 2, ms, tokens=tokens, intermediate=inter)]

    key = torch.randn(tokens, KV_HEADS, HEAD_DIM, dtype=BF16, device=device)
    value = torch.randn_like(key)
    k_cache = torch.empty(tokens // 16 + 1, 16, KV_HEADS, HEAD_DIM, dtype=BF16, device=device)
    v_cache = torch.empty_like(k_cache)
    slots = torch.randperm(k_cache.shape[0] * 16, device=device)[:tokens]
    ms = median_ms(lambda: write_kv_cache(key, value, k_cache, v_cache, slots))
    out["write_kv_cache"] = [
        bandwidth_point(4 * key.numel() * 2 + tokens * 8, ms, tokens=tokens, block_size=16)
    ]
    return out


def bench_sampling(device) -> list[dict]:
    batch, vocab = 256, 128256
    logits = torch.randn(batch, vocab, device=device)
    params = dict(
        temperature=torch.full((batch,), 0.8, device=device),
        top_k=torch.full((batch,), 50, device=device, dtype=torch.int32),
        top_p=torch.full((batch,), 0.9, device=device),
        min_p=torch.full((batch,), 0.05, device=device),
        seeds=torch.arange(batch, device=device),
        steps=torch.zeros(batch, dtype=torch.int64, device=device),
    )
    points = []
    for need_cutoffs in (False, True):
        ms = median_ms(lambda need_cutoffs=need_cutoffs: sample(logits, **params, need_cutoffs=need_cutoffs))
        # two passes over fp32 logits when min-p is on; the sort's traffic is not counted
        points.append(
            bandwidth_point(2 * logits.numel() * 4, ms, batch=batch, vocab=vocab, need_cutoffs=need_cutoffs)
        )
    return points


def summary_of(points: list[dict], key: str) -> float:
    return min(p[key] for p in points) if points else math.nan
