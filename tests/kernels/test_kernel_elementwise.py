"""The per-token Triton kernels (KV-cache write, fused RMSNorm, rotary, SiLU-and-multiply) against
their torch references, under TRITON_INTERPRET=1. Outputs are poisoned with NaN first, so an element
the kernel forgets to write shows up as a mismatch."""

import pytest
import torch
from kernel_testing import tolerance
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from pagoda.kernels import ops
from pagoda.kernels.activation import silu_and_mul
from pagoda.kernels.activation_ref import silu_and_mul_ref
from pagoda.kernels.kv_cache import write_kv_cache
from pagoda.kernels.kv_cache_ref import write_kv_cache_ref
from pagoda.kernels.norm import rms_norm
from pagoda.kernels.norm_ref import rms_norm_ref
from pagoda.kernels.rotary import rotary_embedding
from pagoda.kernels.rotary_kv_cache import rotary_kv_cache
from pagoda.kernels.rotary_ref import rotary_embedding_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


@pytest.mark.parametrize(
    "dtype,num_kv_heads,head_dim,block_size",
    [(torch.float32, 1, 64, 16), (torch.float16, 8, 128, 1), (torch.bfloat16, 3, 64, 128),
     (torch.bfloat16, 2, 128, 32)],
)
def test_write_kv_cache(dtype, num_kv_heads, head_dim, block_size):
    num_blocks, total = 5, 5 * block_size
    # first and last slots of blocks, random others, and two padding tokens (-1), shuffled
    edges = torch.tensor(sorted({0, block_size - 1, block_size, total - 1}))
    rest = torch.tensor([s for s in torch.randperm(total).tolist() if s not in edges.tolist()])
    slots = torch.cat([edges, rest[: 20 - len(edges)], torch.tensor([-1, -1])])
    slots = slots[torch.randperm(len(slots))]
    n = len(slots)
    # key/value as strided views of a fused qkv-like buffer, as the model produces them
    fused = torch.randn(n, 3 * num_kv_heads, head_dim).to(dtype)
    key, value = fused[:, :num_kv_heads], fused[:, 2 * num_kv_heads :]
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_cache(key, value, k_cache, v_cache, slots)
    write_kv_cache_ref(key, value, k_ref, v_ref, slots)
    torch.testing.assert_close(k_cache, k_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_ref, rtol=0, atol=0, equal_nan=True)
    assert not k_cache.view(-1, num_kv_heads, head_dim)[slots[slots >= 0]].isnan().any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 100, 4096])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, hidden, with_residual):
    rows = 7
    x = torch.randn(rows, hidden).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden)).to(dtype)
    residual = torch.randn(rows, hidden).to(dtype) if with_residual else None
    out = nan_like(x)
    residual_out = nan_like(x) if with_residual else None
    got = rms_norm(x, weight, 1e-6, residual, out=out, residual_out=residual_out)
    want = rms_norm_ref(x, weight, 1e-6, residual)
    if with_residual:
        assert got[0] is out and got[1] is residual_out
        torch.testing.assert_close(got[1], want[1], **tolerance(dtype))
        got, want = got[0], want[0]
    torch.testing.assert_close(got, want, **tolerance(dtype))


def test_rms_norm_updates_residual_in_place_and_keeps_fp32_weight():
    x = torch.randn(3, 5, 96).to(torch.bfloat16)
    residual = torch.randn(3, 5, 96).to(torch.bfloat16)
    weight = torch.randn(96)  # fp32 weight over bf16 activations promotes, as in torch
    want_out, want_res = rms_norm_ref(x, weight, 1e-5, residual.clone())
    got_out, got_res = rms_norm(x, weight, 1e-5, residual, residual_out=residual)
    assert got_res is residual and got_out.dtype == torch.float32
    torch.testing.assert_close(got_out, want_out, **tolerance(torch.bfloat16))
    torch.testing.assert_close(got_res, want_res, **tolerance(torch.bfloat16))


def _cos_sin_cache(rotary_dim: int, max_position: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


@pytest.mark.parametrize(
    "dtype,num_heads,num_kv_heads,head_dim,rotary_dim",
    [(torch.float32, 4, 4, 64, 64), (torch.float16, 7, 1, 128, 128), (torch.bfloat16, 28, 4, 128, 128),
     (torch.float32, 8, 2, 64, 32)],  # the last: partial rotary, the tail passes through
)
def test_rotary(dtype, num_heads, num_kv_heads, head_dim, rotary_dim):
    num_tokens, max_position = 13, 300
    positions = torch.randint(0, max_position, (num_tokens,))
    # query/key as views of one fused qkv row, as the attention layer splits it
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim).to(dtype)
    query, key = qkv[:, :num_heads], qkv[:, num_heads : num_heads + num_kv_heads]
    cache = _cos_sin_cache(rotary_dim, max_position)
    want_q, want_k = rotary_embedding_ref(positions, query, key, cache)
    out = (nan_like(query.contiguous()), nan_like(key.contiguous()))
    got_q, got_k = rotary_embedding(positions, query, key, cache, out=out)
    torch.testing.assert_close(got_q, want_q, **tolerance(dtype))
    torch.testing.assert_close(got_k, want_k, **tolerance(dtype))
    # in place: the inputs themselves are rotated
    q2, k2 = query.clone(), key.clone()
    got_q, got_k = rotary_embedding(positions, q2, k2, cache, inplace=True)
    assert got_q is q2 and got_k is k2
    torch.testing.assert_close(q2, want_q, **tolerance(dtype))
    torch.testing.assert_close(k2, want_k, **tolerance(dtype))


@pytest.mark.parametrize(
    "dtype,num_heads,num_kv_heads,head_dim,rotary_dim,block_size",
    [(torch.float32, 4, 4, 64, 64, 16), (torch.float16, 7, 1, 128, 128, 1),
     (torch.bfloat16, 28, 4, 128, 128, 32), (torch.float32, 8, 2, 64, 32, 8)],  # last: partial rotary
)
def test_rotary_kv_cache(dtype, num_heads, num_kv_heads, head_dim, rotary_dim, block_size):
    """The fused kernel against rotary_embedding_ref then write_kv_cache_ref: the query rotated in
    place, the rotated key and the value in their slots, padding tokens (-1) writing nothing."""
    num_blocks, max_position = max(4, 12 // block_size + 1), 300
    slots = torch.randperm(num_blocks * block_size)[:11]
    slots = torch.cat([slots, torch.tensor([-1, -1])])[torch.randperm(13)]
    positions = torch.randint(0, max_position, (13,))
    qkv = torch.randn(13, num_heads + 2 * num_kv_heads, head_dim).to(dtype)
    query, key, value = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    cos_sin = _cos_sin_cache(rotary_dim, max_position)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    want_q, want_k = rotary_embedding_ref(positions, query, key, cos_sin)
    write_kv_cache_ref(want_k, value, k_ref, v_ref, slots)
    key_before = key.clone()
    got = rotary_kv_cache(positions, query, key, value, cos_sin, k_cache, v_cache, slots)
    assert got is query
    torch.testing.assert_close(query, want_q, **tolerance(dtype))
    torch.testing.assert_close(k_cache, k_ref, equal_nan=True, **tolerance(dtype))
    torch.testing.assert_close(v_cache, v_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(key, key_before, rtol=0, atol=0)  # read only: attention reads the cache


def test_rotary_llama3_scaling_matches_transformers():
    """The cos_sin_cache built from transformers' llama3-scaled rotary embedding, run through the
    kernel, equals transformers' apply_rotary_pos_emb, including positions past the original
    context where the scaling bites."""
    head_dim, num_heads, num_kv_heads, max_position = 64, 4, 2, 512
    config = LlamaConfig(
        hidden_size=head_dim * num_heads, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, max_position_embeddings=max_position, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    )
    rope = LlamaRotaryEmbedding(config)
    all_positions = torch.arange(max_position)[None]
    cos, sin = rope(torch.zeros(1), all_positions)
    cache = torch.cat([cos[0, :, : head_dim // 2], sin[0, :, : head_dim // 2]], dim=-1)

    positions = torch.tensor([0, 1, 63, 64, 65, 200, 511])
    query = torch.randn(len(positions), num_heads, head_dim)
    key = torch.randn(len(positions), num_kv_heads, head_dim)
    got_q, got_k = rotary_embedding(positions, query, key, cache)
    c, s = rope(query, positions[None])
    want_q, want_k = apply_rotary_pos_emb(query.transpose(0, 1)[None], key.transpose(0, 1)[None], c, s)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 1000, 1500])  # 1500: two column tiles, the second ragged
def test_silu_and_mul(dtype, d):
    x = (2 * torch.randn(3, 5, 2 * d)).to(dtype)
    out = torch.full((3, 5, d), float("nan"), dtype=dtype)
    got = silu_and_mul(x, out=out)
    assert got is out
    torch.testing.assert_close(got, silu_and_mul_ref(x), **tolerance(dtype))


def test_ops_keep_cpu_tensors_on_the_reference():
    x = torch.randn(4, 2 * 64)
    assert torch.equal(ops.silu_and_mul(x), silu_and_mul_ref(x))
    w = torch.randn(64)
    assert torch.equal(ops.rms_norm(x[:, :64], w, 1e-6), rms_norm_ref(x[:, :64], w, 1e-6))
