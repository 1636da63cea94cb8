"""The tensor-core small-M FP8 GEMM (kernels/scaled_gemv.py) under TRITON_INTERPRET=1 against its
reference (both operands dequantized, fp32 product) and against torch._scaled_mm with row-wise
scales on the CPU, whose arithmetic it takes over at decode's few rows. Rows' activation scales
span two decades and weight rows' one, so a product given another row's scale shows."""

import pytest
import torch
from kernel_testing import tolerance

from pagoda.kernels.quant_fp8_ref import quantize_fp8_ref, quantize_weight_fp8_ref
from pagoda.kernels.scaled_gemv import MAX_ROWS, ScaledGemvConfig, scaled_gemv, scaled_gemv_config
from pagoda.kernels.scaled_gemv_ref import scaled_gemv_ref

# Small blocks so N = 67 leaves a partial row block and K = 130 a masked tail over several chunks.
CONFIGS = dict(argnames="config", ids=["one-split", "split-k-3", "split-k-even"], argvalues=[
    ScaledGemvConfig(block_n=64, block_k=32, split_k=1, num_warps=4, num_stages=2),
    ScaledGemvConfig(block_n=64, block_k=32, split_k=3, num_warps=4, num_stages=3),
    ScaledGemvConfig(block_n=128, block_k=64, split_k=2, num_warps=4, num_stages=2),
])


def operands(rows, n, k, static=False):
    x = torch.randn(rows, k) * torch.logspace(-1, 1, rows)[:, None]  # rows' scales apart
    w = torch.randn(n, k) / k**0.5 * torch.logspace(-1, 0, n)[:, None]
    q, scale = quantize_fp8_ref(x, torch.tensor(0.01) if static else None)
    qw, sw = quantize_weight_fp8_ref(w)
    return q, scale, qw, sw


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 16])
@pytest.mark.parametrize(**CONFIGS)
def test_scaled_gemv_matches_reference(out_dtype, rows, config):
    q, scale, qw, sw = operands(rows, 67, 130)
    bias = torch.randn(67) if rows % 2 else None
    got = scaled_gemv(q, scale, qw, sw, bias, out_dtype=out_dtype, config=config)
    want = scaled_gemv_ref(q, scale, qw, sw, bias, out_dtype=out_dtype)
    assert got.shape == (rows, 67) and got.dtype == out_dtype
    torch.testing.assert_close(got, want, **tolerance(out_dtype))


@pytest.mark.parametrize("static", [False, True], ids=["per-token", "static"])
def test_scaled_gemv_equals_torch_scaled_mm(static):
    """torch._scaled_mm (row-wise scales; a static scale arrives expanded, stride 0) on the CPU."""
    q, scale, qw, sw = operands(7, 96, 256, static)
    bias = torch.randn(96).to(torch.bfloat16)
    got = scaled_gemv(q, scale, qw, sw, bias, out_dtype=torch.bfloat16,
                      config=ScaledGemvConfig(block_n=64, block_k=64, split_k=2, num_stages=2))
    want = torch._scaled_mm(q, qw.t(), scale_a=scale.contiguous(), scale_b=sw.view(1, -1),
                            out_dtype=torch.float32) + bias.float()
    torch.testing.assert_close(got, want.to(torch.bfloat16), **tolerance(torch.bfloat16))


def test_scaled_gemv_default_launch_splits_k_to_fill_the_gpu():
    cfg = scaled_gemv_config(4096, 4096)  # o_proj: 64 row blocks for 132 SMs
    assert cfg.split_k > 1 and cfg.block_n == 64
    assert scaled_gemv_config(28672, 4096).split_k == 1  # gate_up: 448 row blocks
    q, scale, qw, sw = operands(3, 40, 1024)
    torch.testing.assert_close(scaled_gemv(q, scale, qw, sw, out_dtype=torch.float32),
                               scaled_gemv_ref(q, scale, qw, sw, out_dtype=torch.float32), **tolerance(torch.float32))


def test_scaled_gemv_rejects_bad_operands():
    q, scale, qw, sw = operands(2, 40, 64)
    with pytest.raises(AssertionError, match="at most 16 rows"):
        big, big_scale = quantize_fp8_ref(torch.randn(MAX_ROWS + 1, 64))
        scaled_gemv(big, big_scale, qw, sw)
    with pytest.raises(AssertionError, match="e4m3"):
        scaled_gemv(q.float(), scale, qw, sw)
    with pytest.raises(AssertionError, match="weight_scale"):
        scaled_gemv(q, scale, qw, sw[:4])
