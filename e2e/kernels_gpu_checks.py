"""Correctness half of e2e/kernels_gpu.py: every Triton kernel on the GPU against its reference.

Each check records kernel, case, ok and the largest absolute error. The launches the runtime
makes (with hints) run under torch.cuda.set_sync_debug_mode("error"), so a hidden host sync
fails the check instead of quietly costing a step its overlap.
"""

from __future__ import annotations

import contextlib
import traceback

import torch
import triton
import triton.language as tl
from kernels_gpu_cases import paged_batch, rope_cache

from pagoda.kernels import ops
from pagoda.kernels.activation import silu_and_mul
from pagoda.kernels.activation_ref import silu_and_mul_ref
from pagoda.kernels.kv_cache import write_kv_cache
from pagoda.kernels.kv_cache_ref import write_kv_cache_ref
from pagoda.kernels.norm import rms_norm
from pagoda.kernels.norm_ref import rms_norm_ref
from pagoda.kernels.paged_attention_decode import paged_attention_decode
from pagoda.kernels.paged_attention_prefill import paged_attention_prefill
from pagoda.kernels.paged_attention_ref import paged_attention_ref
from pagoda.kernels.rotary import rotary_embedding
from pagoda.kernels.rotary_kv_cache import rotary_kv_cache
from pagoda.kernels.rotary_ref import rotary_embedding_ref
from pagoda.kernels.sampling import sample
from pagoda.kernels.sampling_ref import philox_uniform, sample_ref

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
TOL = {F32: dict(rtol=1e-5, atol=1e-5), F16: dict(rtol=2e-3, atol=2e-3), BF16: dict(rtol=1.6e-2, atol=1.6e-2)}
# fp32 attention sums thousands of products in another order than the reference
ATTN_TOL = {**TOL, F32: dict(rtol=1e-4, atol=1e-4)}


@contextlib.contextmanager
def no_host_sync():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


class Checks:
    def __init__(self):
        self.records = []

    def run(self, kernel: str, case: str, fn) -> None:
        """fn returns (got, want, tolerances) pairs or raises; a NaN where the reference has none
        counts as a mismatch (unwritten output, or a read past seq_len)."""
        torch.manual_seed(len(self.records))  # fresh inputs per check, reproducible
        record = dict(kernel=kernel, case=case)
        try:
            worst = 0.0
            for got, want, tol in fn():
                if got.isnan().any() and not want.isnan().any():
                    raise AssertionError("NaN in the kernel output")
                if got.dtype.is_floating_point:
                    worst = max(worst, (got.float() - want.float()).abs().nan_to_num().max().item())
                torch.testing.assert_close(got, want, equal_nan=True, **tol)
            record.update(ok=True, max_abs_err=worst)
        except Exception as exc:
            record.update(ok=False, error=f"{type(exc).__name__}: {exc}".strip()[:2000])
            traceback.print_exc()
        self.records.append(record)
        print(f"  {'ok  ' if record['ok'] else 'FAIL'} {kernel:24s} {case}")


def kv_cache_case(device, dtype, num_kv_heads, head_dim, block_size, num_tokens=300):
    def fn():
        num_blocks = num_tokens // block_size + 4
        slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
        slots[::7] = -1
        fused = torch.randn(num_tokens, 3 * num_kv_heads, head_dim, dtype=dtype, device=device)
        key, value = fused[:, :num_kv_heads], fused[:, 2 * num_kv_heads :]
        caches = [
            torch.full(
                (num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=device
            )
            for _ in range(4)
        ]
        with no_host_sync():
            write_kv_cache(key, value, caches[0], caches[1], slots)
        write_kv_cache_ref(key, value, caches[2], caches[3], slots)
        exact = dict(rtol=0, atol=0)
        return [(caches[0], caches[2], exact), (caches[1], caches[3], exact)]

    return fn


def norm_case(device, dtype, hidden, residual):
    def fn():
        x = torch.randn(257, hidden, dtype=dtype, device=device)
        w = 1 + 0.1 * torch.randn(hidden, dtype=dtype, device=device)
        r = torch.randn_like(x) if residual else None
        with no_host_sync():
            got = rms_norm(x, w, 1e-6, r)
        want = rms_norm_ref(x, w, 1e-6, r)
        pairs = list(zip(got, want)) if residual else [(got, want)]
        return [(g, wt, TOL[dtype]) for g, wt in pairs]

    return fn


def rotary_case(device, dtype, heads, kv_heads, head_dim, rotary_dim):
    def fn():
        tokens = 333
        qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, dtype=dtype, device=device)
        q, k = qkv[:, :heads], qkv[:, heads : heads + kv_heads]
        positions = torch.randint(0, 8192, (tokens,), device=device)
        cache = rope_cache(rotary_dim, 8192, device)
        with no_host_sync():
            got = rotary_embedding(positions, q, k, cache)
        want = rotary_embedding_ref(positions, q, k, cache)
        return [(got[0], want[0], TOL[dtype]), (got[1], want[1], TOL[dtype])]

    return fn


def rotary_kv_cache_case(device, dtype, heads, kv_heads, head_dim, rotary_dim, block_size=16):
    def fn():
        tokens = 333
        qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, dtype=dtype, device=device)
        q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
        positions = torch.randint(0, 8192, (tokens,), device=device)
        cache = rope_cache(rotary_dim, 8192, device)
        num_blocks = tokens // block_size + 4
        slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]
        slots[::50] = -1  # padding rows write nothing
        shape = (num_blocks, block_size, kv_heads, head_dim)
        k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
        v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        want_q, want_k = rotary_embedding_ref(positions, q, k, cache)
        write_kv_cache_ref(want_k, v, k_ref, v_ref, slots)
        with no_host_sync():
            got_q = rotary_kv_cache(positions, q, k, v, cache, k_cache, v_cache, slots)
        return [(got_q, want_q, TOL[dtype]), (k_cache, k_ref, TOL[dtype]), (v_cache, v_ref, TOL[dtype])]

    return fn


def silu_case(device, dtype, d):
    def fn():
        x = 2 * torch.randn(129, 2 * d, dtype=dtype, device=device)
        with no_host_sync():
            got = silu_and_mul(x)
        return [(got, silu_and_mul_ref(x), TOL[dtype])]

    return fn


def attention_case(device, group, head_dim, dtype, block_size, q_lens, seq_lens, kv_heads=2,
                   num_decode_seqs=0, layer=None, **launch):
    """layer: a layer's own sliding_window / softcap (Gemma, Mistral, Phi-3)."""
    layer = layer or {}

    def fn():
        args = paged_batch(q_lens, seq_lens, kv_heads, group, head_dim, block_size, dtype, device)
        scale = head_dim**-0.5
        with no_host_sync():
            if max(q_lens) == 1:
                got = paged_attention_decode(*args, scale, max_seq_len=max(seq_lens), **layer, **launch)
            else:
                got = paged_attention_prefill(*args, scale, max_query_len=max(q_lens), **layer, **launch)
            via_ops = ops.paged_attention(*args, scale, max_query_len=max(q_lens), max_seq_len=max(seq_lens),
                                          num_decode_seqs=num_decode_seqs, **layer)
        want = paged_attention_ref(*args, scale, **layer)
        return [(got, want, ATTN_TOL[dtype]), (via_ops, want, ATTN_TOL[dtype])]

    return fn


@triton.jit
def _uniform_kernel(out_ptr, seed, step, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.rand(seed, (step.to(tl.int64) << 32) + i.to(tl.int64)))


def philox_case(device):
    def fn():
        pairs = []
        for seed, step in [(0, 0), (123456789123, 5), (-7, 2**31 + 3)]:
            got = torch.empty(4096, device=device)
            _uniform_kernel[(1,)](got, seed, step, 4096)
            want = philox_uniform(seed, step * 2**32 + torch.arange(4096, device=device))
            pairs.append((got, want, dict(rtol=0, atol=0)))
        return pairs

    return fn


def sampling_case(device, vocab, dtype):
    def fn():
        n = 48
        logits = (3 * torch.randn(n, vocab, device=device)).to(dtype)
        choice = lambda *vals: torch.tensor(vals, device=device)[torch.randint(0, len(vals), (n,), device=device)]  # noqa: E731
        params = dict(
            temperature=choice(0.0, 0.5, 1.0, 1.3),
            top_k=choice(0, 1, 20, 1000).int(),
            top_p=choice(1.0, 0.9, 0.5),
            min_p=choice(0.0, 0.0, 0.05, 0.2),
            seeds=torch.randint(-(2**62), 2**62, (n,), device=device),
            steps=torch.randint(0, 10000, (n,), device=device),
        )
        with no_host_sync():
            got = sample(logits, **params)
            via_ops = ops.sample(logits, **params)
        want = sample_ref(logits, **params)
        exact = dict(rtol=0, atol=0)
        return [(got, want, exact), (via_ops, want, exact)]

    return fn


def run_checks(device) -> list[dict]:
    checks = Checks()
    print("correctness:")
    for dtype, kvh, hd, bs in [(F32, 8, 128, 16), (F16, 2, 64, 1), (BF16, 8, 128, 128), (BF16, 3, 64, 32)]:
        checks.run(
            "write_kv_cache",
            f"{dtype} kv_heads={kvh} head_dim={hd} block={bs}",
            kv_cache_case(device, dtype, kvh, hd, bs),
        )
    for dtype in (F32, F16, BF16):
        for hidden, residual in [(4096, True), (4096, False), (896, True), (1000, True)]:
            checks.run(
                "rms_norm",
                f"{dtype} hidden={hidden} residual={residual}",
                norm_case(device, dtype, hidden, residual),
            )
        for heads, kvh, hd, rd in [(32, 8, 128, 128), (14, 2, 64, 64), (8, 8, 128, 64)]:
            checks.run(
                "rotary_embedding",
                f"{dtype} heads={heads}/{kvh} head_dim={hd} rotary={rd}",
                rotary_case(device, dtype, heads, kvh, hd, rd),
            )
            checks.run(
                "rotary_kv_cache",
                f"{dtype} heads={heads}/{kvh} head_dim={hd} rotary={rd}",
                rotary_kv_cache_case(device, dtype, heads, kvh, hd, rd),
            )
        for d in (14336, 4864, 1000):
            checks.run("silu_and_mul", f"{dtype} d={d}", silu_case(device, dtype, d))
    odd = [1, 15, 16, 17, 127, 128, 129, 1000, 2047, 3001]
    decode_cases = [
        # group, head_dim, dtype, block_size, seq_lens, kv_heads, launch
        (4, 128, BF16, 16, odd, 8, {}),
        (4, 128, BF16, 16, odd, 8, dict(num_splits=1)),
        (4, 128, BF16, 16, odd, 8, dict(num_splits=7)),
        (1, 128, F16, 128, odd, 8, {}),
        (7, 64, BF16, 32, odd, 2, {}),
        (7, 64, F32, 8, odd, 2, {}),
        (1, 64, F32, 1, [1, 2, 37, 300], 4, {}),
        (4, 64, F16, 64, [8192, 5, 4000], 8, {}),
    ]
    for group, hd, dtype, bs, lens, kvh, launch in decode_cases:
        checks.run(
            "paged_attention_decode",
            f"{dtype} group={group} head_dim={hd} block={bs} {launch or ''}",
            attention_case(device, group, hd, dtype, bs, [1] * len(lens), lens, kvh, **launch),
        )
    prefill_cases = [
        # group, head_dim, dtype, block_size, q_lens, seq_lens, kv_heads
        (4, 128, BF16, 16, [1000, 1, 17, 300, 128], [1000, 3000, 17, 2300, 129], 8),
        (1, 128, F16, 128, [513, 64], [513, 4096], 8),
        (7, 64, BF16, 32, [77, 200, 1], [77, 1200, 1], 2),
        (7, 64, F32, 8, [33, 100], [50, 100], 2),
        (4, 64, F32, 1, [20, 3], [45, 3], 4),
    ]
    for group, hd, dtype, bs, q_lens, seq_lens, kvh in prefill_cases:
        checks.run(
            "paged_attention_prefill",
            f"{dtype} group={group} head_dim={hd} block={bs} q={q_lens}",
            attention_case(device, group, hd, dtype, bs, q_lens, seq_lens, kvh),
        )
    mixed_cases = [
        # a mixed step as the runner lays it out: one-token rows first (decode kernel), then prompts
        (4, 128, BF16, 16, [1, 1, 1, 700, 33], [40, 1500, 9, 700, 2100], 8, 3),
        (7, 64, F32, 8, [1, 250, 1], [300, 250, 17], 2, 1),
    ]
    for group, hd, dtype, bs, q_lens, seq_lens, kvh, nd in mixed_cases:
        checks.run(
            "paged_attention_mixed",
            f"{dtype} group={group} head_dim={hd} block={bs} q={q_lens} decodes={nd}",
            attention_case(device, group, hd, dtype, bs, q_lens, seq_lens, kvh, num_decode_seqs=nd),
        )
    windowed_cases = [
        # group, head_dim, dtype, block_size, q_lens, seq_lens, kv_heads, decodes, layer: Gemma's
        # head_dim 256 with a window and soft-caps, Mistral/Phi-3's window alone
        (2, 256, BF16, 16, [1, 1, 600, 40], [900, 50, 600, 1000], 8, 2, dict(sliding_window=128, softcap=50.0)),
        (2, 256, F32, 16, [1, 300], [700, 300], 4, 1, dict(sliding_window=128, softcap=50.0)),
        (1, 256, BF16, 16, [1, 1, 1], [40, 3000, 5000], 4, 3, dict(sliding_window=512)),
        (4, 128, BF16, 16, [1, 1000, 64], [2500, 1000, 3000], 8, 1, dict(sliding_window=4096)),
        (1, 96, F32, 16, [1, 257], [3000, 400], 32, 1, dict(sliding_window=200)),
        (2, 256, BF16, 16, [1, 700], [2000, 700], 8, 1, dict(softcap=30.0)),
    ]
    for group, hd, dtype, bs, q_lens, seq_lens, kvh, nd, layer in windowed_cases:
        checks.run(
            "paged_attention_windowed",
            f"{dtype} group={group} head_dim={hd} q={q_lens} seq={seq_lens} decodes={nd} {layer}",
            attention_case(device, group, hd, dtype, bs, q_lens, seq_lens, kvh, num_decode_seqs=nd, layer=layer),
        )
    checks.run("sampling", "philox bit-exact with tl.rand", philox_case(device))
    for vocab, dtype in [(32000, F32), (128256, BF16), (151936, F32)]:
        checks.run("sampling", f"{dtype} vocab={vocab}", sampling_case(device, vocab, dtype))
    return checks.records
