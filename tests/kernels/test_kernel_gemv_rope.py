"""kernels/gemv_rope.py, the one-row qkv GEMV with rotary and the KV-cache write in its epilogue,
under TRITON_INTERPRET=1: the same bits as the two kernels it replaces (gemv.py's GEMV, then
rotary_kv_cache), and close to the torch references. Caches and outputs are poisoned with NaN
first, so anything the kernel forgets to write, or writes where it should not, shows up."""

import pytest
import torch
from kernel_testing import pairwise, tolerance

from pagoda.kernels.gemv import GemvConfig, gemv
from pagoda.kernels.gemv_ref import gemv_ref
from pagoda.kernels.gemv_rope import RopeKv, gemv_rope_kv
from pagoda.kernels.kv_cache_ref import write_kv_cache_ref
from pagoda.kernels.quant_fp8_ref import quantize_weight_fp8_ref
from pagoda.kernels.rotary_kv_cache import rotary_kv_cache
from pagoda.kernels.rotary_ref import rotary_embedding_ref

FP8 = torch.float8_e4m3fn
HEADS, KV_HEADS, HEAD_DIM, BLOCK, BLOCKS, MAX_POS = 4, 2, 16, 4, 3, 40
N = (HEADS + 2 * KV_HEADS) * HEAD_DIM
# K = 70 leaves a masked tail after whole chunks; 64 runs the unmasked loop; block_n 4 and 8 split a
# head's half (8) in two programs or give it one
CONFIGS = {
    "masked": (70, GemvConfig(block_n=4, block_k=32, split_k=1, num_warps=4, fold=8)),
    "even": (64, GemvConfig(block_n=8, block_k=16, split_k=1, num_warps=4, fold=1)),
}


def cos_sin_cache(dim=HEAD_DIM, positions=MAX_POS):
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    freqs = torch.arange(positions).float()[:, None] * inv[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def inputs(k, dtype, weights, bias, cache_dtype, slot):
    x = torch.randn(1, k).to(dtype)
    w = (torch.randn(N, k) / k**0.5).to(dtype)
    scale = None
    if weights != "plain":
        w, scale = quantize_weight_fp8_ref(w)
        if weights == "per-tensor":
            scale = scale.max().reshape(1)
    b = (torch.randn(N) * 0.1).to(dtype) if bias else None
    cache = torch.full((BLOCKS, BLOCK, KV_HEADS, HEAD_DIM), float("nan"), dtype=torch.float32).to(cache_dtype)
    if cache_dtype == FP8:
        cache = torch.zeros_like(cache)  # e4m3 has no NaN to poison with; zeros, then look at the slot
    caches = cache.clone(), cache.clone()
    scales = (0.05, 0.02) if cache_dtype == FP8 else (1.0, 1.0)
    rope = RopeKv(torch.tensor([int(torch.randint(0, MAX_POS, ()))]), cos_sin_cache(), *caches,
                  torch.tensor([slot]), HEADS, KV_HEADS, *scales)
    return x, w, scale, b, rope


def unfused(x, w, scale, b, rope, config):
    """The engine's two kernels: gemv.py's qkv GEMV, then rotary_kv_cache."""
    k_cache, v_cache = rope.k_cache.clone(), rope.v_cache.clone()
    qkv = gemv(x, w, b, weight_scale=scale, config=config)
    q, key, v = qkv.view(1, -1, HEAD_DIM).split([HEADS, KV_HEADS, KV_HEADS], dim=1)
    q = rotary_kv_cache(rope.positions, q.clone(), key, v, rope.cos_sin_cache, k_cache, v_cache,
                        rope.slot_mapping, rope.k_scale, rope.v_scale)
    return q.reshape(1, -1), k_cache, v_cache


@pytest.mark.parametrize(**pairwise(dtype=[torch.float32, torch.bfloat16], weights=["plain", "per-row", "per-tensor"],
                                    bias=[False, True], cache=["same", "fp8"], config=CONFIGS))
def test_the_fold_is_the_gemv_then_rotary_kv_cache_bit_for_bit(dtype, weights, bias, cache, config):
    k, cfg = config
    cache_dtype = FP8 if cache == "fp8" else dtype
    x, w, scale, b, rope = inputs(k, dtype, weights, bias, cache_dtype, slot=6)
    want_q, want_k, want_v = unfused(x, w, scale, b, rope, cfg)
    q = gemv_rope_kv(x, w, b, rope, weight_scale=scale, config=cfg,
                     out=torch.full((1, HEADS * HEAD_DIM), float("nan"), dtype=dtype))
    assert torch.equal(bits(q), bits(want_q))
    assert torch.equal(bits(rope.k_cache), bits(want_k)) and torch.equal(bits(rope.v_cache), bits(want_v))
    written = rope.k_cache.view(-1, KV_HEADS, HEAD_DIM)[6].float()
    assert torch.isfinite(written).all() and written.abs().sum() > 0  # the slot was written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fold_matches_the_torch_references(dtype):
    k, cfg = CONFIGS["masked"]
    x, w, scale, b, rope = inputs(k, dtype, "per-row", True, dtype, slot=9)
    qkv = gemv_ref(x, w, b, weight_scale=scale).view(1, -1, HEAD_DIM)
    q, key, v = qkv.split([HEADS, KV_HEADS, KV_HEADS], dim=1)
    want_q, want_k = rotary_embedding_ref(rope.positions, q, key, rope.cos_sin_cache)
    k_ref, v_ref = rope.k_cache.clone(), rope.v_cache.clone()
    write_kv_cache_ref(want_k, v, k_ref, v_ref, rope.slot_mapping)
    got = gemv_rope_kv(x, w, b, rope, weight_scale=scale, config=cfg)
    tol = tolerance(dtype)
    torch.testing.assert_close(got, want_q.reshape(1, -1), **tol)
    torch.testing.assert_close(rope.k_cache, k_ref, equal_nan=True, **tol)
    torch.testing.assert_close(rope.v_cache, v_ref, equal_nan=True, **tol)


def test_a_padding_slot_writes_no_cache_but_still_the_query():
    k, cfg = CONFIGS["even"]
    x, w, scale, b, rope = inputs(k, torch.float32, "plain", False, torch.float32, slot=-1)
    want_q, _, _ = unfused(x, w, scale, b, rope, cfg)
    q = gemv_rope_kv(x, w, b, rope, weight_scale=scale, config=cfg)
    assert torch.equal(q, want_q)
    assert rope.k_cache.isnan().all() and rope.v_cache.isnan().all()


def test_bad_shapes_are_refused():
    k, cfg = CONFIGS["even"]
    x, w, scale, b, rope = inputs(k, torch.float32, "plain", False, torch.float32, slot=0)
    with pytest.raises(AssertionError, match="one contiguous row"):
        gemv_rope_kv(torch.zeros(2, k), w, b, rope, config=cfg)
    with pytest.raises(AssertionError, match="block_n 16 must divide"):
        gemv_rope_kv(x, w, b, rope, config=GemvConfig(block_n=16, block_k=16))
    with pytest.raises(AssertionError, match="full rotary"):
        partial = RopeKv(rope.positions, cos_sin_cache(dim=8), rope.k_cache, rope.v_cache, rope.slot_mapping,
                         HEADS, KV_HEADS)
        gemv_rope_kv(x, w, b, partial, config=cfg)
    with pytest.raises(AssertionError, match="is not q|k|v"):
        gemv_rope_kv(x, w[:-HEAD_DIM], b, rope, config=cfg)
