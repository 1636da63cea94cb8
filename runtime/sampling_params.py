"""SamplingParams: how one request is decoded. Same fields, defaults and ranges as vLLM's."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pagoda.runtime.structured_outputs_params import StructuredOutputsParams

# Below this, a temperature means greedy decoding (vLLM's threshold).
SAMPLING_EPS = 1e-5


class InvalidParam(ValueError):
    """A request field the engine cannot take; `param` names it (the server's 400 names it too)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class RequestOutputKind(enum.IntEnum):
    """What each RequestOutput of a request holds (vLLM's RequestOutputKind)."""

    CUMULATIVE = 0  # everything so far: all token ids, the whole text
    DELTA = 1  # only what is new since the previous output (streaming)
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # 0 or -1 switch it off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] | str | None = field(default_factory=list)
    stop_token_ids: list[int] | None = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None
    # Token-level constraints, applied to the logits on the device (worker/token_constraints.py).
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, clamped to [-100, 100]
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] | None = None  # never generated (as vLLM bans them: see the processor)
    # bad_words as token ids, filled by the InputProcessor from the tokenizer (vLLM's _bad_words_token_ids).
    _bad_words_token_ids: list[list[int]] | None = None
    # Whether the sampler must edit this row's logits for the three above: a field, not a property,
    # since the sampler reads it for every row of every step.
    constrains_tokens: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        if self.top_k == 0:
            self.top_k = -1
        if self.logit_bias:
            # vLLM clamps offline (OpenAI's range); the server refuses values outside it instead.
            self.logit_bias = {int(t): min(100.0, max(-100.0, float(b))) for t, b in self.logit_bias.items()}
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = [int(t) for t in self.allowed_token_ids]
        if self.bad_words is not None:
            self.bad_words = [self.bad_words] if isinstance(self.bad_words, str) else list(self.bad_words)
        self._validate()
        self.constrains_tokens = bool(self.logit_bias or self.allowed_token_ids or self._bad_words_token_ids)
        if self.temperature < SAMPLING_EPS:
            # Greedy ignores the truncation knobs; resetting them keeps the sampler's fast path.
            self.top_p, self.top_k, self.min_p = 1.0, -1, 0.0

    def _validate(self) -> None:
        def bad(name: str, allowed: str) -> ValueError:
            return InvalidParam(f"{name} must be {allowed}, got {getattr(self, name)!r}", name)

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "an integer >= 1")
        if self.temperature < 0.0:
            raise bad("temperature", "non-negative (0 means greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "-1 or 0 (disabled), or at least 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 2.0**31:
            raise bad("repetition_penalty", "in (0, inf)")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "an integer or None")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "an integer >= 1 or None")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"in [0, max_tokens={self.max_tokens}]")
        if self.logprobs is not None and self.logprobs < 0:
            raise bad("logprobs", "None or an integer >= 0")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise bad("prompt_logprobs", "None or an integer >= 0")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "a list of non-empty strings")
        if any(t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a list of token ids >= 0")
        if self.logit_bias and min(self.logit_bias) < 0:
            raise bad("logit_bias", "keyed by token ids >= 0")
        if self.allowed_token_ids is not None and (not self.allowed_token_ids or min(self.allowed_token_ids) < 0):
            raise bad("allowed_token_ids", "None or a non-empty list of token ids >= 0")
        if self.bad_words is not None and any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise bad("bad_words", "a list of non-blank strings")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                  StructuredOutputsParams):
            raise bad("structured_outputs", "a StructuredOutputsParams or None")

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def needs_history(self) -> bool:
        """Sampling reads the tokens generated so far (penalties, a bad word of several tokens), so it
        cannot run ahead of them."""
        return self.has_penalties or (self._bad_words_token_ids is not None
                                      and any(len(w) > 1 for w in self._bad_words_token_ids))

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


    def clone(self, **changes) -> SamplingParams:
        values = {name: getattr(self, name) for name, f in self.__dataclass_fields__.items() if f.init}
        values["stop"] = list(self.stop)
        values["stop_token_ids"] = list(self.stop_token_ids)
        if self.bad_words is not None:
            values["bad_words"] = list(self.bad_words)
        values.update(changes)
        return SamplingParams(**values)
