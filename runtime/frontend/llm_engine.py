"""LLMEngine: the engine core with the frontend's halves around it, in one thread (under `LLM`).

add_request validates and tokenizes nothing twice (InputProcessor), the core steps, and the
OutputProcessor turns its records into RequestOutputs. The records of one step are processed
during the next step, while its GPU work runs (EngineCore.step's overlap), so detokenization and
output objects cost the GPU no idle time; a stop string found there aborts the request before
anything more is scheduled for it.
"""

from __future__ import annotations

import time

from pagoda.runtime.core.engine_core import EngineCore
from pagoda.runtime.core.outputs import EngineCoreOutput, EngineStats
from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.output_processor import output_processor_for
from pagoda.runtime.frontend.outputs import RequestOutput
from pagoda.runtime.frontend.processor import InputProcessor, child_ids
from pagoda.runtime.frontend.tokenizer import load_tokenizer
from pagoda.runtime.model_config import generation_defaults, resolve_model_path
from pagoda.runtime.pooling_params import PoolingParams
from pagoda.runtime.sampling_params import RequestOutputKind, SamplingParams


class LLMEngine:
    def __init__(self, args: EngineArgs):
        self.engine_core = EngineCore(args)
        self.args = self.engine_core.args
        self.model_config = self.engine_core.model_config
        self.tokenizer = load_tokenizer(resolve_model_path(args.tokenizer or args.model, args.revision),
                                        args.chat_template)
        self.processor = InputProcessor(self.model_config, self.tokenizer, args.max_logprobs,
                                        args.structured_outputs_disable_any_whitespace)
        self.generation_defaults = generation_defaults(args.generation_config, self.model_config.path)
        # --runner pooling: embeddings (LLM.embed / encode) instead of text.
        self.pooler_config = self.engine_core.pooler_config
        self.processor.pooling = self.pooler_config is not None
        self.output_processor = output_processor_for(self.tokenizer, self.pooler_config)
        self._records: list[EngineCoreOutput] = []  # the last step's, processed during the next
        self._ready: list[RequestOutput] = []  # outputs due at the next step() (aborts)
        self._grammars_ready = False  # the core has xgrammar's TokenizerInfo

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args)

    # The core's parts, for tests and benchmarks that look inside.
    @property
    def runner(self):
        """Rank 0's ModelRunner."""
        return self.engine_core.executor.runner

    @property
    def scheduler(self):
        return self.engine_core.scheduler

    @property
    def kv_cache_manager(self):
        return self.engine_core.kv_cache_manager

    @property
    def memory_plan(self):
        return self.engine_core.memory_plan

    def get_tokenizer(self):
        return self.tokenizer

    def shutdown(self) -> None:
        self.engine_core.shutdown()

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams | PoolingParams | None = None, arrival_time: float | None = None) -> None:
        params = params or SamplingParams()
        arrival = time.monotonic() if arrival_time is None else arrival_time
        if request_id in self.output_processor.states:
            raise ValueError(f"request id {request_id!r} is already in use")
        requests = self.processor.process(request_id, prompt_token_ids, params, arrival)
        if params.structured_outputs is not None and not self._grammars_ready:
            self.engine_core.init_structured_outputs(self.processor.grammars.tokenizer_info_json())
            self._grammars_ready = True
        self.output_processor.add_request(request_id, prompt, prompt_token_ids, params, arrival)
        quiet = self._quiet(params)
        for request in requests:
            request.quiet = quiet
            self.engine_core.add_request(request)

    def _quiet(self, params) -> bool:
        """Whether the core may hold back a request's per-step records until it ends
        (EngineCoreRequest.quiet): one output at the end, no stop string to scan for, no logprobs,
        and no per-token clock here (no server metrics)."""
        return (isinstance(params, SamplingParams) and params.output_kind == RequestOutputKind.FINAL_ONLY
                and not params.stop and params.logprobs is None and params.prompt_logprobs is None
                and self.output_processor.metrics is None)

    def abort_request(self, request_ids: list[str] | str) -> None:
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        self._process_records()  # what the core already produced is part of the result
        children = [c for rid in request_ids if (s := self.output_processor.states.get(rid))
                    for c in child_ids(rid, len(s.completions))]
        self._records = self.engine_core.unreported(children)  # quiet requests' held-back tokens
        self._process_records()
        outputs, children = self.output_processor.abort_requests(request_ids, time.monotonic())
        self.engine_core.abort_requests(children)
        self._ready += outputs

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests() or bool(self._records) or bool(self._ready)

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor.states)

    def step(self) -> list[RequestOutput]:
        """One core step; returns the RequestOutputs of the step before it."""
        # Only a stop string makes the frontend abort; without one the core may queue the step
        # ahead before the records are processed.
        self._records = self.engine_core.step(overlap=self._process_records,
                                              overlap_aborts=self.output_processor.has_stop_strings())
        outputs, self._ready = self._ready, []
        return outputs

    def _process_records(self) -> None:
        records, self._records = self._records, []
        if records:
            outputs, stopped = self.output_processor.process_outputs(records, time.monotonic())
            if stopped:
                self.engine_core.abort_requests(stopped)
            self._ready += outputs

    def stats(self) -> EngineStats:
        return self.engine_core.stats()
