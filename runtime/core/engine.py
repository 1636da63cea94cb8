"""LLMEngine: the synchronous engine core under both `LLM` and the server.

add_request / abort_request / step. Each step schedules, runs one forward pass, samples, applies
stops and returns a cumulative RequestOutput for every request that progressed.

The RequestOutputs of a step's tokens are built during the next step, after its GPU work is
launched and before its sampled ids are read back, so that host work (detokenization, output
objects) overlaps the GPU; a step with nothing to schedule builds them at once. With async
scheduling, a decode step whose successor is predictable also launches that successor before it
reads its own tokens (Scheduler.schedule_ahead), so the GPU always has the next step queued. A request's first
token is reported at once: time to first token is what a waiting client feels. Everything that
decides scheduling (token-level stops, stop strings) still happens before the next schedule.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass

import torch

from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.request import Request, RequestStatus
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.output_processor import OutputProcessor
from pagoda.runtime.frontend.outputs import RequestMetrics, RequestOutput
from pagoda.runtime.frontend.tokenizer import load_tokenizer
from pagoda.runtime.layers.parallel_state import kv_heads_per_rank
from pagoda.runtime.memory import MemoryPlan, check_fits, plan_memory
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.sampling_params import SamplingParams
from pagoda.runtime.worker.distributed.executor import build_executor
from pagoda.runtime.worker.model_loader import resolve_model_path

logger = logging.getLogger(__name__)

CPU_KV_BUDGET_BYTES = 4 * 1024**3  # ceiling for the CPU pool when num_kv_blocks is not given


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    kv_capacity_tokens: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens: int
    generation_tokens: int


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class LLMEngine:
    def __init__(self, args: EngineArgs):
        self.args = args
        path = resolve_model_path(args.model)
        self.model_config = ModelConfig.from_path(path, args.dtype, args.max_model_len)
        self.tokenizer = load_tokenizer(
            resolve_model_path(args.tokenizer) if args.tokenizer else path, args.chat_template
        )
        self.device = resolve_device(args.device)
        if args.max_num_seqs is None:
            args = self.args = dataclasses.replace(args, max_num_seqs=default_max_num_seqs(self.device))
        max_len = self.model_config.max_model_len
        self.max_num_batched_tokens = args.max_num_batched_tokens or default_token_budget(args, self.device)
        # A ModelRunner, or with tensor_parallel_size > 1 an executor that stands in for rank 0's
        # runner and drives the other ranks' processes.
        self.runner = build_executor(self.model_config, self.device, args, self.max_num_batched_tokens)
        self.memory_plan = self._plan_memory()
        check_fits(self.memory_plan)
        self.runner.allocate_kv_cache(self.memory_plan.num_kv_blocks, args.block_size)
        self.kv_cache_manager = KVCacheManager(
            self.memory_plan.num_kv_blocks, args.block_size, args.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.kv_cache_manager, args.max_num_seqs, self.max_num_batched_tokens, max_len
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self.eos_token_id = self.tokenizer.eos_token_id
        if self.eos_token_id is None and self.model_config.eos_token_ids:
            self.eos_token_id = self.model_config.eos_token_ids[0]
        # Further EOS ids from generation_config.json (Llama 3's <|eot_id|>) stop like stop_token_ids.
        self.extra_eos_ids = [t for t in self.model_config.eos_token_ids if t != self.eos_token_id]
        self._pending: list[RequestOutput] = []
        # User requests that progressed in the last step, whose outputs are still to be built.
        self._deferred: list[str] = []
        self._deferred_time = 0.0
        self._deferred_final_only = False
        # The step scheduled ahead and launched, whose tokens are read by the next step() call.
        self._in_flight: tuple | None = None
        # Only a single-process runner can feed a step from the device ids of the one before.
        self.async_scheduling = args.async_scheduling and getattr(self.runner, "supports_ahead", False)
        logger.info("memory plan: %s", self.memory_plan.to_dict())

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args)

    def _plan_memory(self) -> MemoryPlan:
        args, cfg = self.args, self.model_config
        # Per rank: weights are this rank's shard, the KV cache holds this rank's KV heads.
        tp = args.tensor_parallel_size
        kv_heads = kv_heads_per_rank(cfg.num_kv_heads, tp)
        common = dict(
            config={**cfg.hf_config, "num_key_value_heads": kv_heads, "num_attention_heads": cfg.num_heads,
                    "head_dim": cfg.head_dim},
            dtype_bytes=cfg.dtype_bytes,
            max_model_len=cfg.max_model_len,
            block_size=args.block_size,
            weight_bytes=self.runner.weight_bytes(),
        )
        if self.device.type == "cuda":
            _, total = torch.cuda.mem_get_info(self.device)
            activations = self.runner.profile_peak_activation_bytes(
                self.max_num_batched_tokens, cfg.max_model_len
            )
            return plan_memory(
                total_memory_bytes=total,
                gpu_memory_utilization=args.gpu_memory_utilization,
                activation_bytes=activations,
                num_kv_blocks=args.num_kv_blocks,
                **common,
            )
        plan = plan_memory(total_memory_bytes=_host_memory_bytes(), gpu_memory_utilization=1.0, **common)
        if args.num_kv_blocks is None:
            # Enough for every sequence at full length, within a fixed slice of host memory.
            demand = -(-args.max_num_seqs * cfg.max_model_len // args.block_size)
            budget = min(CPU_KV_BUDGET_BYTES, plan.usable_bytes // 4) // plan.block_bytes
            num_blocks = max(min(demand, budget), 1)
        else:
            num_blocks = args.num_kv_blocks
        return plan_memory(
            total_memory_bytes=_host_memory_bytes(),
            gpu_memory_utilization=1.0,
            num_kv_blocks=num_blocks,
            **common,
        )

    def shutdown(self) -> None:
        """Stop tensor-parallel worker processes, if any (also done when the engine is dropped)."""
        shutdown = getattr(self.runner, "shutdown", None)
        if shutdown is not None:
            shutdown()

    # ---- requests -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        params = params or SamplingParams()
        max_len = self.model_config.max_model_len
        if request_id in self.output_processor.states:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if not _valid_token_ids(prompt_token_ids, self.model_config.vocab_size):
            raise ValueError(f"prompt token ids must be in [0, {self.model_config.vocab_size})")
        num_prompt = len(prompt_token_ids)
        max_tokens = params.max_tokens if params.max_tokens is not None else max_len - num_prompt
        if num_prompt + max(max_tokens, 1) > max_len:
            raise ValueError(
                f"this request needs {num_prompt} prompt tokens + {max_tokens} max_tokens = "
                f"{num_prompt + max_tokens} tokens, more than max_model_len={max_len}; "
                "shorten the prompt or lower max_tokens"
            )
        if self.extra_eos_ids and not params.ignore_eos:
            params = params.clone(stop_token_ids=params.stop_token_ids + self.extra_eos_ids)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        children = [
            Request(
                request_id=request_id if params.n == 1 else f"{request_id}#{i}",
                prompt_token_ids=list(prompt_token_ids),
                sampling_params=params,
                eos_token_id=self.eos_token_id,
                max_tokens=max_tokens,
                block_size=self.args.block_size,
                parent_id=request_id,
                index=i,
                arrival_time=arrival,
            )
            for i in range(params.n)
        ]
        self.output_processor.add_request(prompt, children, RequestMetrics(arrival_time=arrival))
        for child in children:
            self.scheduler.add_request(child)

    def abort_request(self, request_ids: list[str] | str) -> None:
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        now = time.monotonic()
        for request_id in request_ids:
            state = self.output_processor.states.get(request_id)
            if state is None:
                continue
            for child in state.children:
                if not child.is_finished:
                    self.scheduler.finish_request(child, RequestStatus.FINISHED_ABORTED)
            self._pending.append(self.output_processor.make_output(request_id, now))

    def has_unfinished_requests(self) -> bool:
        return (bool(self.output_processor.states) or bool(self._pending) or bool(self._deferred)
                or self._in_flight is not None)

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor.states)

    # ---- the step -------------------------------------------------------------------------

    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """One engine step. final_only: the caller reads only finished outputs (LLM.generate),
        so unfinished requests get no RequestOutput (and no detokenization) this step."""
        outputs, self._pending = self._pending, []
        if self._in_flight is not None:  # launched ahead by the previous call
            (sched, pending), self._in_flight = self._in_flight, None
        else:
            sched = self.scheduler.schedule()
            if sched.is_empty():
                return outputs + self._emit_deferred()
            pending = self.runner.launch(sched, self.kv_cache_manager)
        if self.async_scheduling:
            # Queue the next decode step behind this one before reading this one's tokens, so the
            # GPU does not idle through the host work between steps.
            ahead = self.scheduler.schedule_ahead(sched)
            if ahead is not None:
                self._in_flight = (ahead, self.runner.launch(ahead, self.kv_cache_manager, pending))
        late = self._emit_deferred()  # the previous step's outputs, while the GPU runs this one
        result = pending.wait()
        for request_id, entries in result.prompt_logprobs.items():
            self.output_processor.add_prompt_logprobs(self.scheduler.requests[request_id], entries)
        updated = self.scheduler.update_from_output(sched, result.sampled)
        now = time.monotonic()
        stopped, touched = self.output_processor.process_tokens(updated, result.logprobs, now)
        for request in stopped:
            self.scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED)
        # A first token is reported now (time to first token is what a waiting client feels),
        # unless the request already has an output in this step (a later child of n > 1);
        # everything else next step. So each step's tokens reach the caller exactly once, and
        # each request appears at most once per step.
        first = {r.parent_id for r in updated if r.num_output_tokens == 1}
        if first:
            first.difference_update(o.request_id for o in late)
        outputs += late
        deferred = []
        for request_id in touched:
            if request_id not in first:
                deferred.append(request_id)
            elif not final_only or self.output_processor.states[request_id].finished:
                outputs.append(self.output_processor.make_output(request_id, now))
        self._deferred = deferred
        self._deferred_time, self._deferred_final_only = now, final_only
        return outputs

    def _emit_deferred(self) -> list[RequestOutput]:
        outputs, (deferred, self._deferred) = [], (self._deferred, [])
        states, now = self.output_processor.states, self._deferred_time
        for request_id in deferred:
            state = states.get(request_id)
            if state is None:
                continue  # aborted since: abort_request already gave its final output
            if self._deferred_final_only and not state.finished:
                continue
            outputs.append(self.output_processor.make_output(request_id, now))
        return outputs

    def stats(self) -> EngineStats:
        kv = self.kv_cache_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=kv.usage(),
            kv_capacity_tokens=self.memory_plan.kv_capacity_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            prompt_tokens=self.output_processor.prompt_tokens,
            generation_tokens=self.output_processor.generation_tokens,
        )

    def get_tokenizer(self):
        return self.tokenizer


def _big_gpu(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_properties(device).total_memory >= 70 * 2**30


def default_max_num_seqs(device: torch.device) -> int:
    """Seats when the user gives none, as vLLM picks them: 1024 on a GPU of 70 GiB or more, else 256.
    A big GPU's KV pool holds far more than 256 sequences of chat length; with only 256 seats, a
    queue longer than that admits one prompt per finished request, so nearly every step mixes a
    small prefill into the decode batch and the decode batch never grows past 256."""
    return 1024 if _big_gpu(device) else 256


def default_token_budget(args: EngineArgs, device: torch.device) -> int:
    """Tokens per step when the user gives none, as vLLM picks them: 16k for offline batches on a
    GPU of 70 GiB or more (half as many prefill steps; W1 measured +4.8% on the H200), else 8k,
    which keeps a server's decode steps short while prompts are prefilled beside them."""
    budget = 16384 if args.usage_context == "llm_class" and _big_gpu(device) else 8192
    return max(budget, args.max_num_seqs)


def _valid_token_ids(token_ids: list[int], vocab_size: int) -> bool:
    # min/max and a type scan in C: a per-token generator costs ~0.2 ms per 1k-token prompt.
    if not all(map(int.__instancecheck__, token_ids)):
        return False
    return 0 <= min(token_ids) and max(token_ids) < vocab_size


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 1024**3
