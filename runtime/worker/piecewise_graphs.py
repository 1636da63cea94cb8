"""Piecewise CUDA graphs for mixed steps: the dense layers replayed, attention run between them.

Under serving load nearly every step carries a prefill chunk beside the decodes, so the decode
graphs (cuda_graphs.py) rarely replay, and an eager step launches every kernel from Python. Here a
step of up to max_tokens tokens is padded to a token bucket, and the model is captured as one
graph per stretch between two attention layers: embedding to layer 0's qkv, then o_proj + MLP +
the next layer's qkv, and so on. Attention runs eagerly between the replays, over the live batch
(any mix of decodes and chunks, any lengths), so one capture per bucket serves every step of that
many tokens. This is vLLM's PIECEWISE mode, with the split made by the attention layer itself
(see GraphSplitter) instead of a compiler pass.

Each split ends its graph by copying q, k and v into static buffers shared by every layer and
bucket. Holding the graph's own q, k, v tensors instead would keep one set alive per layer and
bucket, gigabytes for 48 buckets of a 32-layer model. Padding rows (past the step's real tokens)
carry token 0 at position 0; attention skips them (AttentionContext.num_tokens), and the dense
layers treat rows independently, so they change no real row.

On the CPU nothing is captured and `run` executes the padded step eagerly, so the CPU tests
exercise the same padding and the same slicing in attention.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass

import torch

from pagoda.runtime.worker.attention_context import AttentionContext, attention_context, graph_splitter
from pagoda.runtime.worker.input_batch import InputBuffers

logger = logging.getLogger(__name__)


def mixed_capture_sizes(max_tokens: int) -> list[int]:
    """Token buckets: every multiple of 8 up to 256 and of 16 up to 512 (vLLM's spacing: a padded
    step computes at most 15 rows it throws away), then eight per doubling (576, 640, ... 1024,
    1152, ...: at most 1/8 of a big step is padding), and max_tokens itself, the size of every
    step that fills the token budget."""
    sizes = list(range(8, min(max_tokens, 256) + 1, 8)) + list(range(272, min(max_tokens, 512) + 1, 16))
    octave = 512
    while octave < max_tokens:
        step = octave // 8
        sizes += list(range(octave + step, min(max_tokens, 2 * octave) + 1, step))
        octave *= 2
    if max_tokens >= 2 and (not sizes or sizes[-1] != max_tokens):
        sizes.append(max_tokens)
    return sizes


def padded_tokens(num_tokens: int, sizes: list[int]) -> int | None:
    """The smallest bucket that holds num_tokens, or None when the step is larger than every one."""
    i = bisect.bisect_left(sizes, num_tokens)
    return sizes[i] if i < len(sizes) else None


@dataclass(slots=True)
class Split:
    """One attention layer between two graphs: its layer, and the static tensors it reads."""

    layer: torch.nn.Module
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    cos_sin_cache: torch.Tensor
    out: torch.Tensor


class StaticTensors:
    """Buffers of up to max_rows rows, one per (role, row shape, dtype), shared by every layer and
    bucket: replays run one at a time, and each layer is done with them before the next writes."""

    def __init__(self, max_rows: int, device: torch.device):
        self.max_rows, self.device = max_rows, device
        self.buffers: dict[tuple, torch.Tensor] = {}

    def get(self, role: str, rows: int, row_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        key = (role, row_shape, dtype)
        if key not in self.buffers:
            self.buffers[key] = torch.zeros(self.max_rows, *row_shape, dtype=dtype, device=self.device)
        return self.buffers[key][:rows]


class GraphSplitter:
    """Set (attention_context.graph_splitter) while a bucket is warmed up or captured. Attention
    calls `split` instead of attending; capturing, it ends the current graph there and begins the
    next one in the same memory pool."""

    def __init__(self, static: StaticTensors, pool=None, capture: bool = False):
        self.static, self.pool, self.capture = static, pool, capture
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.splits: list[Split] = []

    def begin(self) -> None:
        self.graphs.append(torch.cuda.CUDAGraph())
        self.graphs[-1].capture_begin(pool=self.pool)

    def end(self) -> None:
        self.graphs[-1].capture_end()

    def split(self, layer, q, k, v, positions, cos_sin_cache) -> torch.Tensor:
        rows = q.shape[0]
        static = [self.static.get(name, rows, tuple(t.shape[1:]), t.dtype)
                  for name, t in (("q", q), ("k", k), ("v", v), ("positions", positions))]
        for dst, src in zip(static, (q, k, v, positions)):
            dst.copy_(src)
        out = self.static.get("out", rows, (layer.num_heads * layer.head_dim,), q.dtype)
        if self.capture:
            self.end()
            self.splits.append(Split(layer, *static, cos_sin_cache, out))
            self.begin()
        return out


class MixedStepGraphs:
    """Captured piecewise forwards, keyed by padded token count. Like the decode graphs, they are
    captured once the KV cache is bound."""

    def __init__(self, model: torch.nn.Module, buffers: InputBuffers, sizes: list[int]):
        self.model, self.buffers, self.sizes = model, buffers, sizes
        self.static = StaticTensors(sizes[-1] if sizes else 0, buffers.device)
        self.pieces: dict[int, tuple[list[torch.cuda.CUDAGraph], list[Split], torch.Tensor]] = {}
        self.pool = None

    def _model(self, size: int) -> torch.Tensor:
        return self.model(self.buffers.input_ids[:size], self.buffers.positions[:size])

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first, into one pool. A model whose dense code cannot be
        captured (a host sync, say) keeps running mixed steps eagerly, with a warning."""
        t0 = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for size in sorted(self.sizes, reverse=True):
                try:
                    self.pieces[size] = self._capture(size)
                except RuntimeError as error:  # a host sync in the dense code, say
                    logger.warning("mixed steps run eagerly: their CUDA graphs could not be captured (%s)", error)
                    self.pieces.clear()
                    break
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        if self.pieces:
            used = free_before - torch.cuda.mem_get_info()[0]
            graphs = sum(len(p[0]) for p in self.pieces.values())
            logger.info("captured mixed-step graphs for %d token buckets (%d..%d, %d graphs) in %.1f s, "
                        "using %.0f MiB", len(self.pieces), self.sizes[0], self.sizes[-1], graphs,
                        time.perf_counter() - t0, used / 2**20)

    def _capture(self, size: int) -> tuple[list[torch.cuda.CUDAGraph], list[Split], torch.Tensor]:
        # Warm-up outside the capture, as torch recommends (Triton builds, cuBLAS workspaces);
        # attention is skipped, so no batch context is needed.
        with graph_splitter(GraphSplitter(self.static)):
            self._model(size)
        splitter = GraphSplitter(self.static, self.pool, capture=True)
        splitter.begin()
        try:
            with graph_splitter(splitter):
                hidden = self._model(size)
                # The last graph ends by copying its output into a buffer every bucket shares, so
                # the pool keeps no output per bucket (128 MiB at 16k tokens of the 8B model).
                final = self.static.get("hidden", size, tuple(hidden.shape[1:]), hidden.dtype)
                final.copy_(hidden)
        finally:
            splitter.end()
        return splitter.graphs, splitter.splits, final

    def run(self, size: int, ctx: AttentionContext) -> torch.Tensor:
        """Hidden states [size, hidden] of the padded step already written to the buffers; ctx
        describes its real sequences (ctx.num_tokens real rows)."""
        pieces = self.pieces.get(size)
        with attention_context(ctx):
            if pieces is None:  # not captured (CPU, or a capture error): the padded step, eagerly
                return self._model(size)
            graphs, splits, hidden = pieces
            for graph, s in zip(graphs, splits):
                graph.replay()
                s.layer.attend(s.q, s.k, s.v, s.positions, s.cos_sin_cache, out=s.out)
            graphs[-1].replay()
        return hidden
