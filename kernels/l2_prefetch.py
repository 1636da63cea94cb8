"""Weights read into L2 ahead of the GEMV that needs them, by extra programs of the rotary kernel.

At one decode row a layer streams its weights through four GEMVs, and between the qkv GEMV and the
o GEMV run rotary + KV write and the decode attention: about 7 us a layer on the H200 in which HBM
is nearly idle, while o_proj's 16.8 MB of FP8 weight then stream at about 2.1 TB/s, a short
launch's ramp being a large part of its 8 us. So the rotary kernel that follows qkv may take
PROGRAMS extra programs (`Regions`), each of which issues Hopper's bulk L2 prefetch
(`cp.async.bulk.prefetch.L2`, fire and forget: the program ends at once, and the copy engine
fetches the bytes while attention runs) over its share of up to three byte ranges: o_proj's
weight, and the head of each half of gate_up's. Nothing waits for them and nothing they touch is
written, so the kernels' results cannot change (e2e/gpu_prefetch_check.py checks the bits).

Tried first, and lost (48717ab, e2e/results/prefetch-48717ab/): a kernel on a side stream that
loaded the weights through L2. The chain with PDL went 2.457 -> 2.930 ms reading o_proj only: the
stream's fork and join edges in the graph cost more than L2 saved, and its loads were too slow.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

PROGRAMS = 64  # extra programs of the rotary launch; each SM's copy engine takes a share
CHUNK = 8192  # bytes one lane's prefetch instruction covers; every range is a multiple of it
MAX_RANGES = 3


@dataclass(frozen=True, slots=True)
class Regions:
    """Up to MAX_RANGES contiguous tensors to prefetch, each a whole number of CHUNKs, and whether the
    prefetch may start before the kernel before it has ended (early: during qkv's last programs)."""
    tensors: tuple[torch.Tensor, ...]
    early: bool = False

    def args(self) -> list:
        """(pointer, chunks) for each of MAX_RANGES ranges; absent ones are the first with 0 chunks."""
        out = []
        for i in range(MAX_RANGES):
            t = self.tensors[min(i, len(self.tensors) - 1)]
            nbytes = t.numel() * t.element_size()
            assert t.is_contiguous() and nbytes % CHUNK == 0, "a prefetch range is whole chunks"
            out += [t, nbytes // CHUNK if i < len(self.tensors) else 0]
        return out


@triton.jit
def _issue(ptr, chunks, lane, lanes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Prefetch chunks lane, lane + lanes, ... of the range at ptr into L2."""
    base = ptr.to(tl.pointer_type(tl.uint8))
    for first in range(0, chunks, lanes):
        c = first + lane + tl.arange(0, LANES)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $3; mov.u32 $0, 0; }",
            "=r,l,r,r", [base + c.to(tl.int64) * CHUNK, (c < chunks).to(tl.int32), tl.full([LANES], CHUNK, tl.int32)],
            dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def issue_ranges(p0, n0, p1, n1, p2, n2, program, PROGRAMS: tl.constexpr, CHUNK: tl.constexpr,
                 LANES: tl.constexpr):
    """This prefetch program's share of the three ranges (program in 0..PROGRAMS-1)."""
    lane, lanes = program * LANES, PROGRAMS * LANES
    _issue(p0, n0, lane, lanes, CHUNK, LANES)
    _issue(p1, n1, lane, lanes, CHUNK, LANES)
    _issue(p2, n2, lane, lanes, CHUNK, LANES)
