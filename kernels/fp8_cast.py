"""The float32 -> e4m3 cast inside Triton kernels, the same on the GPU and under the interpreter.

On the GPU the cast is the hardware's (round to nearest even). Triton's CPU interpreter rounds
wrongly for values between grid points (it turned -125 into -64 and 17 into 18, measured with triton
3.7), though it casts values on the grid exactly. So there, and only there, the value is first
rounded to the e4m3 grid in float32 arithmetic (round to nearest even through the magic-number add,
as on the GPU) and then cast. Callers clamp to +-448 first.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def to_e4m3(x, dst_ty: tl.constexpr, ROUND_FIRST: tl.constexpr):
    if ROUND_FIRST:
        bits = x.to(tl.int32, bitcast=True)
        exponent = ((bits >> 23) & 0xFF) - 127
        # e4m3 keeps 3 mantissa bits; below 2^-6 the grid is the subnormals' 2^-9
        quantum = tl.maximum(exponent, -6) - 3
        # 1.5 * 2^(quantum + 23): adding it leaves exactly the bits above the quantum, rounded to even
        magic = ((quantum + 23 + 127) << 23 | (1 << 22)).to(tl.float32, bitcast=True)
        x = (x + magic) - magic  # (the interpreter's cast then writes -0 as +0, the same number)
    return x.to(dst_ty)


@triton.jit
def to_cache(x, scale, dst_ty: tl.constexpr, FP8: tl.constexpr, ROUND_FIRST: tl.constexpr):
    """A KV-cache element: x itself, or for an e4m3 cache x / scale clamped and rounded
    (kv_cache_ref.to_cache)."""
    if FP8:
        return to_e4m3(tl.clamp(x.to(tl.float32) / scale, -448.0, 448.0), dst_ty, ROUND_FIRST)
    else:
        return x.to(dst_ty)


def round_first(t: torch.Tensor) -> bool:
    return not t.is_cuda
