"""CUDA graphs for decode steps: one graph per batch-size bucket, replayed over persistent buffers.

A decode step (every scheduled request has exactly one query token) launches the same few hundred
kernels every time, so on the GPU it is captured once per bucket size and replayed. A batch of S
sequences is padded up to the next bucket B: the B - S padding rows carry token 0 at position 0,
slot -1 (never written) and seq_len 0 (nothing attended), so they cost a little compute and change
no real row. The graphs read the step's inputs from InputBuffers, whose addresses never change.

Bucket choice and padding are plain host logic and run everywhere. On the CPU there is nothing to
capture, so `run` executes the padded batch eagerly: the CPU tests exercise the same padding.
"""

from __future__ import annotations

import bisect
import logging
import time

import torch

from pagoda.runtime.worker.attention_context import AttentionContext, attention_context
from pagoda.runtime.worker.input_batch import InputBuffers

logger = logging.getLogger(__name__)


# Above this many rows the buckets grow by 16 instead of 8: with 1024 seats (the default on big
# GPUs) that is 96 graphs instead of 128, and padding still wastes under 3% of a step.
WIDE_BUCKETS_FROM = 512


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to 512, every multiple of 16 beyond, and
    max_num_seqs itself: padding wastes at most 7 rows (15 past 512) once batches reach 8. Every
    decode batch up to max_num_seqs replays a graph; a small model at 1024 seats would otherwise
    spend more time launching kernels from Python than running them."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs]
    sizes += range(16, min(max_num_seqs, WIDE_BUCKETS_FROM) + 1, 8)
    sizes += range(WIDE_BUCKETS_FROM + 16, max_num_seqs + 1, 16)
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def padded_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest bucket that holds num_seqs, or None when the batch is larger than every one."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


class DecodeGraphs:
    """Captured decode forwards, keyed by padded batch size. Capture happens once, after the KV
    cache is bound, because the graphs bake in the cache's addresses."""

    def __init__(self, model: torch.nn.Module, buffers: InputBuffers, sizes: list[int], max_model_len: int):
        self.model = model
        self.buffers = buffers
        self.sizes = sizes
        self.max_model_len = max_model_len
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def _context(self, size: int) -> AttentionContext:
        b = self.buffers
        # Fixed hints: with max_query_len 1 and max_seq_len = max_model_len, every kernel's launch
        # shape (the decode split count included) depends on the batch size alone, so one capture
        # serves every context length.
        return AttentionContext(
            slot_mapping=b.slot_mapping[:size],
            block_tables=b.block_tables[:size],
            seq_lens=b.seq_lens[:size],
            query_start_loc=b.query_start_loc[: size + 1],
            max_query_len=1,
            max_seq_len=self.max_model_len,
        )

    def _forward(self, size: int) -> torch.Tensor:
        with attention_context(self._context(size)):
            return self.model(self.buffers.input_ids[:size], self.buffers.positions[:size])

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first, so the smaller graphs reuse the shared pool."""
        b = self.buffers
        b.reset_padding()  # valid inputs for capture: pad tokens that write and read nothing
        t0 = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        self.pool = torch.cuda.graph_pool_handle()
        for size in sorted(self.sizes, reverse=True):
            # Warm up on a side stream, as torch recommends, so lazy initialisation (Triton
            # compiles, cuBLAS workspaces) happens outside the capture.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._forward(size)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()
        used = free_before - torch.cuda.mem_get_info()[0]
        logger.info(
            "captured %d decode graphs (batch %d..%d) in %.1f s, using %.0f MiB",
            len(self.graphs), self.sizes[0], self.sizes[-1], time.perf_counter() - t0, used / 2**20,
        )

    def run(self, size: int) -> torch.Tensor:
        """Hidden states [size, hidden] for the padded batch already written to the buffers."""
        graph = self.graphs.get(size)
        if graph is None:  # not captured (CPU): the same padded batch, eagerly
            return self._forward(size)
        graph.replay()
        return self.outputs[size]
