"""What the engine hands back: one RequestOutput per request, holding its n completions.

The shapes are vLLM's, so code written against vLLM's offline API reads these unchanged. What an
output holds follows its request's output_kind: everything so far (CUMULATIVE), what is new since
the previous output (DELTA), or the whole result once, at the end (FINAL_ONLY).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the most likely token
    decoded_token: str | None = None


# One entry per generated (or prompt) token: token id -> its Logprob, top-k plus the chosen token.
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class RequestMetrics:
    """time.monotonic() stamps; the server turns them into TTFT, ITL and queue-time histograms."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id; None for EOS/length

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None

    def add(self, later: RequestOutput) -> None:
        """Fold a later DELTA output of the same request into this one (a reader that fell behind
        then gets one output that carries everything it missed)."""
        for c, new in zip(self.outputs, later.outputs):
            c.text += new.text
            c.token_ids.extend(new.token_ids)
            if new.logprobs:
                c.logprobs = (c.logprobs or []) + new.logprobs
            c.cumulative_logprob = new.cumulative_logprob
            c.finish_reason, c.stop_reason = new.finish_reason, new.stop_reason
        if later.prompt_logprobs:
            self.prompt_logprobs = (self.prompt_logprobs or []) + later.prompt_logprobs
        self.finished = later.finished
        self.num_cached_tokens = later.num_cached_tokens
        self.metrics = later.metrics
