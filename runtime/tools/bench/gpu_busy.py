"""W4's figure: the share of wall time in which the GPU runs anything, from the profiler's kernel
(and memcpy/memset) intervals. Overlapping intervals (several streams) count once.

Profiling adds host overhead, so the busy share it reports is a lower bound; the throughput figure
always comes from a run without the profiler.
"""

from __future__ import annotations

import time


def union_seconds(intervals: list[tuple[int, int]]) -> float:
    """Total length of the union of [start_ns, end_ns) intervals, in seconds."""
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total / 1e9


def measure_gpu_busy(fn, warmup=None) -> dict:
    """Run fn() under the CUDA profiler; return the busy share of its wall time.

    The profiler's first GPU activity pays a one-off set-up of a second or more, so `warmup()` (a
    small run of the same kind) goes first inside the profiled region, and only the window of fn()
    counts. Kineto stamps events with the host's wall clock (time.time_ns), which bounds the window.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise RuntimeError("the GPU-busy figure needs a CUDA device")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if warmup is not None:
            warmup()
        torch.cuda.synchronize()
        start_ns = time.time_ns()
        fn()
        torch.cuda.synchronize()
        end_ns = time.time_ns()
    events = [e for e in prof.profiler.kineto_results.events() if e.device_type() == torch.autograd.DeviceType.CUDA]
    window = [(max(e.start_ns(), start_ns), min(e.end_ns(), end_ns)) for e in events]
    window = [(a, b) for a, b in window if b > a]
    busy = union_seconds(window)
    wall = (end_ns - start_ns) / 1e9
    return {"gpu_busy_fraction": busy / wall, "gpu_busy_s": busy, "profiled_wall_s": wall,
            "profiled_gpu_events": len(window)}
