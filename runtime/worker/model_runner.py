"""ModelRunner: owns the model and its KV cache, and turns a SchedulerOutput into sampled tokens.

Per step the BatchBuilder writes the scheduled requests' inputs (input_ids, positions,
slot_mapping, block_tables, seq_lens, query_start_loc) into persistent buffers with one host to
device copy. A decode step (one token per request) is padded to a captured batch size and
replayed as a CUDA graph. A mixed step of up to max_mixed_graph_tokens tokens is padded to a token
bucket and replayed piecewise, attention eagerly between the graphs (piecewise_graphs.py); a
larger one runs eagerly over views of the same buffers. Logits are
computed only for rows that end a request's known tokens (plus prompt rows asked for prompt
logprobs), and the sampler reads back nothing but the sampled ids.

`launch` enqueues the step and starts a non-blocking copy of the sampled ids into pinned host
memory; `PendingStep.wait` is the step's one wait on the GPU. Between the two the engine does the
previous step's host work (detokenization, outputs) while the GPU runs this one, and may launch
the next decode step ahead, fed on the device with this step's sampled ids.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import torch

from pagoda.kernels import ops
from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.outputs import TokenLogprobs
from pagoda.runtime.core.request import Request
from pagoda.runtime.core.scheduler import SchedulerOutput
from pagoda.runtime.engine_args import moe_tile_config
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.worker.attention_context import AttentionContext, attention_context
from pagoda.runtime.worker.cuda_graphs import DecodeGraphs, capture_sizes, padded_size
from pagoda.runtime.worker.host_to_device import index_on, positions_in
from pagoda.runtime.worker.input_batch import BatchBuilder, InputBuffers, StepBatch, batch_order
from pagoda.runtime.worker.model_loader import TORCH_DTYPES, kv_cache_torch_dtype, load_model
from pagoda.runtime.worker.piecewise_graphs import MixedStepGraphs, mixed_capture_sizes, padded_tokens
from pagoda.runtime.worker.pooler import Pooler
from pagoda.runtime.worker.sampler import Sampler, gather_logprobs
from pagoda.runtime.worker.st_dense import dense_projection

logger = logging.getLogger(__name__)
_REQUEST = attrgetter("request")


@dataclass(slots=True)
class ModelRunnerOutput:
    # The rows that sampled, in row order, and their tokens (filled by PendingStep.wait).
    sampled_requests: list[Request] = field(default_factory=list)
    sampled_tokens: list[int] = field(default_factory=list)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    pooled: dict[str, np.ndarray] = field(default_factory=dict)  # pooling runner: finished prompts' vectors


@dataclass(slots=True)
class PendingStep:
    """A launched step whose sampled ids may still be on their way to the host."""

    out: ModelRunnerOutput
    requests: list[Request] = field(default_factory=list)  # the sampled rows, in order
    token_ids: torch.Tensor | None = None  # host tensor, complete once `done` has fired
    done: torch.cuda.Event | None = None
    device_token_ids: torch.Tensor | None = None  # the same ids on the device, for a step ahead
    sample_later: object | None = None  # deferred sampling (SchedulerOutput.defer_sampling)
    pooled: tuple[list[str], torch.Tensor] | None = None  # pooling runner: ids, vectors on the device

    def sample(self) -> None:
        """Enqueue a deferred sampling now; the matchers have seen the step before's tokens."""
        if self.sample_later is not None:
            sample_later, self.sample_later = self.sample_later, None
            sample_later()

    def wait(self) -> ModelRunnerOutput:
        self.sample()
        if self.token_ids is not None:
            if self.done is not None:
                self.done.synchronize()
            self.out.sampled_requests, self.out.sampled_tokens = self.requests, self.token_ids.tolist()
            self.token_ids = None
        if self.pooled is not None:
            (ids, vectors), self.pooled = self.pooled, None
            self.out.pooled.update(zip(ids, vectors.cpu().numpy()))
        return self.out


class ModelRunner:
    supports_ahead = True  # launch() can feed a step's input ids from the previous step's samples

    def __init__(
        self,
        model_config: ModelConfig,
        device: torch.device,
        load_format: str,
        seed: int,
        *,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        enforce_eager: bool = False,
        enable_gemv: bool = True,
        fused_rope_kv: bool = True,
        enable_pdl: bool = True,
        fold_gemv: bool = True,
        fold_residual: bool = False,
        gemv_tma: bool = False,
        fold_rope_kv: bool = True,
        moe_tile: str | None = None,
        gemm_glu: bool = False,
        pooling_type: str | None = None,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        mixed_step_graphs: bool = False,
        max_mixed_graph_tokens: int = 512,
    ):
        # once, before any kernel
        ops.configure(enable_gemv=enable_gemv, fused_rope_kv=fused_rope_kv, pdl=enable_pdl, fold_gemv=fold_gemv,
                      fold_residual=fold_residual, gemv_tma=gemv_tma, fold_rope_kv=fold_rope_kv,
                      moe_tile=moe_tile_config(moe_tile), gemm_glu=gemm_glu, device=device)
        self.model_config = model_config
        self.device = device
        self.dtype = TORCH_DTYPES[model_config.dtype]
        self.kv_cache_dtype = kv_cache_torch_dtype(kv_cache_dtype, self.dtype)
        torch.manual_seed(seed)
        self.model = load_model(model_config, device, load_format, seed, pooling=pooling_type is not None,
                                quantization=quantization)
        # The pooling runner (--runner pooling) pools hidden states instead of sampling.
        self.pooler = Pooler(pooling_type, dense_projection(model_config.path, device)) \
            if pooling_type is not None else None
        self.sampler = Sampler(model_config.vocab_size, device, seed)
        self.max_num_seqs = max_num_seqs
        self.max_num_tokens = max(max_num_batched_tokens, max_num_seqs)
        self.enforce_eager = enforce_eager
        # Decode batches are padded to these sizes; on CUDA each one is a captured graph.
        self.graph_sizes = [] if enforce_eager else capture_sizes(max_num_seqs)
        # Mixed (prefill + decode) steps are padded to these token counts; on CUDA each one is a
        # set of piecewise graphs. Off for tensor-parallel ranks, whose steps come over a channel.
        use_mixed = mixed_step_graphs and not enforce_eager
        self.mixed_sizes = mixed_capture_sizes(min(max_mixed_graph_tokens, self.max_num_tokens)) if use_mixed else []
        self.mixed_graphs: MixedStepGraphs | None = None
        self.kv_cache: torch.Tensor | None = None
        self.block_size = 16
        self.buffers: InputBuffers | None = None
        self.builder: BatchBuilder | None = None
        self.graphs: DecodeGraphs | None = None
        # Landing places of the sampled ids, used in turn: with a step scheduled ahead, step N + 1
        # is launched before step N's ids are read.
        pin = device.type == "cuda"
        self.sampled_host = [torch.zeros(max_num_seqs, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self.sampled_done = [torch.cuda.Event() if pin else None for _ in range(2)]
        self.sampled_turn = 0
        # Called with each step's staged batch before its forward pass; the tensor-parallel
        # executor sends the stage to the other ranks from here (worker/distributed/executor.py).
        self.on_staged: Callable[[StepBatch], None] | None = None

    def weight_bytes(self) -> int:
        seen, total = set(), 0
        for p in self.model.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel() * p.element_size()
        return total

    def _bind_kv_cache(self, num_blocks: int, block_size: int) -> None:
        cfg = self.model_config
        layers = self.model.attention_layers()
        kv_heads = layers[0].num_kv_heads
        shape = (2, len(layers), num_blocks, block_size, kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
        self.block_size = block_size
        for i, layer in enumerate(layers):
            layer.k_cache, layer.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """Bind the pool, make the persistent input buffers and, on CUDA, capture the graphs."""
        self._bind_kv_cache(num_blocks, block_size)
        max_len = self.model_config.max_model_len
        max_blocks = -(-max_len // block_size)
        self.buffers = InputBuffers(self.max_num_tokens, self.max_num_seqs, max_blocks, self.device)
        self.builder = BatchBuilder(self.buffers, block_size)
        if self.graph_sizes:
            self.graphs = DecodeGraphs(self.model, self.buffers, self.graph_sizes, max_len)
            if self.device.type == "cuda":
                self.graphs.capture()
        if self.mixed_sizes:
            self.mixed_graphs = MixedStepGraphs(self.model, self.buffers, self.mixed_sizes)
            if self.device.type == "cuda":
                self.mixed_graphs.capture()

    @torch.inference_mode()
    def profile_peak_activation_bytes(self, num_tokens: int, max_model_len: int) -> int:
        """Run one forward of num_tokens (in sequences of at most max_model_len) and a worst-case
        sampling of max_num_seqs rows on a scratch KV cache, and return the peak memory they
        needed beyond the weights and that cache. With CUDA graphs, add what capturing them all
        keeps (_profile_graphs)."""
        if self.device.type != "cuda":
            return 0
        dev = self.device
        seq_len = min(num_tokens, max_model_len)
        num_seqs = -(-num_tokens // seq_len)
        blocks_per_seq = -(-seq_len // 16)
        self._bind_kv_cache(num_seqs * blocks_per_seq, 16)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ids = torch.zeros(num_seqs * seq_len, dtype=torch.long, device=dev)
        positions = torch.arange(seq_len, device=dev).repeat(num_seqs)
        tables = torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32, device=dev)
        ctx = AttentionContext(
            slot_mapping=torch.arange(num_seqs * seq_len, device=dev)
            .view(num_seqs, seq_len)
            .add(torch.arange(num_seqs, device=dev)[:, None] * (blocks_per_seq * 16 - seq_len))
            .flatten(),
            block_tables=tables.view(num_seqs, blocks_per_seq),
            seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=dev),
            query_start_loc=torch.arange(0, num_seqs + 1, dtype=torch.int32, device=dev) * seq_len,
            max_query_len=seq_len,
            max_seq_len=seq_len,
        )
        with attention_context(ctx):
            hidden = self.model(ids, positions)
        rows = torch.arange(self.max_num_seqs, device=dev) % hidden.shape[0]
        if self.pooler is None:
            self._profile_sampling(self.model.compute_logits(hidden[rows]))
        del hidden
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        graph_peak = self._profile_graphs(max_model_len) if self.graph_sizes or self.mixed_sizes else 0
        self.kv_cache = None
        for layer in self.model.attention_layers():
            layer.k_cache = layer.v_cache = torch.empty(0)
        torch.cuda.empty_cache()
        logger.info("profiled activations: %.0f MiB eager, %.0f MiB for CUDA graphs",
                    peak / 2**20, graph_peak / 2**20)
        return int(peak + graph_peak)

    def _profile_sampling(self, logits: torch.Tensor) -> None:
        n, dev = logits.shape[0], logits.device
        ops.sample(
            logits,
            torch.ones(n, device=dev),
            torch.full((n,), 50, dtype=torch.int64, device=dev),
            torch.full((n,), 0.9, device=dev),
            torch.full((n,), 0.05, device=dev),
            torch.zeros(n, dtype=torch.int64, device=dev),
            torch.zeros(n, dtype=torch.int64, device=dev),
            need_cutoffs=True,
        )

    def _profile_graphs(self, max_model_len: int) -> int:
        """Capture every graph once, over the scratch cache, and return the memory the capture
        kept: the graph pools (with each bucket's live outputs) and the graph executables. Both
        grow with the number of buckets, which no single forward's peak shows (99 decode buckets
        of the 8B model keep about 1.5 GiB). The graphs are freed again; the real ones are
        captured over the KV pool sized with this number, as vLLM's memory profiler does."""
        buffers = InputBuffers(self.max_num_tokens, self.max_num_seqs, -(-max_model_len // 16), self.device)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free_before = torch.cuda.mem_get_info()[0]
        graphs: list = []
        if self.graph_sizes:
            graphs.append(DecodeGraphs(self.model, buffers, self.graph_sizes, max_model_len))
        if self.mixed_sizes:
            graphs.append(MixedStepGraphs(self.model, buffers, self.mixed_sizes))
        for g in graphs:
            g.capture()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # what the warm-up forwards cached outside the pools
        used = free_before - torch.cuda.mem_get_info()[0]
        del graphs, g
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return max(0, int(used))

    def _forward(
        self, sched: SchedulerOutput, kv: KVCacheManager, previous: PendingStep | None
    ) -> tuple[StepBatch, torch.Tensor]:
        num_seqs = len(sched.scheduled)
        # One query token per request (a step scheduled ahead is one by construction: no sum).
        is_decode = sched.ahead or sched.total_num_tokens == num_seqs
        pad = padded_size(num_seqs, self.graph_sizes) if is_decode and self.graphs else None
        bucket = None
        if pad is None and self.mixed_graphs is not None:
            bucket = padded_tokens(sched.total_num_tokens, self.mixed_sizes)
        batch = self.builder.build(sched, kv, pad, bucket)
        if self.pooler is not None:
            batch.sample_requests = []  # nothing is sampled (tensor-parallel ranks see it too)
        if self.on_staged is not None:
            self.on_staged(batch)
        if sched.ahead:
            self._feed_in_flight_tokens(sched, previous)
        elif batch.fed_requests:
            self._feed_rows(batch.fed_rows, batch.fed_requests, previous)
        if pad is not None:
            return batch, self.graphs.run(pad)
        if bucket is not None:
            ctx = self._context(batch.num_tokens, batch.num_seqs, batch.max_query_len, batch.max_seq_len,
                                batch.num_decode_seqs)
            ctx.num_tokens = batch.num_tokens
            return batch, self.mixed_graphs.run(bucket, ctx)
        hidden = self.forward_eager(batch.num_tokens, batch.num_seqs, batch.max_query_len, batch.max_seq_len,
                                    batch.num_decode_seqs)
        return batch, hidden

    def _feed_in_flight_tokens(self, sched: SchedulerOutput, previous: PendingStep | None) -> None:
        """Input ids of a step scheduled ahead: the previous step's sampled ids, copied on the
        device (stream order puts the copy after the sampling that makes them)."""
        if previous is None or previous.device_token_ids is None:
            raise RuntimeError("a step scheduled ahead needs the launched step it follows")
        requests, src = list(map(_REQUEST, sched.scheduled)), previous.device_token_ids
        n = len(requests)
        if requests == previous.requests[:n]:  # the same rows in the same order (identity)
            self.buffers.input_ids[:n].copy_(src[:n])
        else:  # some requests finished in the previous step
            # Not a blocking copy: that would wait for the step in flight, the very wait that
            # scheduling ahead removes.
            self.buffers.input_ids[:n].copy_(src[index_on(src.device, positions_in(requests, previous.requests))])

    def _feed_rows(self, rows: np.ndarray, requests: list[Request], previous: PendingStep | None) -> None:
        """Input ids of the fed rows of a step scheduled ahead of a mixed one: each its request's
        sample in `previous`, copied on the device into that row."""
        if previous is None or previous.device_token_ids is None:
            raise RuntimeError("a step scheduled ahead needs the launched step it follows")
        src, n = previous.device_token_ids, len(requests)
        picked = positions_in(requests, previous.requests)
        if rows[-1] == n - 1 and picked == rows.tolist():  # (rows ascend: they are 0..n-1)
            self.buffers.input_ids[:n].copy_(src[:n])
        else:
            dev = src.device
            self.buffers.input_ids.index_copy_(0, index_on(dev, rows), src[index_on(dev, picked)])

    def forward_eager(
        self, num_tokens: int, num_seqs: int, max_query_len: int, max_seq_len: int, num_decode_seqs: int = 0
    ):
        """The model over the first num_tokens/num_seqs rows of the persistent buffers, no graph.
        Tensor-parallel workers call it too, so every rank runs the same forward."""
        ctx = self._context(num_tokens, num_seqs, max_query_len, max_seq_len, num_decode_seqs)
        with attention_context(ctx):
            return self.model(self.buffers.input_ids[:num_tokens], self.buffers.positions[:num_tokens])

    def _context(self, num_tokens: int, num_seqs: int, max_query_len: int, max_seq_len: int,
                 num_decode_seqs: int) -> AttentionContext:
        """The attention metadata of the step in the buffers: views of their first rows."""
        b, t, s = self.buffers, num_tokens, num_seqs
        return AttentionContext(
            slot_mapping=b.slot_mapping[:t],
            block_tables=b.block_tables[:s],
            seq_lens=b.seq_lens[:s],
            query_start_loc=b.query_start_loc[: s + 1],
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            num_decode_seqs=num_decode_seqs,
        )

    @torch.inference_mode()
    def launch(
        self, sched: SchedulerOutput, kv: KVCacheManager, previous: PendingStep | None = None
    ) -> PendingStep:
        """Enqueue the step's forward and sampling; the sampled ids come with `wait()`. A step
        scheduled ahead (sched.ahead) takes its input ids from `previous`, the step it follows."""
        batch, hidden = self._forward(sched, kv, previous)
        pending = PendingStep(ModelRunnerOutput())
        if self.pooler is not None:
            pending.pooled = self.pooler.pool(hidden, batch_order(sched.scheduled)[0])
            return pending
        out = pending.out
        to_sample = batch.sample_requests
        if to_sample:
            if batch.sample_all_rows:
                rows = hidden[: batch.num_seqs]
            else:
                rows = hidden[self.buffers.logits_indices[: len(to_sample)]]
            logits = self.model.compute_logits(rows)
            pending.requests = to_sample
            if sched.defer_sampling:
                # The previous step's tokens will be appended by then: none is pending any more.
                pending.sample_later = lambda: self._sample(pending, logits, 0)
            else:
                self._sample(pending, logits, batch.sample_pending if sched.mixed_ahead else int(sched.ahead))
        for r, row, first, last in batch.prompt_rows:
            out.prompt_logprobs[r.request_id] = self._prompt_logprobs(hidden, r, row, first, last)
        return pending

    @torch.inference_mode()  # a deferred sampling runs after launch() returned
    def _sample(self, pending: PendingStep, logits: torch.Tensor, num_pending: int | list[int]) -> None:
        """Sample the step's rows and start the copy of their ids to the host."""
        to_sample, out = pending.requests, pending.out
        tokens, logprobs = self.sampler.sample(logits, to_sample, pending=num_pending)
        if logprobs.count(None) != len(logprobs):  # (a C-level scan: most steps have none)
            for r, lp in zip(to_sample, logprobs):
                if lp is not None:
                    out.logprobs[r.request_id] = lp
        pending.device_token_ids = tokens
        turn = self.sampled_turn = self.sampled_turn ^ 1
        done = self.sampled_done[turn]
        if done is not None and tokens.is_cuda:
            host = self.sampled_host[turn][: len(to_sample)]
            host.copy_(tokens, non_blocking=True)
            done.record()
            pending.token_ids, pending.done = host, done
        else:
            pending.token_ids = tokens.cpu()

    def _prompt_logprobs(
        self, hidden: torch.Tensor, r: Request, row: int, first: int, last: int
    ) -> list[TokenLogprobs]:
        targets = r.prompt_token_ids[first:last]
        logits = self.model.compute_logits(hidden[row : row + len(targets)]).float()
        ids = torch.tensor(targets, device=logits.device)
        k = r.sampling_params.prompt_logprobs
        return gather_logprobs(torch.log_softmax(logits, dim=-1), ids, [k] * len(targets))
