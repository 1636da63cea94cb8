"""Weights read into L2 ahead of the GEMV that needs them, while the GPU's memory would idle.

At one decode row a layer streams its weights through four GEMVs, and between the qkv GEMV and the
o GEMV run rotary + KV write and the decode attention: about 7 us a layer on the H200 in which HBM
is nearly idle (they read a few hundred KB), while o_proj's 16.8 MB of FP8 weight then stream at
about 2.1 TB/s, a short launch's ramp being a large part of its 8 us. `Prefetcher.ahead` starts a
kernel on a side stream, forked from the current one, that reads given weights with L2-only loads
(`.cg`), so they are in L2 (50 MB on the H200) when the GEMV reaches them; `join` makes the current
stream wait for it again, which a CUDA graph capture needs before it ends. Both are recorded into a
graph like any other stream work. The kernel reads every 4-byte word once and xors them into one
int32 per program (`sink`): the loads must feed a store, or the compiler drops them, and the xor
lets a test check that every word was read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Programs and words a program loads at once: 132 programs of 8 warps hold 32 KB each in flight,
# about 4 MB over the H200's 132 SMs, the load depth HBM needs at its bandwidth (Little's law at a
# microsecond), while leaving the decode attention's 64 programs room beside them.
PROGRAMS = 132
BLOCK_WORDS = 8192
NUM_WARPS = 8


@triton.jit
def _prefetch_kernel(src, n_words, sink, span, BLOCK: tl.constexpr):
    # span (a multiple of BLOCK) words a program, the last program's cut at n_words
    pid = tl.program_id(0)
    start = pid * span
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for off in range(0, span, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        acc ^= tl.load(src + idx, mask=idx < n_words, other=0, cache_modifier=".cg")
    tl.store(sink + pid, tl.xor_sum(acc, axis=0))


def words(t: torch.Tensor) -> torch.Tensor:
    """t's bytes as int32 words (t contiguous, its size a multiple of 4 bytes)."""
    assert t.is_contiguous() and t.numel() * t.element_size() % 4 == 0, "prefetch needs whole words"
    return t.reshape(-1).view(torch.uint8).view(torch.int32)


def prefetch(t: torch.Tensor, sink: torch.Tensor, programs: int = PROGRAMS, block: int = BLOCK_WORDS,
             num_warps: int = NUM_WARPS) -> None:
    """Read t once through L2, on the current stream; sink[:programs] gets each program's xor."""
    w = words(t)
    span = triton.cdiv(triton.cdiv(w.numel(), programs), block) * block
    grid = (triton.cdiv(w.numel(), span),)
    _prefetch_kernel[grid](w, w.numel(), sink, span, BLOCK=block, num_warps=num_warps)


class Prefetcher:
    """One side stream per device for `ahead`, and whether the current stream must `join` it."""

    def __init__(self):
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._sinks: dict[torch.device, torch.Tensor] = {}
        self.pending: torch.cuda.Stream | None = None

    def ahead(self, tensors) -> None:
        """Start reading `tensors` (CUDA) into L2 beside the current stream's work."""
        device = tensors[0].device
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
            self._sinks[device] = torch.zeros(PROGRAMS, dtype=torch.int32, device=device)
        side, sink = self._streams[device], self._sinks[device]
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for t in tensors:
                prefetch(t, sink)
        self.pending = side

    def join(self) -> None:
        """The current stream waits for the last `ahead`'s reads (a no-op when none is pending)."""
        if self.pending is not None:
            torch.cuda.current_stream(self.pending.device).wait_stream(self.pending)
            self.pending = None
