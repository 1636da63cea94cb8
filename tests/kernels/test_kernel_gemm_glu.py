"""The gate|up GEMM with the activation in its epilogue (kernels/gemm_glu.py) against its reference,
F.linear then silu_and_mul (or gelu_tanh_and_mul), under TRITON_INTERPRET=1: ragged rows, columns
and K tails, several tiles and program groups, fp32, fp16 and bf16."""

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import tolerance

from pagoda.kernels.activation_ref import gelu_tanh_and_mul_ref, silu_and_mul_ref
from pagoda.kernels.gemm_glu import GluGemmConfig, gemm_glu

REFERENCE = {"silu": silu_and_mul_ref, "gelu_tanh": gelu_tanh_and_mul_ref}
# 3 x 3 row tiles in groups of 2: the last group is short, so its column order is the general case
SMALL = GluGemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=1, num_stages=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows,k,inter", [(1, 32, 16), (37, 40, 40), (48, 64, 48)])
def test_gemm_glu_matches_linear_then_activation(dtype, activation, rows, k, inter):
    torch.manual_seed(rows + k + inter)
    x = torch.randn(rows, k).to(dtype)
    weight = (torch.randn(2 * inter, k) * k**-0.5).to(dtype)
    got = gemm_glu(x, weight, activation, config=SMALL)
    want = REFERENCE[activation](F.linear(x, weight))
    assert got.shape == (rows, inter) and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, **tolerance(dtype))
        return
    # 16-bit: the projections round before the product, so a sum that lands one ulp apart from
    # F.linear's (another order) moves the output by a few ulps. Element-wise a few ulps; and in fp16,
    # which the interpreter rounds to nearest (it truncates to bf16), on average as close to the exact
    # fp32 value as the reference path is.
    torch.testing.assert_close(got, want, rtol=4e-2, atol=4e-2)
    if dtype == torch.float16:
        exact = REFERENCE[activation](F.linear(x.float(), weight.float()))
        ours, theirs = (got.float() - exact).abs().mean(), (want.float() - exact).abs().mean()
        assert ours <= 1.25 * theirs + 1e-6, (ours, theirs)


def test_gemm_glu_keeps_leading_dims_writes_into_out_and_takes_no_rows():
    x = torch.randn(2, 5, 32)
    weight = torch.randn(48, 32) / 32**0.5
    out = torch.full((2, 5, 24), float("nan"))
    assert gemm_glu(x, weight, out=out, config=SMALL) is out
    torch.testing.assert_close(out, silu_and_mul_ref(F.linear(x, weight)), **tolerance(torch.float32))
    empty = gemm_glu(torch.empty(0, 32), weight, config=SMALL)
    assert empty.shape == (0, 24)


def test_gemm_glu_reads_gate_then_up_rows():
    """gate is the weight's first half: swapping the halves must change the output (the kernel does
    not read both from one place)."""
    x = torch.randn(20, 32)
    weight = torch.randn(64, 32) / 32**0.5
    swapped = torch.cat([weight[32:], weight[:32]])
    a, b = gemm_glu(x, weight, config=SMALL), gemm_glu(x, swapped, config=SMALL)
    torch.testing.assert_close(b, silu_and_mul_ref(F.linear(x, swapped)), **tolerance(torch.float32))
    assert not torch.allclose(a, b)


def test_the_default_hopper_tile_is_right_too():
    """DEFAULT (the GPU's launch, 128 x 64 x 64 in groups of 8) on ragged rows, columns and K: the
    interpreter runs the same index arithmetic as the device."""
    from pagoda.kernels.gemm_glu import DEFAULT

    torch.manual_seed(3)
    x = torch.randn(130, 200)
    weight = torch.randn(2 * 72, 200) / 200**0.5
    got = gemm_glu(x, weight, config=DEFAULT)
    torch.testing.assert_close(got, silu_and_mul_ref(F.linear(x, weight)), **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,k,inter", [(5, 32, 16), (37, 40, 40), (40, 64, 24)])
def test_the_tma_form_matches_the_pointer_form(dtype, rows, k, inter):
    """x and the weight read through tensor descriptors: boxes past the ends come back as zeros, and a
    gate box of a ragged last column tile reaching into up's rows is never stored."""
    torch.manual_seed(rows * k)
    x = torch.randn(rows, k).to(dtype)
    weight = (torch.randn(2 * inter, k) * k**-0.5).to(dtype)
    tma = GluGemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=1, num_stages=1, tma=True)
    got = gemm_glu(x, weight, config=tma)
    torch.testing.assert_close(got, gemm_glu(x, weight, config=SMALL), rtol=0, atol=0)  # the same sums


def test_the_gpu_launch_goes_by_rows_and_k():
    """choose_launch: below 128 rows the 64-row pointer tile; from 128 the TMA form, 128 columns wide
    for long K or 2,048 rows; the pointer form where TMA cannot run. Every launch it picks is one the
    sweep measures, so none is a guess."""
    from pagoda.kernels.gemm_glu import CANDIDATES, DEFAULT, NARROW_TMA, SMALL_BATCH, WIDE_TMA, choose_launch

    assert choose_launch(64, 896, tma=True) is SMALL_BATCH
    assert choose_launch(127, 4096, tma=True) is SMALL_BATCH
    assert choose_launch(128, 896, tma=True) is NARROW_TMA
    assert choose_launch(2047, 896, tma=True) is NARROW_TMA
    assert choose_launch(2048, 896, tma=True) is WIDE_TMA
    assert choose_launch(256, 4096, tma=True) is WIDE_TMA
    assert choose_launch(4096, 4096, tma=False) is DEFAULT
    assert {SMALL_BATCH, NARROW_TMA, WIDE_TMA, DEFAULT} <= set(CANDIDATES)


def test_the_cpu_takes_the_interpreted_tile():
    from pagoda.kernels.gemm_glu import INTERPRETED, launch_for

    assert launch_for(torch.zeros(300, 64), torch.zeros(32, 64)) is INTERPRETED
