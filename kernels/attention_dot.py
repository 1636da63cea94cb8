"""The one tl.dot both attention kernels use, and the precision it runs at.

fp32 inputs run at full IEEE precision (not TF32), so fp32 checks against the reference stay tight.
Triton's CPU interpreter multiplies bf16 operands as their raw uint16 bit patterns (it stores bf16
as uint16 and hands them to numpy.matmul), so there, and only there, bf16 operands are widened to
fp32 first. The widening is exact, so the interpreter computes what the GPU's bf16 MMA computes.
"""

import torch
import triton
import triton.language as tl


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
