"""Triton SiLU-and-multiply for the gated MLP: silu(gate) * up over a merged gate-up tensor.

Grid is (rows, column tiles): the intermediate size of 8B models (14336) is split into tiles of
1024 so each program streams a small contiguous stripe of both halves. Rounding follows the
reference (silu rounded to the activation dtype before the multiply).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def silu_times_up(x_ptr, row, stride_x, d, cols, mask):
    """silu(gate) * up at cols of one merged row, in float32 (silu rounded to x's dtype first);
    also the FP8 quantization's input (quant_fp8.py)."""
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0)
    silu = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty)
    return silu.to(tl.float32) * up.to(tl.float32)


@triton.jit
def gated_activation(acc_gate, acc_up, dtype: tl.constexpr, ACTIVATION: tl.constexpr):
    """act(gate) * up in float32 from a GEMM's float32 gate and up accumulators, rounded as the
    reference (F.linear, then silu_and_mul or gelu_tanh_and_mul): each projection to dtype, then the
    activation; the caller rounds the product. For the fused MoE and gemm_glu epilogues."""
    gate = acc_gate.to(dtype).to(tl.float32)
    up = acc_up.to(dtype).to(tl.float32)
    if ACTIVATION == "silu":
        act = gate / (1.0 + tl.exp(-gate))
    else:  # gelu_tanh; tanh(z) = 1 - 2 / (exp(2z) + 1)
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = 0.5 * gate * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    return act.to(dtype).to(tl.float32) * up


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o, d,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    out = silu_times_up(x_ptr, row, stride_x, d, cols, mask)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x is [..., 2 * d] holding gate then up; returns [..., d] (into out, contiguous, if given)."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    assert x2.stride(-1) == 1, "the last dimension must be contiguous"
    if out is None:
        out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, d)
    rows = x2.shape[0]
    if rows > 0 and d > 0:
        block = min(1024, triton.next_power_of_2(d))
        _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](
            x2, out2, x2.stride(0), out2.stride(0), d,
            BLOCK=block, num_warps=max(1, min(8, block // 128)),
        )
    return out
