"""Request: the engine's state for one sequence, from arrival until it finishes.

A user request with n > 1 becomes n of these (children), which share the prompt's KV blocks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pagoda.runtime.core.kv.block_hash import BlockHash, hash_block_tokens, hash_full_blocks
from pagoda.runtime.core.structured_outputs import RequestGrammar
from pagoda.runtime.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS[self]


# RequestStatus -> the finish reason it reports (None while unfinished), indexed by the status.
FINISH_REASONS = (None, None, None, "stop", "length", "abort")


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    max_tokens: int  # resolved: the params' max_tokens, or what max_model_len leaves
    block_size: int
    parent_id: str = ""  # the user's request id; children of an n > 1 request share it
    index: int = 0  # which of the n completions this is
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Rows of steps scheduled ahead that are launched but not yet read back (0, 1 or 2); their
    # slots are allocated and about to be filled.
    num_in_flight_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | None = None  # the stop token id that ended it
    num_cached_tokens: int = -1  # prefix-cache hit on first scheduling; -1 until then
    num_preemptions: int = 0
    # Hash of every full block of all_token_ids, chained from the first block (prefix caching).
    block_hashes: list[BlockHash] = field(default_factory=list)
    cache_salt: bytes = b""
    # The sampler's seed for an unseeded request, drawn when it first samples (kept across
    # preemptions, so a recomputed request draws the same tokens).
    generator: int | None = None
    num_prompt_logprobs: int = 0  # prompt positions whose logprobs were already reported
    first_scheduled_time: float | None = None
    grammar: RequestGrammar | None = None  # structured outputs: its compile, then its matcher
    # The engine core's requests hash their prompt's blocks when first scheduled (the scheduler
    # calls _update_block_hashes), not on arrival: LLM.generate adds every request before the
    # first step, and the GPU waits for those adds.
    defer_hashes: bool = False
    # EngineCoreRequest.quiet: records for its first token and its end only; num_reported counts
    # the output tokens the records so far carried.
    quiet: bool = False
    num_reported: int = 0
    # Facts of the sampling params the scheduler reads for every row of every step, fixed at
    # arrival (the params do not change while the request runs).
    needs_history: bool = field(default=False, init=False)  # SamplingParams.needs_history
    # The EOS id that ends it (None with ignore_eos), and whether that and the length are its only
    # stops (no stop token ids, no min_tokens, no grammar): Scheduler.update_from_output's fast path.
    stop_eos: int | None = field(default=None, init=False)
    simple_stops: bool = field(default=False, init=False)
    # Greedy, and nothing else for the sampler to do (no logprobs, grammar, token constraints,
    # min_tokens or penalties): Sampler.sample's fast path, an argmax.
    plain_greedy: bool = field(default=False, init=False)
    # The scheduler's per-row checks, precomputed: the token count at which the next block fills
    # (and is hashed), and the output length that ends the request by length (max_tokens, which
    # Scheduler.add_request lowers to what max_model_len leaves after the prompt).
    next_block_end: int = field(default=0, init=False)
    output_limit: int = field(default=0, init=False)
    # Whether a sampled token can end it before its length does (EOS, a stop token id, a grammar,
    # or a stop string the frontend finds): only then is a seat freed at a step nobody foresaw.
    stops_on_token: bool = field(default=False, init=False)
    # Whether scheduling it ahead needs what the host has only once the step in flight is read:
    # its history for penalties, its grammar's matcher, or its prompt logprobs' progress
    # (scheduler._needs_host_state, checked for every running request of a mixed step ahead).
    needs_host_state: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not self.parent_id:
            self.parent_id = self.request_id
        params = self.sampling_params
        self.needs_history = params.needs_history
        self.stop_eos = None if params.ignore_eos else self.eos_token_id
        self.simple_stops = not params.stop_token_ids and params.min_tokens == 0 and self.grammar is None
        self.plain_greedy = (params.greedy and params.logprobs is None and self.grammar is None
                             and not params.constrains_tokens and params.min_tokens == 0
                             and not params.has_penalties)
        self.output_limit = self.max_tokens
        self.stops_on_token = self.stop_eos is not None or not self.simple_stops or bool(params.stop)
        self.needs_host_state = self.needs_history or self.grammar is not None or params.prompt_logprobs is not None
        if not self.defer_hashes:
            self._update_block_hashes()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        # Called for every token of every running request: return early unless a block filled.
        if self.next_block_end <= len(self.prompt_token_ids) + len(self.output_token_ids):
            self._update_block_hashes()

    def _update_block_hashes(self) -> None:
        bs, hashes = self.block_size, self.block_hashes
        num_prompt = len(self.prompt_token_ids)
        num_full = (num_prompt + len(self.output_token_ids)) // bs
        start = len(hashes) * bs - num_prompt  # where the first unhashed block starts in the output
        if num_full == len(hashes) + 1 and start >= 0 and hashes:
            # A decode token filled one block of output tokens (W4: ~64 requests a step at 1,024
            # seats): one digest, without the slicing and loop of the general case.
            hashes.append(hash_block_tokens(hashes[-1], self.output_token_ids[start : start + bs], self.cache_salt))
        elif num_full > len(hashes):
            tokens = self.token_ids_slice(len(hashes) * bs, num_full * bs)
            hashes += hash_full_blocks(hashes[-1] if hashes else None, tokens, bs, self.cache_salt)
        self.next_block_end = (len(hashes) + 1) * bs

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED  # RequestStatus.finished, inlined (hot)

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.sampling_params.prompt_logprobs is not None
