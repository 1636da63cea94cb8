"""The second weight-only FP8 GEMV (kernels/gemv_fp8.py: 1..8 rows in one loop, x in the weights'
register layout) under TRITON_INTERPRET=1 against gemv_ref's dequantize-then-multiply, and its
route through the measured table. Outputs are poisoned with NaN first, so a row or column the
kernel forgets to write shows up."""

import pytest
import torch
from kernel_testing import pairwise, tolerance
from test_kernel_gemv_fp8 import fp8_layer, fp8_weight

from pagoda.kernels import fp8_dispatch, ops
from pagoda.kernels import gemv_fp8 as gemv_fp8_module
from pagoda.kernels.fp8_dispatch import Fp8Launch
from pagoda.kernels.gemv_fp8 import MAX_ROWS, Fp8GemvConfig, fp8_gemv, fp8_gemv_config
from pagoda.kernels.gemv_ref import gemv_ref
from pagoda.runtime.quantization import fp8_linear

# N = 67 leaves a partial row block, K = 130 a masked tail over several chunks and splits.
CONFIGS = {
    "one-split": Fp8GemvConfig(block_n=16, block_k=32, split_k=1, num_warps=4),
    "split-k-3": Fp8GemvConfig(block_n=4, block_k=32, split_k=3, num_warps=4),
    "split-k-2-wide": Fp8GemvConfig(block_n=8, block_k=64, split_k=2, num_warps=8),
}
# The tests over several axes run a covering set of them (kernel_testing.pairwise: every value,
# and every pair of values, in some case), not the whole cross product: the interpreter makes
# each case cost.


def check(rows, n, k, dtype, *, per_row, bias, act=None, config=None):
    x = torch.randn(rows, 2 * k if act else k).to(dtype)
    q, scale = fp8_weight(n, k, per_row)
    b = torch.randn(n).to(dtype) if bias else None
    out = torch.full((rows, n), float("nan"), dtype=dtype)
    got = fp8_gemv(x, q, scale, b, act=act, out=out, config=config)
    assert got is out
    torch.testing.assert_close(got, gemv_ref(x, q, b, weight_scale=scale, act=act), **tolerance(dtype))


@pytest.mark.parametrize(**pairwise(dtype=[torch.float32, torch.bfloat16], rows=[1, 2, 3, 5, 8],
                                     per_row={"per-channel": True, "per-tensor": False}, config=CONFIGS))
def test_fp8_gemv_v2_matches_reference(dtype, rows, per_row, config):
    check(rows, 67, 130, dtype, per_row=per_row, bias=rows % 2 == 1, config=config)


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_fp8_gemv_v2_silu_mul(rows, config):
    check(rows, 67, 130, torch.bfloat16, per_row=True, bias=rows == 4, act="silu_mul", config=config)


def test_fp8_gemv_v2_default_launch_and_even_k():
    cfg = fp8_gemv_config(1, 4096, 4096)
    assert cfg.block_k == 1024 and cfg.block_k >= 8 * 32 * cfg.num_warps  # x shares the weights' layout
    assert fp8_gemv_config(8, 4096, 4096).block_n < fp8_gemv_config(1, 4096, 4096).block_n
    check(3, 40, 256, torch.bfloat16, per_row=True, bias=True, config=Fp8GemvConfig(8, 64, 2, 4))  # unmasked
    check(2, 3, 4096, torch.bfloat16, per_row=False, bias=False)  # the heuristic's own split


def test_fp8_gemv_v2_rejects_bad_operands():
    q, scale = fp8_weight(8, 32, per_row=True)
    with pytest.raises(AssertionError, match="at most 8 rows"):
        fp8_gemv(torch.randn(MAX_ROWS + 1, 32), q, scale)
    with pytest.raises(AssertionError, match="weight_scale"):
        fp8_gemv(torch.randn(1, 32), q, scale[:4])
    with pytest.raises(AssertionError, match="e4m3"):
        fp8_gemv(torch.randn(1, 32), q.float(), scale)


def test_the_table_routes_rows_to_the_v2_gemv(monkeypatch):
    """An entry for the second GEMV at 8 rows takes rows 1..8 there, x unquantized, and the norm
    before the layer then leaves x unquantized too."""
    monkeypatch.setattr(ops, "_on_gpu", lambda t: True)
    cfg = Fp8GemvConfig(block_n=8, block_k=32, split_k=2, num_warps=4)
    monkeypatch.setattr(fp8_dispatch, "FP8_SMALL_M", {(8, 40, 64, None): Fp8Launch("gemv_fp8", cfg)})
    calls = []
    kernel = gemv_fp8_module.fp8_gemv
    monkeypatch.setattr(gemv_fp8_module, "fp8_gemv", lambda *a, **kw: calls.append(kw["config"]) or kernel(*a, **kw))
    layer, b = fp8_layer(40, 64, bias=True)
    layer.bias = b
    for rows in (1, 5, 8):
        x = torch.randn(rows, 64).to(torch.bfloat16)
        got = fp8_linear.apply(layer, x, b)
        torch.testing.assert_close(got, gemv_ref(x, layer.weight, b, weight_scale=layer.weight_scale),
                                   **tolerance(torch.bfloat16))
        normed = fp8_linear.norm_for(layer, torch.ones(64, dtype=torch.bfloat16), 1e-6, x)
        assert isinstance(normed, torch.Tensor)  # the plain norm: this path takes x unquantized
    assert calls == [cfg] * 3
    x = torch.randn(9, 64).to(torch.bfloat16)  # past the table: quantized by the norm for _scaled_mm
    assert isinstance(fp8_linear.norm_for(layer, torch.ones(64, dtype=torch.bfloat16), 1e-6, x),
                      fp8_linear.QuantizedInput)
