"""The one tl.dot both attention kernels use, the precision it runs at, and the scores they make.

fp32 inputs run at full IEEE precision (not TF32), so fp32 checks against the reference stay tight.
Triton's CPU interpreter multiplies bf16 operands as their raw uint16 bit patterns (it stores bf16
as uint16 and hands them to numpy.matmul), so there, and only there, bf16 operands are widened to
fp32 first. The widening is exact, so the interpreter computes what the GPU's bf16 MMA computes.
"""

import math

import torch
import triton
import triton.language as tl

# The window of a layer without one: wider than any sequence, so the same arithmetic serves both.
NO_WINDOW = 1 << 30
LOG2E = math.log2(math.e)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    if PRECISION == "widen":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


def dot_precision(query: torch.Tensor) -> str:
    if query.dtype == torch.float32:
        return "ieee"
    if query.dtype == torch.bfloat16 and not query.is_cuda:
        return "widen"
    return "tf32"  # ignored by Triton for 16-bit operands


def fp8_as_f16(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernels run an FP8 cache's dots in fp16: for a 16-bit query over an e4m3 cache.

    e4m3 widens to fp16 exactly, and on Hopper that is one packed instruction per two values
    (cvt.rn.f16x2.e4m3x2). Widening to bf16 goes e4m3 -> fp16 -> fp32 -> bf16, two more
    conversions a value, and conversions issue at a quarter of the FMA rate: on the H200 that held
    the FP8 decode kernel to 40% of the bandwidth, slower than the bf16 cache it halves. A bf16 q
    converts to fp16 exactly in fp16's range (|q| < 65504, far above any attention input), and the
    probabilities in [0, 1] round to fp16 more finely than to bf16."""
    return k_cache.dtype in (torch.float8_e4m3fn,) and query.dtype in (torch.bfloat16, torch.float16)


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^2x + 1): exact at both ends (e^2x overflowing to inf gives 1), no libdevice call
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _scores(q, k_t, qk_scale, cap_log2, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """Attention scores in log2 units (the kernels' softmax uses exp2): q k^T * scale, or with
    soft-capping (Gemma 2) cap * tanh(q k^T * scale / cap)."""
    s = _dot(q, k_t, PRECISION) * qk_scale
    if SOFTCAP:
        s = _tanh(s) * cap_log2
    return s


def score_scales(scale: float, softcap: float | None) -> tuple[float, float]:
    """(qk_scale, cap_log2) for _scores: the product scale folds in log2(e) or 1 / cap."""
    if softcap:
        return scale / softcap, softcap * LOG2E
    return scale * LOG2E, 1.0
