"""The FP8-weight GEMV (weight-only: x stays bf16/fp32, W is e4m3 with a per-row or per-tensor
float32 scale) under TRITON_INTERPRET=1 against gemv_ref's dequantize-then-multiply, and against
the CPU's FP8 path (the weight dequantized to the compute dtype at load, then F.linear). Outputs
are poisoned with NaN first, so a row or column the kernel forgets to write shows up."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import pairwise, tolerance

from pagoda.kernels import fp8_dispatch, ops
from pagoda.kernels import gemv as gemv_module
from pagoda.kernels import scaled_gemv as scaled_gemv_module
from pagoda.kernels.activation_ref import silu_and_mul_ref
from pagoda.kernels.fp8_dispatch import Fp8Launch
from pagoda.kernels.gemv import MAX_ROWS, GemvConfig, fp8_launch, gemv, gemv_config
from pagoda.kernels.gemv_ref import gemv_ref
from pagoda.kernels.quant_fp8_ref import (
    FP8_DTYPE,
    FP8_MAX,
    MIN_SCALE,
    quantize_fp8_ref,
    quantize_weight_fp8_ref,
)
from pagoda.kernels.scaled_gemv import ScaledGemvConfig
from pagoda.runtime.quantization import fp8_linear
from pagoda.runtime.quantization.scheme import FP8Scheme

DTYPES = [torch.float32, torch.bfloat16]
# Small blocks, so N = 67 leaves a partial row block and K = 130 a masked tail over several
# chunks; fold 16 is an FP8 thread's 16-byte load, fold 1 keeps the whole product.
CONFIGS = {
    "fold-16": GemvConfig(block_n=16, block_k=32, split_k=1, num_warps=4, fold=16),
    "split-k": GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, fold=16),
    "fold-1-split-k": GemvConfig(block_n=8, block_k=64, split_k=2, num_warps=4, fold=1),
}
PER_ROW = {"per-channel": True, "per-tensor": False}
# The tests over several axes run a covering set of them (kernel_testing.pairwise: every value,
# and every pair of values, in some case), not the whole cross product: the interpreter makes
# each case cost.


def fp8_weight(n: int, k: int, per_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight of outputs of order 1 at most quantized as the checkpoints are: per output row
    (rows' scales spread over a decade, so a row given another's scale shows) or one scale for
    the tensor."""
    w = torch.randn(n, k) / k**0.5 * torch.logspace(-1, 0, n)[:, None]
    if per_row:
        return quantize_weight_fp8_ref(w)
    scale = (w.abs().amax() / FP8_MAX).float()
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def check(rows, n, k, dtype, *, per_row, bias, act=None, config=None):
    x = torch.randn(rows, 2 * k if act else k).to(dtype)
    q, scale = fp8_weight(n, k, per_row)
    b = torch.randn(n).to(dtype) if bias else None
    out = torch.full((rows, n), float("nan"), dtype=dtype)
    got = gemv(x, q, b, weight_scale=scale, act=act, out=out, config=config)
    assert got is out and rows <= MAX_ROWS
    want = gemv_ref(x, q, b, weight_scale=scale, act=act)
    torch.testing.assert_close(got, want, **tolerance(dtype))
    return x, q, scale, b, got


@pytest.mark.parametrize(**pairwise(dtype=DTYPES, rows=[1, 2, 3, 4], per_row=PER_ROW, config=CONFIGS))
def test_fp8_gemv_odd_shape(dtype, rows, per_row, config):
    check(rows, 67, 130, dtype, per_row=per_row, bias=rows % 2 == 1, config=config)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("per_row", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("bias", [False, True])
def test_fp8_gemv_bias_and_scale_with_split_k(rows, per_row, bias):
    # scale and bias land on the split-K reduce kernel's side; both orders of the two are checked
    check(rows, 67, 130, torch.bfloat16, per_row=per_row, bias=bias,
          config=GemvConfig(block_n=16, block_k=32, split_k=4, num_warps=4, fold=16))


@pytest.mark.parametrize(**pairwise(dtype=DTYPES, rows=[1, 2, 3, 4], config=CONFIGS))
def test_fp8_gemv_silu_mul(dtype, rows, config):
    check(rows, 67, 130, dtype, per_row=rows != 3, bias=rows % 2 == 0, act="silu_mul", config=config)


@pytest.mark.parametrize("split_k", [1, 2])
def test_fp8_gemv_even_k(split_k):
    # K a multiple of the split length: the unmasked loop
    check(3, 40, 256, torch.bfloat16, per_row=True, bias=True,
          config=GemvConfig(block_n=8, block_k=64, split_k=split_k, num_warps=4, fold=16))


def test_fp8_gemv_equals_the_cpu_path_in_fp32():
    """The CPU runs an FP8 layer as F.linear over the weight dequantized at load
    (fp8_linear.finish_loading); in fp32 the kernel gives the same numbers."""
    x, q, scale, b, got = check(2, 67, 130, torch.float32, per_row=True, bias=True,
                                config=GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, fold=16))
    dequantized = q.float() * scale[:, None]
    torch.testing.assert_close(got, F.linear(x, dequantized, b), **tolerance(torch.float32))


def test_fp8_default_launch_runs_and_folds_16_weights():
    """gemv_config for a 1-byte weight folds one 16-byte load (16 weights) per thread, and its
    default launch (split K for a few rows over a long K) runs."""
    assert gemv_config(1, 4096, 4096, weight_bytes=1).fold == 16
    assert gemv_config(1, 4096, 4096).fold == 8  # bf16: 8 per 16 bytes
    cfg = fp8_launch(1, 3, 16384, None, torch.device("cpu"))
    assert cfg.split_k > 1 and cfg.fold == 16
    check(1, 3, 16384, torch.bfloat16, per_row=True, bias=False, config=cfg)
    check(2, 67, 130, torch.bfloat16, per_row=False, bias=True)  # gemv's own default, FP8 flavour


def test_fp8_gemv_rejects_a_missing_or_malformed_scale():
    q, scale = fp8_weight(8, 32, per_row=True)
    x = torch.randn(1, 32)
    with pytest.raises(AssertionError, match="weight_scale"):
        gemv(x, q)
    with pytest.raises(AssertionError, match="weight_scale"):
        gemv(x, q, weight_scale=scale[:4])
    with pytest.raises(AssertionError, match="weight_scale"):
        gemv(x, q.float(), weight_scale=scale)


@pytest.fixture
def on_gpu(monkeypatch):
    """Makes the dispatcher treat CPU tensors as CUDA ones (the kernels then run interpreted)."""
    monkeypatch.setattr(ops, "_on_gpu", lambda t: True)


def fp8_layer(n: int, k: int, bias: bool, activations: str = "dynamic-token"):
    """What finish_loading leaves on an FP8 GPU: an e4m3 weight, per-row scales, and for static
    activations the checkpoint's input_scale."""
    q, scale = fp8_weight(n, k, per_row=True)
    scheme = FP8Scheme(source="online", serialized=False, activations=activations)
    layer = SimpleNamespace(fp8=scheme, weight=q, weight_scale=scale, input_scale=torch.tensor(0.004))
    return layer, torch.randn(n).to(torch.bfloat16) if bias else None


def quantized_reference(layer, h, b):
    """torch._scaled_mm's arithmetic in fp32: h quantized as the scheme says, times the weight."""
    scale = {"dynamic-token": None, "static-tensor": layer.input_scale,
             "dynamic-tensor": (h.float().abs().amax() / FP8_MAX).clamp(min=MIN_SCALE)}[layer.fp8.activations]
    qx, sx = quantize_fp8_ref(h, scale)
    y = F.linear(qx.float() * sx, layer.weight.float() * layer.weight_scale[:, None]) + b.float()
    return y.to(h.dtype)


@pytest.mark.parametrize("rows,act,activations", [
    (1, None, "dynamic-token"), (1, "silu_mul", "static-tensor"), (4, None, "static-tensor"),
    (2, None, "dynamic-token"), (5, None, "dynamic-token"),
    (5, "silu_mul", "dynamic-token"), (6, "silu_mul", "static-tensor"), (7, "silu_mul", "dynamic-tensor"),
])
def test_fp8_layers_take_the_gemv_at_decode_rows_and_scaled_mm_above(on_gpu, monkeypatch, rows, act, activations):
    """Without measured entries: 1 row (FP8_GEMV_MAX_ROWS) one weight-only GEMV call (x unquantized);
    2 rows or more x quantized (silu(gate) * up in the quantizing kernel itself, where the scale is
    per row or static), then torch._scaled_mm, whose result is the quantized-activation product."""
    layer, b = fp8_layer(40, 64, bias=True, activations=activations)
    x = torch.randn(rows, 128 if act else 64).to(torch.bfloat16)
    calls, separate_silu = [], []
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **kw: calls.append(kw["act"]) or gemv(*a, **kw))
    silu_and_mul = ops.silu_and_mul
    monkeypatch.setattr(ops, "silu_and_mul", lambda t: separate_silu.append(t.shape) or silu_and_mul(t))
    got = fp8_linear.apply(layer, x, b, act=act)
    # a per-tensor dynamic scale needs the whole activation before quantizing; the others fuse it
    assert len(separate_silu) == (act == "silu_mul" and activations == "dynamic-tensor")
    weight_only = gemv_ref(x, layer.weight, b, weight_scale=layer.weight_scale, act=act)
    if rows <= fp8_dispatch.FP8_GEMV_MAX_ROWS:
        assert calls == [act]
        torch.testing.assert_close(got, weight_only, **tolerance(torch.bfloat16))
        return
    assert calls == []
    h = silu_and_mul_ref(x) if act else x
    torch.testing.assert_close(got, quantized_reference(layer, h, b), **tolerance(torch.bfloat16))
    assert (got.float() - weight_only.float()).abs().max() > 1e-2  # and x was quantized there


def test_measured_entries_route_rows_to_their_paths(on_gpu, monkeypatch):
    """With measured entries for a shape, r rows take the entry of the fewest measured rows >= r:
    the weight-only GEMV at its launch up to 2 rows, the tensor-core scaled GEMV up to 8 (x
    quantized, _scaled_mm's arithmetic), and past the table _scaled_mm again. Each result equals
    its path's reference."""
    gemv_cfg = GemvConfig(block_n=16, block_k=32, split_k=2, num_warps=4, fold=16)
    dot_cfg = ScaledGemvConfig(block_n=64, block_k=32, split_k=2, num_warps=4, num_stages=2)
    monkeypatch.setattr(fp8_dispatch, "FP8_SMALL_M", {
        (2, 40, 64, None): Fp8Launch("gemv", gemv_cfg), (8, 40, 64, None): Fp8Launch("scaled_gemv", dot_cfg),
        (4, 40, 32, "silu_mul"): Fp8Launch("scaled_gemv", dot_cfg),
    })
    layer, b = fp8_layer(40, 64, bias=True)
    calls = []
    for module, name in ((gemv_module, "gemv"), (scaled_gemv_module, "scaled_gemv")):
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, kernel=kernel, name=name, **kw:
                            calls.append((name, kw.get("config"))) or kernel(*a, **kw))
    scaled_mm = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **kw: calls.append(("scaled_mm", None)) or scaled_mm(*a, **kw))
    for rows, want_path in [(1, "gemv"), (2, "gemv"), (3, "scaled_gemv"), (8, "scaled_gemv"), (9, "scaled_mm")]:
        calls.clear()
        x = torch.randn(rows, 64).to(torch.bfloat16)
        got = fp8_linear.apply(layer, x, b)
        assert [c[0] for c in calls] == [want_path], rows
        assert calls[0][1] == {"gemv": gemv_cfg, "scaled_gemv": dot_cfg, "scaled_mm": None}[want_path]
        want = (gemv_ref(x, layer.weight, b, weight_scale=layer.weight_scale) if want_path == "gemv"
                else quantized_reference(layer, x, b))
        torch.testing.assert_close(got, want, **tolerance(torch.bfloat16))
    # down_proj's shape: silu(gate) * up quantized in one kernel, then the scaled GEMV
    down, db = fp8_layer(40, 32, bias=False)
    calls.clear()
    x = torch.randn(3, 64).to(torch.bfloat16)
    got = fp8_linear.apply(down, x, None, act="silu_mul")
    assert calls == [("scaled_gemv", dot_cfg)]
    torch.testing.assert_close(got, quantized_reference(down, silu_and_mul_ref(x), torch.zeros(40)),
                               **tolerance(torch.bfloat16))


def test_the_table_rejects_a_path_past_its_rows(on_gpu, monkeypatch):
    monkeypatch.setattr(fp8_dispatch, "FP8_SMALL_M", {(8, 40, 64, None): Fp8Launch("gemv", GemvConfig())})
    with pytest.raises(AssertionError, match="gemv takes at most 4 rows"):
        ops.fp8_path(torch.randn(1, 64), torch.empty(40, 64, dtype=FP8_DTYPE))


def test_fp8_gemv_choice_reads_shapes_only(on_gpu, monkeypatch):
    """Decode is captured in CUDA graphs: the choice must not read x (a meta tensor has no values
    to read, so any sync would raise), only its rows, dtype and strides."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    w = torch.empty(40, 64, device="meta", dtype=FP8_DTYPE)

    def path(x, bias=None):
        return ops.fp8_path(x, w, bias).path

    for rows in range(1, fp8_dispatch.FP8_GEMV_MAX_ROWS + 1):
        assert path(torch.empty(rows, 64, **meta), torch.empty(40, **meta)) == "gemv"
    assert path(torch.empty(1, 1, 64, **meta)) == "gemv"
    assert path(torch.empty(2, 1, 64, **meta)) == "scaled_mm"  # rows counted over leading dims
    assert path(torch.empty(fp8_dispatch.FP8_GEMV_MAX_ROWS + 1, 64, **meta)) == "scaled_mm"
    assert path(torch.empty(0, 64, **meta)) == "scaled_mm"
    assert path(torch.empty(1, 64, **meta), torch.empty(40, device="meta")) == "scaled_mm"  # fp32 bias
    assert path(torch.empty(1, 128, **meta)[:, ::2]) == "scaled_mm"  # strided row
    monkeypatch.setattr(ops, "GEMV_ENABLED", False)  # --no-enable-gemv: quantize + _scaled_mm
    assert path(torch.empty(1, 64, **meta)) == "scaled_mm"


def test_fp8_gemv_stays_off_the_cpu():
    """On the CPU an FP8 layer was dequantized at load (the reference); the GEMV never runs there."""
    w = torch.empty(40, 64, dtype=FP8_DTYPE)
    assert ops.fp8_path(torch.randn(1, 64).to(torch.bfloat16), w).path == "scaled_mm"
