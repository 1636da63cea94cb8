"""The Triton GEMV (decode's linear layers at 1..4 rows) against F.linear, under TRITON_INTERPRET=1,
and the dispatcher that decides when the runtime uses it. Outputs are poisoned with NaN first, so a
row or column the kernel forgets to write shows up as a mismatch."""


import pytest
import torch
import torch.nn.functional as F
from kernel_testing import pairwise, tolerance

from pagoda.kernels import gemv as gemv_module
from pagoda.kernels import ops
from pagoda.kernels.gemv import MAX_ROWS, GemvConfig, gemv, gemv_config
from pagoda.kernels.gemv_ref import gemv_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Small blocks, so odd shapes cover partial row blocks, a masked K tail and several K chunks;
# fold=1 keeps the whole [BLOCK_N, BLOCK_K] product, the default sums 8 neighbours per thread.
SMALL = GemvConfig(block_n=16, block_k=32, split_k=1, num_warps=4)
SPLIT = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4)
UNFOLDED = GemvConfig(block_n=16, block_k=64, split_k=2, num_warps=4, fold=1)
CONFIGS = {"whole-k": SMALL, "split-k": SPLIT, "fold-1-split-k": UNFOLDED}
# Each test below runs a covering set of its axes (kernel_testing.pairwise: every value, and every
# pair of values, in some case), not the whole cross product: the interpreter makes each case cost.


def linear_inputs(rows, n, k, dtype, bias: bool, act=None):
    x = torch.randn(rows, 2 * k if act else k).to(dtype)
    weight = (torch.randn(n, k) / k**0.5).to(dtype)  # outputs of order 1, as in a real layer
    b = torch.randn(n).to(dtype) if bias else None
    return x, weight, b


def check(x, weight, bias, act, config):
    rows, n = x.reshape(-1, x.shape[-1]).shape[0], weight.shape[0]
    out = torch.full((*x.shape[:-1], n), float("nan"), dtype=x.dtype)
    got = gemv(x, weight, bias, act=act, out=out, config=config)
    assert got is out
    torch.testing.assert_close(got, gemv_ref(x, weight, bias, act=act), **tolerance(x.dtype))
    assert got.shape == (*x.shape[:-1], n) and rows <= MAX_ROWS


@pytest.mark.parametrize(**pairwise(dtype=DTYPES, rows=[1, 2, 3, 4], bias=[False, True], config=CONFIGS))
def test_gemv_odd_shape(dtype, rows, bias, config):
    # N = 67 leaves a partial row block; K = 130 a masked tail (and an uneven last split)
    check(*linear_inputs(rows, 67, 130, dtype, bias), None, config)


@pytest.mark.parametrize(**pairwise(dtype=DTYPES, rows=[1, 4], split_k=[1, 2, 4], fold=[1, 8]))
def test_gemv_even_k(dtype, rows, split_k, fold):
    # K a multiple of the split length: the unmasked loop
    config = GemvConfig(block_n=8, block_k=64, split_k=split_k, num_warps=4, fold=fold)
    check(*linear_inputs(rows, 40, 256, dtype, bias=True), None, config)


@pytest.mark.parametrize(**pairwise(dtype=DTYPES, rows=[1, 2, 3, 4], config=CONFIGS))
def test_gemv_silu_mul(dtype, rows, config):
    x, weight, b = linear_inputs(rows, 67, 130, dtype, bias=rows % 2 == 0, act="silu_mul")
    check(x, weight, b, "silu_mul", config)


def test_gemv_silu_mul_even_k():
    check(*linear_inputs(2, 48, 128, torch.bfloat16, bias=False, act="silu_mul"), "silu_mul",
          GemvConfig(block_n=16, block_k=64, split_k=2, num_warps=4))


def test_gemv_default_config_leading_dims_and_strided_rows():
    # rows taken out of a wider buffer (stride != K), with leading dimensions, default launch knobs
    wide = torch.randn(3, 1, 200).to(torch.bfloat16)
    x = wide[..., :130]
    weight = (torch.randn(67, 130) / 130**0.5).to(torch.bfloat16)
    got = gemv(x, weight)
    assert got.shape == (3, 1, 67)
    torch.testing.assert_close(got, F.linear(x, weight), **tolerance(torch.bfloat16))


def test_gemv_split_k_is_deterministic():
    x, weight, b = linear_inputs(3, 67, 130, torch.float32, bias=True)
    assert torch.equal(gemv(x, weight, b, config=SPLIT), gemv(x, weight, b, config=SPLIT))


@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)])
@pytest.mark.parametrize("weight_bytes", [2, 1], ids=["bf16", "fp8"])
def test_gemv_config_fits_llama_8b_shapes(rows, n, k, weight_bytes):
    cfg = gemv_config(rows, n, k, 132, weight_bytes)
    for block in (cfg.block_n, cfg.block_k, cfg.split_k, cfg.fold):
        assert block & (block - 1) == 0, cfg  # powers of two: tl.arange and the split arithmetic
    threads = 32 * cfg.num_warps
    assert cfg.block_n * cfg.block_k * weight_bytes // threads <= 2 * gemv_module.LOAD_BYTES_PER_THREAD
    assert cfg.fold * weight_bytes == gemv_module.VECTOR_BYTES  # one thread's 16-byte load
    assert rows * cfg.block_n * cfg.block_k // (cfg.fold * threads) <= 64  # accumulator registers
    assert k % cfg.block_k == 0 and -(-n // cfg.block_n) * cfg.split_k >= 132  # fills the GPU


def test_gemv_config_small_shapes_are_launchable():
    for m, n, k in [(1, 1, 1), (4, 67, 130), (2, 896, 4864), (1, 3, 16384)]:
        cfg = gemv_config(m, n, k)
        assert cfg.block_n >= 1 and cfg.block_k >= 16 and cfg.split_k >= 1
    x, weight, _ = linear_inputs(1, 3, 16384, torch.float32, bias=False)
    assert gemv_config(1, 3, 16384).split_k > 1  # a few rows over a long K: split by default
    torch.testing.assert_close(gemv(x, weight), F.linear(x, weight), **tolerance(torch.float32))


def test_ops_linear_on_cpu_is_f_linear():
    for rows in (1, 3, 9):
        x, weight, b = linear_inputs(rows, 33, 64, torch.bfloat16, bias=True)
        assert torch.equal(ops.linear(x, weight, b), F.linear(x, weight, b))
        assert torch.equal(ops.linear(x, weight), F.linear(x, weight))
        gate_up = torch.randn(rows, 128).to(torch.bfloat16)
        want = F.linear(ops.silu_and_mul(gate_up), weight, b)
        assert torch.equal(ops.silu_and_mul_linear(gate_up, weight, b), want)


@pytest.fixture
def on_gpu(monkeypatch):
    """Makes the dispatcher treat CPU tensors as CUDA ones (the kernels then run interpreted)."""
    monkeypatch.setattr(ops, "_on_gpu", lambda t: True)


def test_use_gemv_selection(on_gpu, monkeypatch):
    bf16, w = torch.bfloat16, torch.randn(8, 16).to(torch.bfloat16)
    for rows in range(1, ops.GEMV_MAX_ROWS + 1):
        assert ops._use_gemv(torch.randn(rows, 16).to(bf16), w)
        assert ops._use_gemv(torch.randn(rows, 16).half(), w.half(), torch.randn(8).half())
    assert ops._use_gemv(torch.randn(2, 1, 16).to(bf16), w)  # rows counted over leading dims
    assert not ops._use_gemv(torch.randn(ops.GEMV_MAX_ROWS + 1, 16).to(bf16), w)
    assert not ops._use_gemv(torch.randn(0, 16).to(bf16), w)
    assert not ops._use_gemv(torch.randn(1, 16), w.float())  # fp32: cuBLAS
    assert not ops._use_gemv(torch.randn(1, 16).to(bf16), w.float())  # mixed dtypes
    assert not ops._use_gemv(torch.randn(1, 16).to(bf16), w, torch.randn(8))  # fp32 bias
    assert not ops._use_gemv(torch.randn(1, 16).to(bf16), w.t().contiguous().t())  # column-major W
    assert not ops._use_gemv(torch.randn(1, 32).to(bf16)[:, ::2], w)  # strided x row
    monkeypatch.setattr(ops, "GEMV_ENABLED", False)
    assert not ops._use_gemv(torch.randn(1, 16).to(bf16), w)


def test_use_gemv_needs_cuda():
    w = torch.randn(8, 16).to(torch.bfloat16)
    assert not ops._use_gemv(torch.randn(1, 16).to(torch.bfloat16), w)


def test_configure_switches_gemv_off_and_on(on_gpu, monkeypatch):
    """The engine's --no-enable-gemv reaches the kernels through ops.configure."""
    monkeypatch.setattr(ops, "GEMV_ENABLED", ops.GEMV_ENABLED)  # restored after the test
    monkeypatch.setattr(ops, "FUSED_ROPE_KV", ops.FUSED_ROPE_KV)
    bf16 = torch.bfloat16
    x, w = torch.randn(1, 64).to(bf16), torch.randn(32, 64).to(bf16)
    ops.configure(enable_gemv=False, fused_rope_kv=False)
    assert not ops._use_gemv(x, w) and not ops.FUSED_ROPE_KV
    ops.configure()
    assert ops._use_gemv(x, w) and ops.FUSED_ROPE_KV


@pytest.mark.parametrize("rows,want_calls", [(1, 1), (4, 1), (5, 0)])
def test_ops_route_small_batches_to_gemv(on_gpu, monkeypatch, rows, want_calls):
    # As if this shape had measured faster than cuBLAS at these row counts.
    for m in range(1, 6):
        for act in (None, "silu_mul"):
            monkeypatch.setitem(gemv_module.FASTER_THAN_CUBLAS, (m, 33, 64, act), GemvConfig(block_k=32, fold=1))
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("act"))
        return gemv(*args, **kwargs)

    monkeypatch.setattr(gemv_module, "gemv", spy)
    x, weight, b = linear_inputs(rows, 33, 64, torch.bfloat16, bias=True)
    torch.testing.assert_close(ops.linear(x, weight, b), F.linear(x, weight, b), **tolerance(torch.bfloat16))
    gate_up = torch.randn(rows, 128).to(torch.bfloat16)
    torch.testing.assert_close(ops.silu_and_mul_linear(gate_up, weight, b),
                               gemv_ref(gate_up, weight, b, act="silu_mul"), **tolerance(torch.bfloat16))
    assert calls == [None, "silu_mul"] * want_calls


def test_ops_keep_cublas_where_it_measured_faster(on_gpu, monkeypatch):
    """Only shapes listed in FASTER_THAN_CUBLAS take the GEMV; an unlisted one, or a listed shape at
    another row count or without its activation, stays on F.linear."""
    calls = []
    monkeypatch.setattr(gemv_module, "gemv", lambda *a, **kw: calls.append(kw.get("act")) or gemv(*a, **kw))
    monkeypatch.setitem(gemv_module.FASTER_THAN_CUBLAS, (1, 33, 64, "silu_mul"), GemvConfig(block_k=32, fold=1))
    x, weight, _ = linear_inputs(1, 33, 64, torch.bfloat16, bias=False)
    assert torch.equal(ops.linear(x, weight), F.linear(x, weight))  # (1, 33, 64, None) is not listed
    gate_up = torch.randn(2, 128).to(torch.bfloat16)
    assert torch.equal(ops.silu_and_mul_linear(gate_up, weight), F.linear(ops.silu_and_mul(gate_up), weight))
    assert calls == []
    ops.silu_and_mul_linear(torch.randn(1, 128).to(torch.bfloat16), weight)
    assert calls == ["silu_mul"]


def test_measured_wins_are_llama_8b_decode_shapes():
    """The table holds the one-row shapes the H200 sweep measured, with launches that run."""
    assert set(gemv_module.FASTER_THAN_CUBLAS) == {(1, 6144, 4096, None), (1, 4096, 4096, None),
                                                   (1, 4096, 14336, "silu_mul")}
    assert gemv_module.measured_win(1, 6144, 4096, None, torch.device("cpu")) is not None
    assert gemv_module.measured_win(1, 28672, 4096, None, torch.device("cpu")) is None  # gate_up: cuBLAS
