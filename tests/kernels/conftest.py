"""Kernel tests run the Triton kernels on CPU tensors under Triton's interpreter.

triton.jit decides between compiling and interpreting when it decorates, so TRITON_INTERPRET is
set here, at collection, before the test modules import the kernels; a kernel module that some
earlier test already imported (compiled flavour) is reloaded so it is decorated again.
"""

import importlib
import os
import sys
import zlib

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

_TRITON_MODULES = [  # dependency order: attention_dot first
    "attention_dot", "fp8_cast", "kv_cache", "norm", "rotary", "rotary_kv_cache", "activation", "paged_attention_decode",
    "paged_attention_prefill", "sampling", "fused_moe", "gemv", "gemv_fp8", "gemv_tma", "gemv_rope", "quant_fp8", "norm_quant", "scaled_gemv",
]
for _name in _TRITON_MODULES:
    if f"pagoda.kernels.{_name}" in sys.modules:
        importlib.reload(sys.modules[f"pagoda.kernels.{_name}"])


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Fresh random inputs for every test, reproducible from the test's own id."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
