"""--gemm-glu (ops.GEMM_GLU): from ops.GEMM_GLU_MIN_ROWS rows the Llama MLP takes silu(gate) * up from
gate_up_proj's own kernel (kernels/gemm_glu.py) and down_proj reads it; fewer rows, the switch off,
an FP8 layer or a biased one keep cuBLAS, then the activation. The MLP's output must match the
unfused path. On the CPU with the dispatcher taking CPU tensors for CUDA ones (the kernel
interpreted), as test_rope_kv_fold_path.py does."""

from types import SimpleNamespace

import pytest
import torch

from pagoda.kernels import gemm_glu as gemm_glu_module
from pagoda.kernels import ops
from pagoda.runtime.models.llama import LlamaMLP

HIDDEN, INTER = 32, 48


@pytest.fixture
def kernel_calls(monkeypatch):
    monkeypatch.setattr(ops, "_on_gpu", lambda t: True)
    monkeypatch.setattr(ops, "GEMM_GLU_MIN_ROWS", 8)
    monkeypatch.setattr(ops, "GEMV_ENABLED", False)  # the GEMV's few-row path is not under test
    calls = []
    kernel = gemm_glu_module.gemm_glu
    monkeypatch.setattr(gemm_glu_module, "gemm_glu", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    yield calls
    ops.configure(device=torch.device("cpu"))


def mlp(dtype, cls=LlamaMLP):
    cfg = SimpleNamespace(hidden_size=HIDDEN, intermediate_size=INTER)
    block = cls(cfg)
    torch.manual_seed(0)
    for layer in (block.gate_up_proj, block.down_proj):
        layer.weight.data = (torch.randn(layer.weight.shape) / layer.weight.shape[1] ** 0.5).to(dtype)
    return block


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_mlp_takes_the_fused_kernel_from_the_threshold_and_matches(kernel_calls, dtype):
    block = mlp(dtype)
    x = torch.randn(12, HIDDEN).to(dtype)
    ops.configure(gemm_glu=False, device=torch.device("cpu"))
    unfused = block(x)
    assert kernel_calls == []
    ops.configure(gemm_glu=True, device=torch.device("cpu"))
    fused = block(x)
    assert kernel_calls == [torch.Size([12, HIDDEN])]
    # one rounding of the activation apart at most: the sums run in another order than F.linear's
    torch.testing.assert_close(fused, unfused, rtol=2e-2, atol=2e-2)
    block(x[:7])  # under the threshold: cuBLAS and silu_and_mul
    assert len(kernel_calls) == 1


def test_gemma_takes_it_with_gelu_tanh(kernel_calls):
    from pagoda.runtime.models.gemma2 import GemmaMLP

    block = mlp(torch.float16, GemmaMLP)
    x = torch.randn(12, HIDDEN).to(torch.float16)
    ops.configure(gemm_glu=False, device=torch.device("cpu"))
    unfused = block(x)
    ops.configure(gemm_glu=True, device=torch.device("cpu"))
    torch.testing.assert_close(block(x), unfused, rtol=2e-2, atol=2e-2)
    assert kernel_calls == [torch.Size([12, HIDDEN])]


def test_fp32_and_biased_layers_keep_the_unfused_path(kernel_calls):
    ops.configure(gemm_glu=True, device=torch.device("cpu"))
    block = mlp(torch.float32)
    block(torch.randn(12, HIDDEN))  # 16-bit floats only, as the GEMV
    biased = mlp(torch.bfloat16)
    biased.gate_up_proj.bias = torch.nn.Parameter(torch.zeros(2 * INTER, dtype=torch.bfloat16))
    biased(torch.randn(12, HIDDEN).to(torch.bfloat16))
    assert kernel_calls == []
