"""kernels/gemv_tma.py, the one-row GEMV over TMA tiles, under TRITON_INTERPRET=1: against gemv_ref
and against gemv.py on the same weights, with a partial row block (N = 67), a K tail the tile
overruns (the descriptor pads it with zeros), per-row and per-tensor FP8 scales, a bias, and
silu(gate) * up in the epilogue. Outputs start as NaN in gemv.py's runs; here the kernel allocates,
so a row it forgot would hold garbage that the comparison catches."""

import pytest
import torch
from kernel_testing import pairwise, tolerance

from pagoda.kernels.gemv import GemvConfig, gemv
from pagoda.kernels.gemv_ref import gemv_ref
from pagoda.kernels.gemv_tma import TmaGemvConfig, gemv_tma
from pagoda.kernels.quant_fp8_ref import quantize_weight_fp8_ref

SHAPES = {"odd": (67, 144, TmaGemvConfig(block_n=16, block_k=32, num_warps=4, num_stages=2)),
          "even": (40, 128, TmaGemvConfig(block_n=8, block_k=64, num_warps=1, num_stages=3))}


def weights(n, k, dtype, scale: str):
    w = (torch.randn(n, k) / k**0.5).to(dtype)
    if scale == "none":
        return w, None
    q, s = quantize_weight_fp8_ref(w)
    return (q, s) if scale == "row" else (q, s.max().reshape(1))


@pytest.mark.parametrize(**pairwise(dtype=[torch.float32, torch.bfloat16], scale=["none", "row", "tensor"],
                                    bias=[False, True], shape=SHAPES))
def test_the_product_is_the_references(dtype, scale, bias, shape):
    n, k, cfg = shape
    x = torch.randn(1, k).to(dtype)
    weight, s = weights(n, k, dtype, scale)
    b = torch.randn(n).to(dtype) if bias else None
    got = gemv_tma(x, weight, s, b, config=cfg)
    assert got.shape == (1, n) and got.dtype == dtype
    torch.testing.assert_close(got, gemv_ref(x, weight, b, weight_scale=s), **tolerance(dtype))
    same_tile = GemvConfig(block_n=cfg.block_n, block_k=cfg.block_k, split_k=1, num_warps=4, fold=1)
    torch.testing.assert_close(got, gemv(x, weight, b, weight_scale=s, config=same_tile), **tolerance(dtype))


@pytest.mark.parametrize(**pairwise(dtype=[torch.float32, torch.bfloat16], scale=["none", "row"],
                                    bias=[False, True], shape=SHAPES))
def test_the_silu_mul_epilogue_is_gemv_pys(dtype, scale, bias, shape):
    inter, k, cfg = shape
    x = torch.randn(1, k).to(dtype)
    weight, s = weights(2 * inter, k, dtype, scale)
    b = torch.randn(2 * inter).to(dtype) if bias else None
    got = gemv_tma(x, weight, s, b, config=cfg, epilogue="silu_mul")
    assert got.shape == (1, inter)
    torch.testing.assert_close(got, gemv_ref(x, weight, b, weight_scale=s, epilogue="silu_mul"), **tolerance(dtype))


def test_bad_launches_are_refused():
    w = torch.zeros(16, 24)
    with pytest.raises(AssertionError, match="one row"):
        gemv_tma(torch.zeros(2, 24), w)
    with pytest.raises(AssertionError, match="256"):
        gemv_tma(torch.zeros(1, 24), w, config=TmaGemvConfig(block_n=512))
    with pytest.raises(AssertionError, match="TMA strides"):
        gemv_tma(torch.zeros(1, 6), torch.zeros(16, 6, dtype=torch.bfloat16))


def test_a_weight_keeps_one_descriptor_per_tile_and_drops_them_with_new_storage():
    from pagoda.kernels.gemv_tma import weight_descriptor

    w = torch.zeros(16, 32)
    a = weight_descriptor(w, 8, 16)
    assert weight_descriptor(w, 8, 16) is a and weight_descriptor(w, 16, 16) is not a
    w.data = torch.ones(16, 32)  # a reload in place
    b = weight_descriptor(w, 8, 16)
    assert b is not a and len(w._tma_descriptors) == 1
    torch.testing.assert_close(gemv_tma(torch.ones(1, 32), w, config=TmaGemvConfig(8, 16, 1, 2)), torch.full((1, 16), 32.0))
