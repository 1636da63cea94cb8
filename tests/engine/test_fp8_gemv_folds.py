"""The decoder layer's FP8 folds at one row (ops.FOLD_NORM, and FOLD_GLU: --fold-gemv): the RMSNorm linked to qkv_proj or
gate_up_proj is computed inside that layer's weight-only GEMV (fp8_linear.NormedInput), and the MLP
takes silu(gate) * up out of gate_up's GEMV (fp8_linear.glu), so down_proj reads a plain input.
Run on the CPU with the dispatcher treating CPU tensors as CUDA ones (the kernels interpreted), and
compared with the same modules with the folds off: the kernels they replace."""

from types import SimpleNamespace

import pytest
import torch

from pagoda.kernels import fp8_dispatch, ops
from pagoda.kernels import gemv as gemv_module
from pagoda.kernels import norm as norm_module
from pagoda.kernels.fp8_dispatch import Fp8Launch
from pagoda.kernels.gemv import GemvConfig
from pagoda.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagoda.runtime.layers.norm import RMSNorm
from pagoda.runtime.models.llama import LlamaMLP
from pagoda.runtime.quantization import fp8_linear, fp8_residual
from pagoda.runtime.quantization.scheme import FP8Scheme

HIDDEN, INTER, QKV = 64, 96, 80
LAUNCH = GemvConfig(block_n=8, block_k=32, split_k=1, num_warps=4, fold=8)
DTYPE = torch.bfloat16


@pytest.fixture
def fp8_gpu(monkeypatch):
    """CPU tensors taken for CUDA ones by the dispatcher, FP8 kept as on an FP8 GPU, and measured
    one-row entries for the tiny shapes (the H200's table has the 8B model's)."""
    monkeypatch.setattr(ops, "_on_gpu", lambda t: True)
    monkeypatch.setattr(fp8_linear, "has_fp8_matmul", lambda device: True)
    monkeypatch.setattr(fp8_dispatch, "FP8_SMALL_M", {
        (1, QKV, HIDDEN, None): Fp8Launch("gemv", LAUNCH),
        (1, 2 * INTER, HIDDEN, None): Fp8Launch("gemv", LAUNCH),
        (1, 2 * INTER, HIDDEN, "silu_mul_out"): Fp8Launch("gemv", LAUNCH),
        (1, HIDDEN, INTER, None): Fp8Launch("gemv", LAUNCH),
        (1, HIDDEN, INTER, "silu_mul"): Fp8Launch("gemv", LAUNCH),
        (1, HIDDEN, HIDDEN, None): Fp8Launch("gemv", LAUNCH),
    })
    calls = []
    gemv = gemv_module.gemv
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **kw: calls.append(
        (a[1].shape[0], kw.get("act"), kw.get("norm") is not None, kw.get("epilogue"))) or gemv(*a, **kw))
    rms_norm = norm_module.rms_norm
    monkeypatch.setattr(norm_module, "rms_norm", lambda *a, **kw: calls.append("rms_norm") or rms_norm(*a, **kw))
    return calls


def quantized(layer):
    """The layer as finish_loading leaves it on an FP8 GPU: its bf16 weight quantized per channel."""
    layer.weight.data = (torch.randn(layer.weight.shape) / layer.weight.shape[1] ** 0.5).to(DTYPE)
    fp8_linear.finish_loading(layer, FP8Scheme(source="online", serialized=False, activations="dynamic-token"), DTYPE)
    return layer


def norm_linked_to(layer):
    norm = RMSNorm(HIDDEN, 1e-5)
    norm.weight.data = (1 + 0.1 * torch.randn(HIDDEN)).to(DTYPE)
    norm.link_fp8_consumer(layer)
    return norm


def mlp_after_its_norm():
    """An FP8 LlamaMLP and the post-attention norm linked to its gate_up_proj."""
    mlp = LlamaMLP(SimpleNamespace(hidden_size=HIDDEN, intermediate_size=INTER))
    quantized(mlp.gate_up_proj), quantized(mlp.down_proj)
    return mlp, norm_linked_to(mlp.gate_up_proj)


def both_ways(monkeypatch, calls, run, folds=("FOLD_NORM", "FOLD_GLU")):
    """run() with the folds (ops switches) on and off: (result on, calls on, result off, calls off)."""
    for fold in folds:
        monkeypatch.setattr(ops, fold, True)
    calls.clear()
    on = run()
    calls_on = list(calls)
    calls.clear()
    for fold in folds:
        monkeypatch.setattr(ops, fold, False)
    off = run()
    return on, calls_on, off, list(calls)


def test_mlp_after_its_norm_is_two_kernels_at_one_row(fp8_gpu, monkeypatch):
    torch.manual_seed(0)
    mlp, norm = mlp_after_its_norm()
    x, residual = torch.randn(1, HIDDEN).to(DTYPE), torch.randn(1, HIDDEN).to(DTYPE)

    def run():
        normed, new_residual = norm(x, residual)
        return mlp(normed), new_residual

    (got, got_residual), calls_on, (want, want_residual), calls_off = both_ways(monkeypatch, fp8_gpu, run)
    # gate_up with the norm in its input and silu(gate) * up in its output, then a plain down
    assert calls_on == [(2 * INTER, None, True, "silu_mul"), (HIDDEN, None, False, None)]
    assert calls_off == ["rms_norm", (2 * INTER, None, False, None), (HIDDEN, "silu_mul", False, None)]
    assert torch.equal(got_residual, want_residual)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_qkv_after_the_first_layers_norm_without_a_residual(fp8_gpu, monkeypatch):
    torch.manual_seed(1)
    qkv = quantized(ColumnParallelLinear(HIDDEN, QKV))
    norm = norm_linked_to(qkv)
    x = torch.randn(1, HIDDEN).to(DTYPE)
    got, calls_on, want, calls_off = both_ways(monkeypatch, fp8_gpu, lambda: qkv(norm(x)))
    assert calls_on == [(QKV, None, True, None)]
    assert calls_off == ["rms_norm", (QKV, None, False, None)]
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_two_rows_keep_the_norm_quantizing_for_the_scaled_matmul(fp8_gpu, monkeypatch):
    """Past the table's one-row entries the layer quantizes its input, so the norm's kernel does
    that (QuantizedInput) and nothing is folded into a GEMV: the same calls both ways."""
    torch.manual_seed(2)
    mlp, norm = mlp_after_its_norm()
    x, residual = torch.randn(2, HIDDEN).to(DTYPE), torch.randn(2, HIDDEN).to(DTYPE)

    def run():
        normed, new_residual = norm(x, residual)
        assert isinstance(normed, fp8_linear.QuantizedInput)
        return mlp(normed), new_residual

    (got, got_residual), calls_on, (want, want_residual), calls_off = both_ways(monkeypatch, fp8_gpu, run)
    assert calls_on == calls_off == []
    assert torch.equal(got, want) and torch.equal(got_residual, want_residual)


@pytest.mark.parametrize("glu", [True, False])
def test_residual_adds_inside_the_producers_then_norms_from_their_sums(fp8_gpu, monkeypatch, glu):
    """ops.FOLD_SUMSQ: o_proj and down_proj add their output to the residual stream in their own
    GEMV and sum its squares there; post_attention_layernorm, the next layer's input_layernorm and
    the final norm take rstd from those sums. No norm kernel runs; the stream is the same bits as
    the norm kernels' residual adds, and the layers' outputs match the unfolded ones."""
    torch.manual_seed(3)
    monkeypatch.setattr(ops, "FOLD_GLU", glu)
    o_proj = quantized(RowParallelLinear(HIDDEN, HIDDEN))
    mlp, post_norm = mlp_after_its_norm()
    qkv = quantized(ColumnParallelLinear(HIDDEN, QKV))
    for producer in (o_proj, mlp.down_proj):
        producer.sums_into_norm = True
    next_norm, final_norm = norm_linked_to(qkv), norm_linked_to(None)
    attn, start = torch.randn(1, HIDDEN).to(DTYPE), torch.randn(1, HIDDEN).to(DTYPE)

    def run():
        residual = start.clone()  # the stream is written in place
        hidden, residual = post_norm(o_proj(attn), residual)
        hidden, residual = next_norm(mlp(hidden), residual)
        q = qkv(hidden)
        final, residual = final_norm(o_proj(attn), residual)
        return q, final, residual

    monkeypatch.setattr(ops, "FOLD_SUMSQ", True)
    assert isinstance(o_proj(attn), fp8_residual.PendingOutput)
    (q, final, stream), calls_on, (q_off, final_off, stream_off), calls_off = both_ways(
        monkeypatch, fp8_gpu, run, folds=("FOLD_SUMSQ",))
    assert "rms_norm" not in calls_on[:-1] and calls_on[-1] == "rms_norm"  # only the final norm, unlinked
    assert calls_off.count("rms_norm") == 3
    assert sum(1 for c in calls_on if c != "rms_norm") == sum(1 for c in calls_off if c != "rms_norm")
    assert torch.equal(stream, stream_off)
    torch.testing.assert_close(q, q_off, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(final, final_off, rtol=2e-2, atol=2e-2)


def test_producers_compute_at_once_off_the_fold_or_past_one_row(fp8_gpu, monkeypatch):
    o_proj = quantized(RowParallelLinear(HIDDEN, HIDDEN))
    o_proj.sums_into_norm = True
    x = torch.randn(1, HIDDEN).to(DTYPE)
    assert isinstance(o_proj(x), torch.Tensor)  # FOLD_SUMSQ is off by default
    monkeypatch.setattr(ops, "FOLD_SUMSQ", True)
    assert isinstance(o_proj(x), fp8_residual.PendingOutput)
    assert isinstance(o_proj(torch.randn(2, HIDDEN).to(DTYPE)), torch.Tensor)
    o_proj.sums_into_norm = False
    assert isinstance(o_proj(x), torch.Tensor)
