"""RMSNorm fused with the FP8 activation quantization (kernels/norm_quant.py) under
TRITON_INTERPRET=1: equal, bit for bit, to the unfused Triton pair it replaces (rms_norm, then
quantize_fp8, which round alike under the interpreter), and to the torch reference (rms_norm_ref,
then quantize_fp8_ref) bit for bit in fp32 and within one e4m3 step in bf16 (the interpreter
rounds fp32 to bf16 by truncation; the GPU rounds as the reference does)."""

import pytest
import torch
from kernel_testing import tolerance

from pagoda.kernels.norm import rms_norm
from pagoda.kernels.norm_quant import rms_norm_quant_fp8
from pagoda.kernels.norm_quant_ref import rms_norm_quant_fp8_ref
from pagoda.kernels.quant_fp8 import quantize_fp8

F32, BF16 = torch.float32, torch.bfloat16


def inputs(dtype, residual: bool, hidden=200):
    x = (torch.randn(6, hidden) * torch.logspace(-3, 2, 6)[:, None]).to(dtype)
    x[3] = 0  # an all-zero row (without residual): the floor scale
    r = torch.randn(6, hidden).to(dtype) if residual else None
    w = (torch.rand(hidden) + 0.5).to(dtype)
    return x, r, w


def split(out, residual):
    return out if residual else (out, None)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("static", [False, True], ids=["per-token", "static"])
def test_fused_norm_quant_equals_the_unfused_kernels(dtype, residual, static):
    x, r, w = inputs(dtype, residual)
    scale = torch.tensor(0.0123) if static else None
    (q, s), new_r = split(rms_norm_quant_fp8(x, w, 1e-6, r, scale), residual)
    normed, want_r = split(rms_norm(x, w, 1e-6, r), residual)
    q_want, s_want = quantize_fp8(normed, scale)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (6, 1)
    assert torch.equal(q.float(), q_want.float()) and torch.equal(s, s_want)
    if residual:
        assert torch.equal(new_r, want_r)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("static", [False, True], ids=["per-token", "static"])
def test_fused_norm_quant_matches_the_torch_reference(dtype, residual, static):
    x, r, w = inputs(dtype, residual, hidden=1000)
    scale = torch.tensor(0.02) if static else None
    (q, s), new_r = split(rms_norm_quant_fp8(x, w, 1e-5, r, scale), residual)
    (q_ref, s_ref), r_ref = split(rms_norm_quant_fp8_ref(x, w, 1e-5, r, scale), residual)
    if residual:
        torch.testing.assert_close(new_r, r_ref, **tolerance(dtype))
    torch.testing.assert_close(s, s_ref, **tolerance(dtype))
    got, want = q.float() * s, q_ref.float() * s_ref
    if dtype == F32:  # rsqrt may differ by an ulp, which moves a value across an e4m3 midpoint rarely
        assert (q.float() == q_ref.float()).float().mean() > 0.999
    # dequantized, within one e4m3 step (2^-3 relative; 2^-9 of the scale for subnormals) plus the
    # bf16 slack of the normalised row
    assert ((got - want).abs() <= want.abs() * (2**-3 + 2**-5) + s_ref * 2**-8).all()
    assert (q.float() == q_ref.float()).float().mean() > 0.9
