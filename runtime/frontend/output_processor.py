"""OutputProcessor: the engine core's per-step records -> RequestOutputs, one per user request.

It is the frontend's half of a step (vLLM V1's OutputProcessor). For each request it owns one
incremental detokenizer per completion, the stop-string check, the logprobs in vLLM's shape, the
clock (first token, last token, finish) and the metrics. A stop string it finds ends the
completion here, and its id is returned so the caller aborts it in the core; that costs at most
the token already in flight. It yields what each request's output_kind asks for: everything so
far, the new part only (DELTA, for streams), or one output at the end (FINAL_ONLY); a request
whose text nobody reads before it finishes is detokenized once, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagoda.runtime.core.outputs import EngineCoreOutput, TokenLogprobs
from pagoda.runtime.frontend.detokenizer import IncrementalDetokenizer, decodes_whole, flush_together
from pagoda.runtime.frontend.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from pagoda.runtime.frontend.processor import child_ids
from pagoda.runtime.sampling_params import RequestOutputKind, SamplingParams

DELTA, FINAL_ONLY = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY


@dataclass(slots=True)
class CompletionState:
    index: int
    detokenizer: IncrementalDetokenizer
    logprobs: list[dict[int, Logprob]] | None
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    first_scheduled_time: float | None = None
    num_preemptions: int = 0
    # DELTA: how much of each was already handed out.
    sent_tokens: int = 0
    sent_text: int = 0


@dataclass(slots=True)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    output_kind: RequestOutputKind
    completions: list[CompletionState]
    metrics: RequestMetrics
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    num_unfinished: int
    num_cached_tokens: int = 0
    sent_prompt_logprobs: int = 0
    step_tokens: int = 0  # new tokens in the records being processed (process_outputs)


class OutputProcessor:
    def __init__(self, tokenizer, metrics=None):
        self.tokenizer = tokenizer
        self.decodes_whole = decodes_whole(tokenizer)  # a final-only text costs one decode
        # Anything with on_first_token / on_tokens / on_finish (the server's ServerMetrics).
        self.metrics = metrics
        self.states: dict[str, RequestState] = {}
        self._children: dict[str, tuple[RequestState, CompletionState]] = {}
        self._piece_cache: dict[int, str] = {}
        self._with_stop_strings: set[str] = set()  # unfinished requests that have stop strings

    def has_stop_strings(self) -> bool:
        """Whether processing a step's records may end a request here (and abort it in the core)."""
        return bool(self._with_stop_strings)

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float) -> None:
        if request_id in self.states:
            raise ValueError(f"request id {request_id!r} is already in use")
        want_lp = params.logprobs is not None
        state = RequestState(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=list(prompt_token_ids),
            output_kind=params.output_kind,
            completions=[_completion(i, self.tokenizer, prompt_token_ids, params, want_lp, self.decodes_whole)
                         for i in range(params.n)],
            metrics=RequestMetrics(arrival_time=arrival_time),
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
            num_unfinished=params.n,
        )
        self.states[request_id] = state
        if params.stop:
            self._with_stop_strings.add(request_id)
        for child, c in zip(child_ids(request_id, params.n), state.completions):
            self._children[child] = (state, c)

    def forget(self, request_id: str) -> None:
        """Drop a request the core never took (its add failed): it counts nowhere."""
        state = self.states.pop(request_id, None)
        self._with_stop_strings.discard(request_id)
        if state is not None:
            for child in child_ids(request_id, len(state.completions)):
                self._children.pop(child, None)

    def abort_requests(self, request_ids: list[str], now: float) -> tuple[list[RequestOutput], list[str]]:
        """End these user requests with finish_reason "abort". Returns their final outputs and
        the ids of the core requests (children) to abort."""
        outputs, to_abort = [], []
        for request_id in request_ids:
            state = self.states.get(request_id)
            if state is None:
                continue
            for child, c in zip(child_ids(request_id, len(state.completions)), state.completions):
                if c.finish_reason is None:
                    c.finish_reason = "abort"
                    to_abort.append(child)
                self._children.pop(child, None)
            state.num_unfinished = 0
            outputs.append(self._finish(state, now))
        return outputs, to_abort

    def process_outputs(self, core_outputs: list[EngineCoreOutput], now: float
                        ) -> tuple[list[RequestOutput], list[str]]:
        """One step's records -> the RequestOutputs due now, and the core requests a stop string
        ended (to abort in the core)."""
        touched: dict[str, RequestState] = {}
        to_abort: list[str] = []
        ending: list[RequestState] = []  # whose last completion ended in these records
        children = self._children
        for o in core_outputs:
            entry = children.get(o.request_id)
            if entry is None:
                continue  # aborted or stopped by a stop string since: a row that was in flight
            state, c = entry
            if o.new_prompt_logprobs and state.prompt_logprobs is not None and c.index == 0:
                state.prompt_logprobs.extend(self._logprob_dict(e) for e in o.new_prompt_logprobs)
            state.num_cached_tokens = o.num_cached_tokens
            c.first_scheduled_time, c.num_preemptions = o.first_scheduled_time, o.num_preemptions
            touched[state.request_id] = state
            if not o.new_token_ids:
                if o.finish_reason is not None:  # ended before its first token (a grammar that failed)
                    c.finish_reason = o.finish_reason
                    del children[o.request_id]
                    state.num_unfinished -= 1
                continue
            state.step_tokens += len(o.new_token_ids)
            c.token_ids += o.new_token_ids  # the lazy detokenizer reads this list too
            if o.new_logprobs and c.logprobs is not None:
                for lp in o.new_logprobs:
                    c.logprobs.append(self._logprob_dict(lp))
                    c.cumulative_logprob += lp.logprobs[0]
            if o.finish_reason is None and c.detokenizer.lazy:
                continue  # no stop string to look for: nothing to do until its text is read
            stop_str = c.detokenizer.update(o.new_token_ids, o.finish_reason == "stop")
            if stop_str is not None:  # a stop string wins over a length cap on the same token
                c.finish_reason, c.stop_reason = "stop", stop_str
                if o.finish_reason is None:
                    to_abort.append(o.request_id)
            elif o.finish_reason is not None:
                c.finish_reason, c.stop_reason = o.finish_reason, o.stop_reason
            if c.finish_reason is not None:
                del children[o.request_id]
                state.num_unfinished -= 1
                if not state.num_unfinished:
                    ending.append(state)
        outputs = []
        metrics = self.metrics
        if ending and self.decodes_whole:
            # The final-only texts of the requests that end now, decoded together.
            flush_together([c.detokenizer for state in ending for c in state.completions
                            if not isinstance(c.stop_reason, str)])
        for state in touched.values():
            num_new = state.step_tokens
            if num_new:
                state.step_tokens = 0
                if metrics is None:  # _clock without metrics (LLM), inlined: once per request and step
                    m = state.metrics
                    if m.first_token_time is None:
                        m.first_token_time = now
                    m.last_token_time = now
                else:
                    self._clock(state, num_new, now)
            if state.num_unfinished == 0:
                outputs.append(self._finish(state, now))
            elif num_new and state.output_kind != FINAL_ONLY:
                outputs.append(self._make_output(state, False))
        return outputs, to_abort

    # ---- helpers ------------------------------------------------------------------------------

    def _clock(self, state: RequestState, num_new: int, now: float) -> None:
        m, metrics = state.metrics, self.metrics
        if m.first_token_time is None:
            m.first_token_time = now
            if metrics is not None:
                scheduled = _first_scheduled(state)
                metrics.on_first_token(len(state.prompt_token_ids), now - m.arrival_time,
                                       max(0.0, (scheduled or now) - m.arrival_time))
        elif metrics is not None:
            metrics.on_inter_token(now - m.last_token_time)
        m.last_token_time = now
        if metrics is not None:
            metrics.on_tokens(num_new)

    def _finish(self, state: RequestState, now: float) -> RequestOutput:
        del self.states[state.request_id]
        self._with_stop_strings.discard(state.request_id)
        state.metrics.finished_time = now
        if self.metrics is not None:
            m = state.metrics
            self.metrics.on_finish(_finish_reason(state), now - m.arrival_time, len(state.prompt_token_ids),
                                   sum(len(c.token_ids) for c in state.completions), _first_scheduled(state),
                                   m.first_token_time, m.last_token_time, now)
        return self._make_output(state, True)

    def _make_output(self, state: RequestState, finished: bool) -> RequestOutput:
        delta = state.output_kind == DELTA
        outputs = []
        for c in state.completions:
            done = c.finish_reason is not None
            detok = c.detokenizer
            if done and not isinstance(c.stop_reason, str):
                detok.flush()  # a stop string already ended the text where it belongs
            text = detok.get_text(done)
            token_ids, logprobs = c.token_ids, c.logprobs
            if delta:
                text, c.sent_text = text[c.sent_text:], len(text)
                token_ids = token_ids[c.sent_tokens:]
                if logprobs is not None:
                    logprobs = logprobs[c.sent_tokens:]
                c.sent_tokens = len(c.token_ids)
            else:
                token_ids = list(token_ids)
                logprobs = list(logprobs) if logprobs is not None else None
            outputs.append(CompletionOutput(
                index=c.index,
                text=text,
                token_ids=token_ids,
                cumulative_logprob=c.cumulative_logprob if c.logprobs is not None else None,
                logprobs=logprobs,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            ))
        m = state.metrics
        m.first_scheduled_time = _first_scheduled(state)
        m.num_preemptions = sum(c.num_preemptions for c in state.completions)
        prompt_logprobs = state.prompt_logprobs
        if prompt_logprobs is not None:
            if delta:
                prompt_logprobs, state.sent_prompt_logprobs = (prompt_logprobs[state.sent_prompt_logprobs:],
                                                               len(prompt_logprobs))
            else:
                prompt_logprobs = list(prompt_logprobs)
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            prompt_logprobs=prompt_logprobs,
            outputs=outputs,
            finished=finished,
            num_cached_tokens=state.num_cached_tokens,
            metrics=RequestMetrics(m.arrival_time, m.first_scheduled_time, m.first_token_time,
                                   m.last_token_time, m.finished_time, m.num_preemptions),
        )

    def _piece(self, token_id: int) -> str:
        piece = self._piece_cache.get(token_id)
        if piece is None:
            piece = self._piece_cache[token_id] = self.tokenizer.decode([token_id])
        return piece

    def _logprob_dict(self, tl: TokenLogprobs) -> dict[int, Logprob]:
        out: dict[int, Logprob] = {}
        for t, lp, rank in zip(tl.token_ids, tl.logprobs, tl.ranks):
            if t not in out:  # the sampled token comes first and may also be in the top-k
                out[t] = Logprob(lp, rank, self._piece(t))
        return out


def _completion(index: int, tokenizer, prompt_token_ids: list[int], params: SamplingParams,
                want_logprobs: bool, whole: bool) -> CompletionState:
    token_ids: list[int] = []
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, params, token_ids, whole)
    return CompletionState(index, detokenizer, [] if want_logprobs else None, token_ids)


def _first_scheduled(state: RequestState) -> float | None:
    times = [c.first_scheduled_time for c in state.completions if c.first_scheduled_time is not None]
    return min(times) if times else None


def _finish_reason(state: RequestState) -> str:
    reasons = [c.finish_reason for c in state.completions if c.finish_reason]
    if "abort" in reasons:
        return "abort"
    if "length" in reasons:
        return "length"
    return reasons[0] if reasons else "stop"


def output_processor_for(tokenizer, pooler_config=None, metrics=None):
    """The OutputProcessor, or for the pooling runner its PoolingOutputProcessor."""
    if pooler_config is None:
        return OutputProcessor(tokenizer, metrics)
    from pagoda.runtime.frontend.pooling_processor import PoolingOutputProcessor

    return PoolingOutputProcessor(pooler_config, metrics)
