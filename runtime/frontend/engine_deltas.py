"""Step outputs across the process boundary: deltas out of the engine, cumulative outputs back in.

LLMEngine.step() returns cumulative RequestOutputs: every token id, the whole text and every
logprob so far. Pickling those each step would cost O(length) per request per step on both sides,
so the engine process sends only what is new (DeltaEncoder), as plain tuples, and the server process
rebuilds the cumulative outputs the HTTP layer reads (OutputAssembler). The assembler updates one
RequestOutput per request in place: readers hold offsets into it (tokens sent, text sent), never
copies.

One request's delta:
    (request_id, finished, num_cached_tokens, first_scheduled_time, new_prompt_logprobs, completions)
one completion's:
    (index, new_token_ids, text_start, new_text, new_logprobs, cumulative_logprob, finish_reason,
     stop_reason)
The text is `text[:text_start] + new_text`: the engine's visible text only grows, but the format
does not rely on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagoda.runtime.frontend.outputs import CompletionOutput, RequestMetrics, RequestOutput


@dataclass(slots=True)
class _Sent:
    """What the encoder has already sent of one request."""

    tokens: list[int] = field(default_factory=list)  # per completion index
    text: list[int] = field(default_factory=list)
    prompt_logprobs: int = 0


class DeltaEncoder:
    """Engine side: cumulative RequestOutputs -> deltas against what was already sent."""

    def __init__(self):
        self._sent: dict[str, _Sent] = {}

    def encode(self, outputs: list[RequestOutput]) -> list[tuple]:
        return [self._encode_one(out) for out in outputs]

    def _encode_one(self, out: RequestOutput) -> tuple:
        sent = self._sent.get(out.request_id)
        if sent is None:
            n = len(out.outputs)
            sent = self._sent[out.request_id] = _Sent([0] * n, [0] * n)
        completions = []
        for c in out.outputs:
            i = c.index
            t0 = sent.tokens[i]
            new_ids = c.token_ids[t0:]
            text_start = min(sent.text[i], len(c.text))
            new_text = c.text[text_start:]
            new_lps = c.logprobs[t0:] if c.logprobs is not None else None
            sent.tokens[i] = len(c.token_ids)
            sent.text[i] = len(c.text)
            completions.append((i, new_ids, text_start, new_text, new_lps, c.cumulative_logprob,
                                c.finish_reason, c.stop_reason))
        new_plp = None
        if out.prompt_logprobs is not None:
            new_plp = out.prompt_logprobs[sent.prompt_logprobs:]
            sent.prompt_logprobs = len(out.prompt_logprobs)
        if out.finished:
            del self._sent[out.request_id]
        first_scheduled = out.metrics.first_scheduled_time if out.metrics is not None else None
        return (out.request_id, out.finished, out.num_cached_tokens, first_scheduled, new_plp, completions)


class OutputAssembler:
    """Server side: deltas -> one cumulative RequestOutput per request, updated in place."""

    def __init__(self):
        self._outputs: dict[str, RequestOutput] = {}

    def __len__(self) -> int:
        return len(self._outputs)

    def add(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params,
            arrival_time: float) -> None:
        want_lp = params.logprobs is not None
        self._outputs[request_id] = RequestOutput(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=list(prompt_token_ids),
            prompt_logprobs=[] if params.prompt_logprobs is not None else None,
            outputs=[CompletionOutput(index=i, text="", token_ids=[], cumulative_logprob=None,
                                      logprobs=[] if want_lp else None) for i in range(params.n)],
            finished=False,
            metrics=RequestMetrics(arrival_time=arrival_time),
        )

    def forget(self, request_id: str) -> None:
        self._outputs.pop(request_id, None)

    def apply(self, deltas: list[tuple], now: float) -> list[RequestOutput]:
        """The updated outputs, in the engine's order; deltas of forgotten requests are dropped."""
        updated = []
        outputs = self._outputs
        for request_id, finished, num_cached, first_scheduled, new_plp, completions in deltas:
            out = outputs.get(request_id)
            if out is None:
                continue
            for i, new_ids, text_start, new_text, new_lps, cum_lp, finish_reason, stop_reason in completions:
                c = out.outputs[i]
                if new_ids:
                    c.token_ids.extend(new_ids)
                if text_start == len(c.text):
                    if new_text:
                        c.text += new_text
                else:
                    c.text = c.text[:text_start] + new_text
                if new_lps:
                    c.logprobs.extend(new_lps)
                c.cumulative_logprob = cum_lp
                c.finish_reason = finish_reason
                c.stop_reason = stop_reason
            if new_plp:
                out.prompt_logprobs.extend(new_plp)
            out.num_cached_tokens = num_cached
            m = out.metrics
            m.first_scheduled_time = first_scheduled
            if m.first_token_time is None and any(c.token_ids for c in out.outputs):
                m.first_token_time = now
            m.last_token_time = now
            if finished:
                out.finished = True
                m.finished_time = now
                del outputs[request_id]
            updated.append(out)
        return updated
