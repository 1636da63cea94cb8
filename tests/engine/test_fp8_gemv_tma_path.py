"""--gemv-tma (kernels/fp8_dispatch.ONE_ROW_TMA): the 1-row weight-only GEMV entries run the TMA-fed
GEMV of kernels/gemv_tma.py instead, gate_up with silu(gate) * up in its epilogue and a plain
down_proj after it, with the same output as gemv.py's; two rows keep their own path, and only a
CUDA device installs it. On the CPU with the dispatcher taking CPU tensors for CUDA ones (the
kernels interpreted), as test_fp8_gemv_folds.py does."""

from types import SimpleNamespace

import pytest
import torch

from pagoda.kernels import fp8_dispatch, ops
from pagoda.kernels import gemv_tma as tma_module
from pagoda.kernels.fp8_dispatch import Fp8Launch
from pagoda.kernels.gemv import GemvConfig
from pagoda.kernels.gemv_tma import TmaGemvConfig
from pagoda.runtime.layers.linear import ColumnParallelLinear
from pagoda.runtime.models.llama import LlamaMLP
from pagoda.runtime.quantization import fp8_linear
from pagoda.runtime.quantization.scheme import FP8Scheme

HIDDEN, INTER, QKV = 64, 96, 80
LAUNCH = GemvConfig(block_n=8, block_k=32, split_k=1, num_warps=4, fold=8)
TMA = TmaGemvConfig(block_n=8, block_k=32, num_warps=4, num_stages=2)
DTYPE = torch.bfloat16


@pytest.fixture
def tma_calls(monkeypatch):
    monkeypatch.setattr(ops, "_on_gpu", lambda t: True)
    monkeypatch.setattr(fp8_linear, "has_fp8_matmul", lambda device: True)
    monkeypatch.setattr(fp8_dispatch, "FP8_SMALL_M", {
        (1, QKV, HIDDEN, None): Fp8Launch("gemv", LAUNCH),
        (1, 2 * INTER, HIDDEN, "silu_mul_out"): Fp8Launch("gemv", LAUNCH),
        (1, HIDDEN, INTER, None): Fp8Launch("gemv", LAUNCH),
        (1, HIDDEN, INTER, "silu_mul"): Fp8Launch("gemv", LAUNCH),
    })
    calls = []
    real = tma_module.gemv_tma
    monkeypatch.setattr(tma_module, "gemv_tma", lambda x, w, *a, **kw: calls.append(
        (w.shape[0], kw.get("epilogue"), kw.get("config"))) or real(x, w, *a, **kw))
    return calls


def quantized(layer):
    layer.weight.data = (torch.randn(layer.weight.shape) / layer.weight.shape[1] ** 0.5).to(DTYPE)
    fp8_linear.finish_loading(layer, FP8Scheme(source="online", serialized=False, activations="dynamic-token"), DTYPE)
    return layer


def test_the_mlp_at_one_row_runs_two_tma_gemvs_with_gemv_pys_output(tma_calls, monkeypatch):
    torch.manual_seed(0)
    mlp = LlamaMLP(SimpleNamespace(hidden_size=HIDDEN, intermediate_size=INTER))
    quantized(mlp.gate_up_proj), quantized(mlp.down_proj)
    x = torch.randn(1, HIDDEN).to(DTYPE)
    want = mlp(x)
    assert tma_calls == []
    monkeypatch.setattr(fp8_dispatch, "ONE_ROW_TMA", TMA)
    got = mlp(x)
    assert tma_calls == [(2 * INTER, "silu_mul", TMA), (HIDDEN, None, TMA)]
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_qkv_at_one_row_takes_it_and_two_rows_do_not(tma_calls, monkeypatch):
    torch.manual_seed(1)
    qkv = quantized(ColumnParallelLinear(HIDDEN, QKV))
    monkeypatch.setattr(fp8_dispatch, "ONE_ROW_TMA", TMA)
    x = torch.randn(2, HIDDEN).to(DTYPE)
    one = qkv(x[:1])
    assert tma_calls == [(QKV, None, TMA)] and one.shape == (1, QKV)
    monkeypatch.setattr(fp8_dispatch, "ONE_ROW_TMA", None)
    torch.testing.assert_close(one, qkv(x[:1]), rtol=2e-2, atol=2e-2)
    tma_calls.clear()
    monkeypatch.setattr(fp8_dispatch, "ONE_ROW_TMA", TMA)
    assert fp8_dispatch.choose(2, QKV, HIDDEN, None, torch.device("cpu")).path != "gemv_tma"
    qkv(x)
    assert tma_calls == []


def test_only_a_cuda_device_installs_it(monkeypatch):
    monkeypatch.setattr(fp8_dispatch, "ONE_ROW_TMA", TMA)
    ops.configure(gemv_tma=True, device=torch.device("cpu"))
    assert fp8_dispatch.ONE_ROW_TMA is None


def test_without_the_glu_fold_down_keeps_gemv_py_for_its_silu_input(tma_calls, monkeypatch):
    """gemv_tma takes no silu_mul input: with --no-fold-gemv, gate_up runs it plain and down_proj,
    which computes SiLU from gate|up as it reads them, stays on gemv.py."""
    torch.manual_seed(2)
    monkeypatch.setattr(ops, "FOLD_GLU", False)
    monkeypatch.setitem(fp8_dispatch.FP8_SMALL_M, (1, 2 * INTER, HIDDEN, None), Fp8Launch("gemv", LAUNCH))
    mlp = LlamaMLP(SimpleNamespace(hidden_size=HIDDEN, intermediate_size=INTER))
    quantized(mlp.gate_up_proj), quantized(mlp.down_proj)
    x = torch.randn(1, HIDDEN).to(DTYPE)
    want = mlp(x)
    monkeypatch.setattr(fp8_dispatch, "ONE_ROW_TMA", TMA)
    got = mlp(x)
    assert tma_calls == [(2 * INTER, None, TMA)]
    assert fp8_dispatch.choose(1, HIDDEN, INTER, "silu_mul", torch.device("cpu")).path == "gemv"
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_a_measured_tile_overrides_the_default(tma_calls, monkeypatch):
    tile = TmaGemvConfig(block_n=16, block_k=64, num_warps=4, num_stages=3)
    monkeypatch.setattr(fp8_dispatch, "ONE_ROW_TMA", TMA)
    monkeypatch.setattr(fp8_dispatch, "TMA_TILES", {(QKV, HIDDEN, None): tile,
                                                    (2 * INTER, HIDDEN, "silu_mul_out"): tile})  # gate|up's N
    assert fp8_dispatch.choose(1, QKV, HIDDEN, None, torch.device("cpu")).config == tile
    assert fp8_dispatch.fused_glu(1, 2 * INTER, HIDDEN, torch.device("cpu")).config == tile
    assert fp8_dispatch.choose(1, HIDDEN, INTER, None, torch.device("cpu")).config == TMA
