"""EngineCore: the scheduler, the KV cache and the model runner, stepped together. No tokenizer.

add_request / abort_requests / step. Each step schedules, launches one forward pass and sampling,
reads the sampled ids back, applies token-level stops (EOS, stop token ids, lengths) and returns
one EngineCoreOutput per request that progressed: new token ids and logprobs, never text. Text,
stop strings and RequestOutputs are the frontend's (pagoda.runtime.frontend); a stop string it
finds comes back as an abort.

With async scheduling, a decode step whose successor is predictable also launches that successor
before it reads its own tokens (Scheduler.schedule_ahead), so the GPU always has the next step
queued. `step(overlap=...)` runs the caller's host work (the in-process frontend's processing of
the previous step's outputs) while this step runs on the GPU, before anything is scheduled ahead:
a stop string it finds then costs the request at most the one token in flight.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.outputs import EngineCoreOutput, EngineStats
from pagoda.runtime.core.request import FINISH_REASONS, Request, RequestStatus
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.core.structured_outputs import StructuredOutputManager
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.layers.parallel_state import kv_heads_per_rank
from pagoda.runtime.memory import MemoryPlan, check_fits, plan_memory
from pagoda.runtime.model_config import ModelConfig, resolve_model_path
from pagoda.runtime.pooling_config import pooler_config_for, prefix_caching_for
from pagoda.runtime.sampling_params import SamplingParams
from pagoda.runtime.worker.compile_watch import WATCH
from pagoda.runtime.worker.executor import build_executor

FINISHED = RequestStatus.FINISHED_STOPPED  # a status at or past it has ended the request

logger = logging.getLogger(__name__)

CPU_KV_BUDGET_BYTES = 4 * 1024**3  # ceiling for the CPU pool when num_kv_blocks is not given


@dataclass(slots=True)
class EngineCoreRequest:
    """One sequence as the frontend hands it over: validated, its limits resolved. A user
    request with n > 1 arrives as n of these (children), which share the prompt's KV blocks."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    max_tokens: int  # the params' max_tokens, or what max_model_len leaves
    arrival_time: float
    parent_id: str = ""
    index: int = 0  # which of the n completions this is
    # Records only for its first token and its end (the end's record carries every token after the
    # first). The in-process LLM frontend asks for this when it wants one final output, keeps no
    # per-token clock and scans for no stop strings: its per-step records would only be appended
    # to a list, a row of work per running request per step (W4: 1,024 rows a step).
    quiet: bool = False


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class EngineCore:
    def __init__(self, args: EngineArgs):
        WATCH.install()
        WATCH.mark_starting()
        try:
            self._start(args)
        finally:
            WATCH.mark_started()

    def _start(self, args: EngineArgs) -> None:
        self.args = args
        path = resolve_model_path(args.model, args.revision)
        self.model_config = ModelConfig.from_path(path, args.dtype, args.max_model_len)
        self.device = resolve_device(args.device)
        if args.max_num_seqs is None:
            args = self.args = dataclasses.replace(args, max_num_seqs=default_max_num_seqs(self.device))
        max_len = self.model_config.max_model_len
        self.max_num_batched_tokens = args.max_num_batched_tokens or default_token_budget(args, self.device)
        # --runner pooling: prompts are pooled into embeddings instead of continued (pooling_config.py).
        self.pooler_config = pooler_config_for(args.runner, path, self.model_config.architecture, args.pooler_config)
        pooling_type = self.pooler_config.pooling_type if self.pooler_config else None
        # Local, or with tensor_parallel_size > 1 rank 0 of a tensor-parallel group (worker/executor.py).
        self.executor = build_executor(self.model_config, self.device, args, self.max_num_batched_tokens,
                                       pooling_type)
        self.memory_plan = self._plan_memory()
        check_fits(self.memory_plan)
        self.executor.allocate_kv_cache(self.memory_plan.num_kv_blocks, args.block_size)
        self.kv_cache_manager = KVCacheManager(
            self.memory_plan.num_kv_blocks, args.block_size, prefix_caching(args, pooling_type),
            sliding_window=self.memory_plan.sliding_window,
        )
        self.scheduler = Scheduler(
            self.kv_cache_manager, args.max_num_seqs, self.max_num_batched_tokens, max_len,
            args.long_prefill_token_threshold, mixed_ahead=args.schedule_mixed_ahead,
        )
        # The step scheduled ahead and launched, whose tokens are read by the next step() call.
        self._in_flight: tuple | None = None
        # Only a single-process runner can feed a step from the device ids of the one before.
        self.async_scheduling = args.async_scheduling and self.executor.supports_ahead and pooling_type is None
        self.structured_outputs = StructuredOutputManager(self.model_config.vocab_size)
        self.executor.runner.sampler.structured_outputs = self.structured_outputs  # it fills the bitmasks
        self.prompt_tokens = 0
        self.generation_tokens = 0
        logger.info("memory plan: %s", self.memory_plan.to_dict())
        if self.device.type == "cuda":
            # The Triton specializations a server meets, built now rather than in a user's step.
            from pagoda.runtime.core.warmup import warm_up

            warm_up(self)

    def _plan_memory(self) -> MemoryPlan:
        args, cfg = self.args, self.model_config
        # Per rank: weights are this rank's shard, the KV cache holds this rank's KV heads.
        tp = args.tensor_parallel_size
        kv_heads = kv_heads_per_rank(cfg.num_kv_heads, tp)
        common = dict(
            config={**cfg.hf_config, "num_key_value_heads": kv_heads, "num_attention_heads": cfg.num_heads,
                    "head_dim": cfg.head_dim},
            dtype_bytes=cfg.dtype_bytes,
            kv_dtype_bytes=1 if args.kv_cache_dtype != "auto" else cfg.dtype_bytes,
            max_model_len=cfg.max_model_len,
            block_size=args.block_size,
            weight_bytes=self.executor.weight_bytes(),
            max_num_batched_tokens=self.max_num_batched_tokens,
        )
        if self.device.type == "cuda":
            _, total = torch.cuda.mem_get_info(self.device)
            activations = self.executor.profile_peak_activation_bytes(
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
        self.structured_outputs.shutdown()
        self.executor.shutdown()

    # ---- requests -------------------------------------------------------------------------

    def init_structured_outputs(self, tokenizer_info_json: str) -> None:
        """xgrammar's view of the tokenizer, from the frontend (the core has no tokenizer)."""
        self.structured_outputs.init(tokenizer_info_json)

    def add_request(self, request: EngineCoreRequest) -> None:
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        params = request.sampling_params
        grammar = None
        if params.structured_outputs is not None:
            stops = ([] if request.eos_token_id is None else [request.eos_token_id]) + params.stop_token_ids
            grammar = self.structured_outputs.request_grammar(params.structured_outputs, stops)
        self.scheduler.add_request(Request(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            eos_token_id=request.eos_token_id,
            max_tokens=request.max_tokens,
            block_size=self.args.block_size,
            parent_id=request.parent_id,
            index=request.index,
            grammar=grammar,
            defer_hashes=True,
            quiet=request.quiet,
        ))

    def abort_requests(self, request_ids: list[str]) -> None:
        """Finish these requests and free their blocks; unknown or finished ids are ignored. An
        aborted request gets no further output: the frontend already knows how it ended."""
        requests = self.scheduler.requests
        for request_id in request_ids:
            request = requests.get(request_id)
            if request is not None:
                self.scheduler.finish_request(request, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return bool(self.scheduler.requests) or self._in_flight is not None

    # ---- the step -------------------------------------------------------------------------

    def step(self, overlap: Callable[[], None] | None = None, overlap_aborts: bool = True
             ) -> list[EngineCoreOutput]:
        """One engine step. overlap: host work to run while the step is on the GPU (it may
        abort requests; their rows in flight are dropped). overlap_aborts=False promises that it
        aborts nothing (no live request has a stop string): the step ahead is then launched
        before it runs, so the GPU never waits for it."""
        if self._in_flight is not None:  # launched ahead by the previous call
            (sched, pending), self._in_flight = self._in_flight, None
            pending.sample()  # deferred (grammars): their matchers have the last tokens now
        else:
            sched = self.scheduler.schedule()
            if sched.is_empty():
                if overlap is not None:
                    overlap()
                failed = self._failed_outputs()
                if not failed:
                    self._wait_for_grammars()
                return failed
            pending = self.executor.launch(sched, self.kv_cache_manager)
        if overlap is not None and overlap_aborts:
            overlap()  # first, so that an abort keeps its request out of the step ahead
            overlap = None
        if self.async_scheduling:
            # Queue the next decode step behind this one before reading this one's tokens, so the
            # GPU does not idle through the host work between steps.
            ahead = self.scheduler.schedule_ahead(sched)
            if ahead is not None:
                self._in_flight = (ahead, self.executor.launch(ahead, self.kv_cache_manager, pending))
        if overlap is not None:
            overlap()
        if self.scheduler.waiting:
            self.scheduler.hash_next_admissions()  # under this step's GPU time, not the next schedule's
        result = pending.wait()
        updated = self.scheduler.update_from_output(sched, result.sampled_requests, result.sampled_tokens)
        outputs = self._outputs(updated, result.logprobs, result.prompt_logprobs)
        if result.pooled:
            outputs += self._pooled_outputs(result.pooled)
        return outputs + self._failed_outputs()

    def unreported(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        """Records of the tokens quiet requests produced since their first (to hand the frontend
        before it aborts them: what the core produced is part of an aborted request's result)."""
        outputs = []
        for request_id in request_ids:
            r = self.scheduler.requests.get(request_id)
            if r is None or not r.quiet or len(r.output_token_ids) <= r.num_reported:
                continue
            new_ids, r.num_reported = r.output_token_ids[r.num_reported:], len(r.output_token_ids)
            outputs.append(EngineCoreOutput(request_id, new_ids, None, None, None, None, max(r.num_cached_tokens, 0),
                                            r.first_scheduled_time, r.num_preemptions))
        return outputs

    def _pooled_outputs(self, pooled: dict) -> list[EngineCoreOutput]:
        """Prompts the pooling runner finished this step: done after their prefill, with the vector."""
        outputs = []
        for request_id, vector in pooled.items():
            r = self.scheduler.requests.get(request_id)
            if r is None:
                continue  # aborted while its last chunk ran
            self.scheduler.finish_request(r, RequestStatus.FINISHED_STOPPED)
            self.prompt_tokens += r.num_prompt_tokens
            outputs.append(EngineCoreOutput(request_id, [], None, None, "stop", None, max(r.num_cached_tokens, 0),
                                            r.first_scheduled_time, r.num_preemptions, vector))
        return outputs

    def _failed_outputs(self) -> list[EngineCoreOutput]:
        """Requests whose grammar did not compile: they end "abort", with no tokens."""
        failed, self.scheduler.failed = self.scheduler.failed, []
        for r in failed:
            logger.error("request %s: its grammar did not compile: %s", r.request_id, r.grammar.error)
        return [EngineCoreOutput(r.request_id, [], None, None, "abort", None, 0, None, 0) for r in failed]

    def _wait_for_grammars(self) -> None:
        """Nothing could be scheduled: if requests wait on grammars, sleep on their compiles (a
        little, so commands are still drained) instead of spinning on empty steps."""
        compiling = [r.grammar for r in self.scheduler.waiting if r.grammar is not None]
        if compiling:
            self.structured_outputs.wait_for_compiles(compiling, timeout=0.05)

    def _outputs(self, updated: list[Request], logprobs: dict, prompt_logprobs: dict) -> list[EngineCoreOutput]:
        if not logprobs and not prompt_logprobs:
            return self._plain_outputs(updated)
        outputs = []
        append, reasons = outputs.append, FINISH_REASONS
        # Once per running request per step: no dict lookups unless the step has logprobs.
        for r in updated:
            new_ids = _new_token_ids(r)
            if new_ids is None:
                continue
            lp = logprobs.get(r.request_id) if logprobs else None
            plp = prompt_logprobs.pop(r.request_id, None) if prompt_logprobs else None
            if plp is not None:
                r.num_prompt_logprobs += len(plp)
            if r.index == 0 and len(r.output_token_ids) == 1:
                self.prompt_tokens += len(r.prompt_token_ids)
            cached = r.num_cached_tokens
            append(EngineCoreOutput(
                r.request_id, new_ids, None if lp is None else [lp], plp,
                reasons[r.status], r.stop_reason, cached if cached > 0 else 0, r.first_scheduled_time,
                r.num_preemptions,
            ))
        self.generation_tokens += len(updated)
        # Prompt logprobs of a prompt still being prefilled in chunks (no token sampled yet).
        for request_id, plp in prompt_logprobs.items():
            r = self.scheduler.requests.get(request_id)
            if r is None:
                continue
            r.num_prompt_logprobs += len(plp)
            outputs.append(EngineCoreOutput(
                request_id, [], None, plp, None, None, max(r.num_cached_tokens, 0), r.first_scheduled_time,
                r.num_preemptions,
            ))
        return outputs

    def _plain_outputs(self, updated: list[Request]) -> list[EngineCoreOutput]:
        """_outputs for a step without logprobs (most steps): the same records, built with
        tuple.__new__ (EngineCoreOutput's own __new__ is a Python function: a call per row)."""
        new, cls, reasons = tuple.__new__, EngineCoreOutput, FINISH_REASONS
        outputs = []
        append = outputs.append
        for r in updated:
            out = r.output_token_ids
            if len(out) == 1:
                if r.index == 0:
                    self.prompt_tokens += len(r.prompt_token_ids)
                new_ids = [out[0]]
                r.num_reported = 1
            elif not r.quiet:
                new_ids = [out[-1]]
            elif r.status < FINISHED:
                continue  # a quiet request's middle token: its end's record carries it
            else:
                new_ids, r.num_reported = out[r.num_reported:], len(out)
            cached = r.num_cached_tokens
            append(new(cls, (r.request_id, new_ids, None, None, reasons[r.status], r.stop_reason,
                             cached if cached > 0 else 0, r.first_scheduled_time, r.num_preemptions, None)))
        self.generation_tokens += len(updated)
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
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
        )


def _new_token_ids(r) -> list[int] | None:
    """The token ids a step's record for request r carries; None: no record (a quiet request's
    middle token). The generic _outputs path; _plain_outputs inlines the same rules."""
    out = r.output_token_ids
    if len(out) == 1:
        r.num_reported = 1
        return [out[0]]
    if not r.quiet:
        return [out[-1]]
    if r.status < FINISHED:
        return None
    new_ids, r.num_reported = out[r.num_reported:], len(out)
    return new_ids


def prefix_caching(args: EngineArgs, pooling_type: str | None) -> bool:
    enabled = prefix_caching_for(args.enable_prefix_caching, pooling_type)
    if enabled != args.enable_prefix_caching:
        logger.info("%s pooling needs every prompt token's hidden state: prefix caching is off", pooling_type)
    return enabled


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


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 1024**3
