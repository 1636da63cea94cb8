"""The GEMV's two fusions for one-row decode layers, under TRITON_INTERPRET=1: the RMSNorm (+ residual)
folded into its input (GemvNorm) and silu(gate) * up folded into its output (epilogue="silu_mul"),
against the references and against the unfused kernels they replace. Outputs are poisoned with NaN
first, so anything the kernel forgets to write shows up."""

import pytest
import torch
from kernel_testing import pairwise, tolerance

from pagoda.kernels.activation import silu_and_mul
from pagoda.kernels.gemv import GemvConfig, GemvNorm, ResidualSumsq, gemv
from pagoda.kernels.gemv_ref import gemv_ref
from pagoda.kernels.norm import rms_norm
from pagoda.kernels.quant_fp8_ref import quantize_weight_fp8_ref

EPS = 1e-5
# N = 67 leaves a partial row block, K = 130 a masked tail over several chunks; the even-K launch
# runs the unmasked loop; split-k makes every split compute the row's rstd on its own.
CONFIGS = {
    "odd": (67, 130, GemvConfig(block_n=16, block_k=32, split_k=1, num_warps=4, fold=8)),
    "even-k": (40, 256, GemvConfig(block_n=8, block_k=64, split_k=1, num_warps=4, fold=1)),
    "split-k": (67, 130, GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, fold=8)),
}


def weights(n, k, dtype, fp8: bool):
    w = (torch.randn(n, k) / k**0.5).to(dtype)
    if not fp8:
        return w, None
    q, scale = quantize_weight_fp8_ref(w)
    return q, scale


def nan_like(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.mark.parametrize(**pairwise(dtype=[torch.float32, torch.bfloat16], rows=[1, 2, 4],
                                    residual=[True, False], fp8=[False, True], config=CONFIGS))
def test_folded_norm_is_the_norm_then_the_product(dtype, rows, residual, fp8, config):
    n, k, cfg = config
    x = torch.randn(rows, k).to(dtype)
    weight, scale = weights(n, k, dtype, fp8)
    norm_weight = (1 + 0.1 * torch.randn(k)).to(dtype)
    r = torch.randn(rows, k).to(dtype) if residual else None
    h = nan_like((rows, k), dtype) if residual else None
    norm = GemvNorm(norm_weight, EPS, r, h)
    out = nan_like((rows, n), dtype)
    got = gemv(x, weight, weight_scale=scale, out=out, config=cfg, norm=norm)
    want = gemv_ref(x, weight, weight_scale=scale, norm=norm)
    # against the two kernels it replaces: only rstd's summation order differs
    normed = rms_norm(x, norm_weight, EPS, r)
    if residual:
        (want, want_h), (normed, norm_h) = want, normed
        assert torch.equal(h, norm_h)  # x + residual, rounded as the norm kernel rounds it
        torch.testing.assert_close(h, want_h, **tolerance(dtype))
    torch.testing.assert_close(got, want, **tolerance(dtype))
    torch.testing.assert_close(got, gemv(normed, weight, weight_scale=scale, config=cfg), **tolerance(dtype))


def test_folded_norm_in_fp32_matches_the_unfused_pair_closely():
    n, k, cfg = CONFIGS["odd"]
    x, r = torch.randn(1, k), torch.randn(1, k)
    weight, _ = weights(n, k, torch.float32, False)
    norm_weight = 1 + 0.1 * torch.randn(k)
    got = gemv(x, weight, config=cfg, norm=GemvNorm(norm_weight, EPS, r, torch.empty(1, k)))
    normed, _ = rms_norm(x, norm_weight, EPS, r)
    torch.testing.assert_close(got, gemv(normed, weight, config=cfg), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(**pairwise(dtype=[torch.float32, torch.bfloat16], fp8=[False, True],
                                    bias=[False, True], shape=["odd", "even-k"]))
def test_silu_mul_epilogue_is_the_product_then_silu_and_mul_bit_for_bit(dtype, fp8, bias, shape):
    inter, k, cfg = CONFIGS[shape]
    x = torch.randn(1, k).to(dtype)
    weight, scale = weights(2 * inter, k, dtype, fp8)
    b = torch.randn(2 * inter).to(dtype) if bias else None
    out = nan_like((1, inter), dtype)
    got = gemv(x, weight, b, weight_scale=scale, out=out, config=cfg, epilogue="silu_mul")
    assert got is out
    unfused = silu_and_mul(gemv(x, weight, b, weight_scale=scale, config=cfg))
    assert torch.equal(got, unfused)
    torch.testing.assert_close(got, gemv_ref(x, weight, b, weight_scale=scale, epilogue="silu_mul"),
                               **tolerance(dtype))


@pytest.mark.parametrize(**pairwise(dtype=[torch.float32, torch.bfloat16], fp8=[False, True]))
def test_norm_and_epilogue_together_as_gate_up_after_the_post_attention_norm(dtype, fp8):
    inter, k, cfg = CONFIGS["odd"]
    x, r = torch.randn(1, k).to(dtype), torch.randn(1, k).to(dtype)
    weight, scale = weights(2 * inter, k, dtype, fp8)
    norm_weight = (1 + 0.1 * torch.randn(k)).to(dtype)
    norm = GemvNorm(norm_weight, EPS, r, nan_like((1, k), dtype))
    got = gemv(x, weight, weight_scale=scale, config=cfg, norm=norm, epilogue="silu_mul")
    assert got.shape == (1, inter)
    # the three kernels it replaces (bf16 roundings compound through silu: the reference is fp32's)
    normed, h = rms_norm(x, norm_weight, EPS, r)
    assert torch.equal(norm.residual_out, h)
    unfused = silu_and_mul(gemv(normed, weight, weight_scale=scale, config=cfg))
    torch.testing.assert_close(got, unfused, **tolerance(dtype))
    if dtype == torch.float32:
        want, _ = gemv_ref(x, weight, weight_scale=scale, norm=norm, epilogue="silu_mul")
        torch.testing.assert_close(got, want, **tolerance(dtype))


def test_bad_fusions_are_refused():
    k = 64
    x, r = torch.randn(2, k), torch.randn(2, k)
    w = torch.randn(32, k)
    with pytest.raises(AssertionError, match="residual_out must not alias"):
        gemv(x, w, norm=GemvNorm(torch.ones(k), EPS, r, r))
    with pytest.raises(AssertionError, match="needs residual_out"):
        gemv(x, w, norm=GemvNorm(torch.ones(k), EPS, r))
    with pytest.raises(AssertionError, match="norm weight must be"):
        gemv(x, w, norm=GemvNorm(torch.ones(k, dtype=torch.bfloat16), EPS))
    with pytest.raises(AssertionError, match="one row of x"):
        gemv(x, w, epilogue="silu_mul")
    with pytest.raises(AssertionError, match="one row of x"):
        gemv(x[:1], w, epilogue="silu_mul", config=GemvConfig(block_n=8, block_k=16, split_k=2))
    with pytest.raises(AssertionError, match="even number of rows"):
        gemv(x[:1], w[:31], epilogue="silu_mul")


@pytest.mark.parametrize(**pairwise(dtype=[torch.float32, torch.bfloat16], fp8=[False, True], shape=["odd", "even-k"]))
def test_residual_sumsq_then_norm_from_them_is_the_add_the_norm_and_the_product(dtype, fp8, shape):
    """o_proj adds its output to the residual stream in place and sums its squares per program;
    gate_up's folded norm takes rstd from those sums: the norm kernel's residual add, then RMSNorm,
    then the product."""
    n, k, cfg = CONFIGS[shape]
    o_weight, o_scale = weights(k, n, dtype, fp8)  # the producer writes K columns from N inputs
    up_weight, up_scale = weights(n, k, dtype, fp8)
    attn, residual = torch.randn(1, n).to(dtype), torch.randn(1, k).to(dtype)
    norm_weight = (1 + 0.1 * torch.randn(k)).to(dtype)
    stream = residual.clone()
    sumsq = torch.full((-(-k // cfg.block_n),), float("nan"))
    o = gemv(attn, o_weight, weight_scale=o_scale, out=stream, config=cfg,
             residual_sumsq=ResidualSumsq(stream, sumsq))
    assert o is stream
    unfused_o = gemv(attn, o_weight, weight_scale=o_scale, config=cfg)
    normed, h = rms_norm(unfused_o, norm_weight, EPS, residual)
    assert torch.equal(stream, h)  # the residual add, rounded as the norm kernel rounds it
    torch.testing.assert_close(sumsq.sum(), h.float().pow(2).sum(), rtol=1e-5, atol=1e-5)
    got = gemv(stream, up_weight, weight_scale=up_scale, config=cfg, norm=GemvNorm(norm_weight, EPS, sumsq=sumsq))
    torch.testing.assert_close(got, gemv(normed, up_weight, weight_scale=up_scale, config=cfg), **tolerance(dtype))


def test_residual_sumsq_refuses_what_it_cannot_do():
    x, w = torch.randn(2, 64), torch.randn(32, 64)
    stream, sumsq = torch.randn(2, 32), torch.zeros(4)
    cfg = GemvConfig(block_n=8, block_k=16)
    with pytest.raises(AssertionError, match="one row"):
        gemv(x, w, config=cfg, residual_sumsq=ResidualSumsq(stream, sumsq))
    with pytest.raises(AssertionError, match="one float32 per program"):
        gemv(x[:1], w, config=cfg, residual_sumsq=ResidualSumsq(stream[:1], torch.zeros(3)))
    with pytest.raises(AssertionError, match="summed squares takes one row"):
        gemv(x, w, norm=GemvNorm(torch.ones(64), EPS, sumsq=sumsq))
