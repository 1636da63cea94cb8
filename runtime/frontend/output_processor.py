"""OutputProcessor: turns requests' new tokens into RequestOutputs, one per user request.

It owns each request's detokenizers (one per completion), its logprobs in vLLM's shape, and the
stop-string check; the engine finishes whatever a stop string ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pagoda.runtime.core.request import Request, RequestStatus
from pagoda.runtime.frontend.detokenizer import IncrementalDetokenizer
from pagoda.runtime.frontend.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from pagoda.runtime.worker.sampler import TokenLogprobs


@dataclass(slots=True)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]
    detokenizers: list[IncrementalDetokenizer]
    metrics: RequestMetrics
    logprobs: list[list[dict[int, Logprob]]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    counted_prompt: bool = False

    @property
    def finished(self) -> bool:
        return all(c.is_finished for c in self.children)


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self._piece_cache: dict[int, str] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def add_request(self, prompt: str | None, children: list[Request], metrics: RequestMetrics) -> None:
        first = children[0]
        params = first.sampling_params
        self.states[first.parent_id] = RequestState(
            request_id=first.parent_id,
            prompt=prompt,
            prompt_token_ids=first.prompt_token_ids,
            children=children,
            detokenizers=[
                IncrementalDetokenizer(self.tokenizer, first.prompt_token_ids, params) for _ in children
            ],
            metrics=metrics,
            logprobs=[[] for _ in children] if params.logprobs is not None else [],
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
        )

    def _piece(self, token_id: int) -> str:
        piece = self._piece_cache.get(token_id)
        if piece is None:
            piece = self._piece_cache[token_id] = self.tokenizer.decode([token_id])
        return piece

    def to_logprob_dict(self, tl: TokenLogprobs) -> dict[int, Logprob]:
        out: dict[int, Logprob] = {}
        for t, lp, rank in zip(tl.token_ids, tl.logprobs, tl.ranks):
            if t not in out:  # the sampled token comes first and may also be in the top-k
                out[t] = Logprob(lp, rank, self._piece(t))
        return out

    def add_prompt_logprobs(self, request: Request, entries: list[TokenLogprobs]) -> None:
        request.prompt_logprobs.extend(entries)
        state = self.states.get(request.parent_id)
        if state is not None and request.index == 0 and state.prompt_logprobs is not None:
            state.prompt_logprobs.extend(self.to_logprob_dict(e) for e in entries)

    def process_tokens(
        self, updated: list[Request], logprobs: dict[str, TokenLogprobs], now: float
    ) -> tuple[list[Request], set[str]]:
        """Detokenize each request's new token. Returns the requests a stop string has ended
        (still to be finished by the engine) and the ids of the user requests that progressed."""
        stopped, touched = [], set()
        for r in updated:
            state = self.states[r.parent_id]
            touched.add(r.parent_id)
            token = r.output_token_ids[-1]
            m = state.metrics
            if m.first_token_time is None:
                m.first_token_time = now
            m.last_token_time = now
            self.generation_tokens += 1
            if not state.counted_prompt:
                state.counted_prompt = True
                self.prompt_tokens += r.num_prompt_tokens
            lp = logprobs.get(r.request_id)
            if lp is not None and state.logprobs:
                state.logprobs[r.index].append(self.to_logprob_dict(lp))
                r.cumulative_logprob += lp.logprobs[0]
            stop_terminated = r.status == RequestStatus.FINISHED_STOPPED
            stop_str = state.detokenizers[r.index].update([token], stop_terminated)
            if stop_str is not None:
                r.stop_reason = stop_str
                if r.is_finished:  # by length on the same token: the stop string wins, as in vLLM
                    r.status = RequestStatus.FINISHED_STOPPED
                else:
                    stopped.append(r)
        return stopped, touched

    def make_output(self, request_id: str, now: float) -> RequestOutput:
        state = self.states[request_id]
        finished = state.finished
        outputs = []
        for r, detok in zip(state.children, state.detokenizers):
            if r.is_finished and not isinstance(r.stop_reason, str):
                detok.flush()  # a stop string already ended the text where it belongs
            want_lp = bool(state.logprobs)
            outputs.append(
                CompletionOutput(
                    index=r.index,
                    text=detok.get_text(r.is_finished),
                    token_ids=list(r.output_token_ids),
                    cumulative_logprob=r.cumulative_logprob if want_lp else None,
                    logprobs=list(state.logprobs[r.index]) if want_lp else None,
                    finish_reason=r.status.finish_reason,
                    stop_reason=r.stop_reason,
                )
            )
        m = state.metrics
        m.num_preemptions = sum(c.num_preemptions for c in state.children)
        scheduled = [c.first_scheduled_time for c in state.children if c.first_scheduled_time is not None]
        m.first_scheduled_time = min(scheduled) if scheduled else None
        if finished:
            m.finished_time = now
            del self.states[request_id]
        return RequestOutput(
            request_id=request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            prompt_logprobs=list(state.prompt_logprobs) if state.prompt_logprobs is not None else None,
            outputs=outputs,
            finished=finished,
            num_cached_tokens=max(state.children[0].num_cached_tokens, 0),
            metrics=replace(m),
        )
