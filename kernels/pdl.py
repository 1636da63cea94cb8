"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's chain of kernels.

At one decode row a layer is nine short kernels (norm, qkv GEMV, rotary + KV write, attention,
merge, o GEMV, norm, gate_up GEMV, down GEMV), each a few microseconds, and every boundary costs a
ramp: the next kernel's programs are placed only once the last program of the one before has
ended, and its first loads then wait a full HBM round trip. With PDL a kernel launched with
`launch_pdl` may start as soon as every program of the kernel before it has called
`launch_dependents`. Its programs then do the work that needs nothing from that kernel (a GEMV
issues its first weight loads; weights are never written during a step) and block in `wait` until
the kernel before has finished and its writes are visible.

The contract every PDL kernel here keeps, which makes the chain safe at any depth:
- it calls `launch_dependents` first, so the next kernel can be placed early;
- it calls `wait` unconditionally, before it reads anything an earlier kernel wrote and before it
  writes anything at all. So no kernel ends before the kernel before it has ended, and by
  induction, past `wait` every earlier kernel of the stream has ended.
A kernel launched without PDL (cuBLAS, torch ops) still waits for the whole kernel before it, and a
PDL kernel after it finds its `wait` already satisfied, so the two mix freely.

ENABLED is installed once by kernels.ops.configure (the engine's --enable-pdl), before any kernel
is built; it is never on for the CPU's interpreter, which has no such launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ENABLED = False


def supported(device: torch.device | None) -> bool:
    """PDL needs compute capability 9.0 (Hopper) or later."""
    return device is not None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


# Rows (tokens, or sequences for attention) up to which a launch takes PDL: decode's few rows, where
# a layer's kernels are a few microseconds each and the GEMV streams weights (W2 on the H200: FP8
# 2.90 -> 2.62 ms, bf16 4.50 -> 4.33). Past them a kernel runs long enough that its ramp matters
# little: W1 (256 rows) was level with PDL, and W4 (1,024 seats) 101.9k / 92.0k tok/s with it
# against 100.4k / 103.0k without in two pairs (e2e/PERF_NOTES.md), so large launches go without.
MAX_ROWS = 4


def flag(t: torch.Tensor, rows: int) -> bool:
    """Whether a launch over `rows` rows on t's device takes PDL: the kernels' PDL constexpr."""
    return ENABLED and rows <= MAX_ROWS and t.is_cuda


def options(on: bool) -> dict:
    """The launch keywords for a kernel whose PDL constexpr is `on`."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def launch_dependents(PDL: tl.constexpr):
    """Let the next kernel in the stream be placed now."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait(PDL: tl.constexpr):
    """Block until the kernel before has ended and its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()
