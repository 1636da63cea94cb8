"""Scheduler: which requests run this step, and how many tokens each (vLLM V1's policy).

Every step it gives each running request, oldest first, the tokens it still lacks, then admits
waiting requests in arrival order, all within a token budget and a sequence cap. A decode needs one
token, a prefill as many as its budget allows (chunked prefill; at most
long_prefill_token_threshold per request and step when set), and both share one batch. When the
pool has no block for a running request, the newest running request is preempted: its blocks go
back and it is recomputed from its tokens later, ahead of the other waiting requests.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.request import Request, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_tokens: int  # new tokens computed this step, starting at request.num_computed_tokens
    # Scheduled ahead of a mixed step (SchedulerOutput.mixed_ahead): the tokens the step in flight
    # computes for the request, not yet in num_computed_tokens. This step's tokens follow them.
    offset: int = 0
    fed: bool = False  # its one token is the step in flight's sample, copied in on the device


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # Scheduled ahead (see Scheduler.schedule_ahead): every request is one decode token past its
    # num_computed_tokens, and that token is the previous step's sample, still on the device.
    ahead: bool = False
    # Ahead, with grammar rows: the forward runs at once, but sampling waits until the step before
    # is read and the matchers have seen its tokens (EngineCore.step samples it then).
    defer_sampling: bool = False
    # Scheduled ahead of any step (Scheduler._mixed_ahead): decodes fed from the step in flight,
    # prefill chunks continued past it and new admissions, each item placed by its offset.
    mixed_ahead: bool = False

    @property
    def total_num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        long_prefill_token_threshold: int = 0,
        mixed_ahead: bool = False,
    ):
        self.kv = kv_cache_manager
        # Whether schedule_ahead may schedule a step that admits or prefills (_mixed_ahead;
        # EngineArgs.schedule_mixed_ahead).
        self.mixed_ahead = mixed_ahead
        # vLLM's long_prefill_token_threshold: a cap on one request's prefill chunk per step.
        self.chunk_cap = long_prefill_token_threshold if long_prefill_token_threshold > 0 else max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.first_child: dict[str, Request] = {}  # parent id -> child 0, for n > 1 sharing
        self.num_preemptions = 0
        # Requests whose grammar failed to compile, finished while waiting: the core reports them.
        self.failed: list[Request] = []

    def add_request(self, request: Request) -> None:
        # A length stop is then one comparison per row and step (update_from_output, schedule_ahead).
        request.output_limit = min(request.max_tokens, self.max_model_len - len(request.prompt_token_ids))
        self.requests[request.request_id] = request
        if request.index == 0:
            self.first_child[request.parent_id] = request
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        now = time.monotonic()

        i = self._schedule_decodes(out, budget)
        budget -= i
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget, self.chunk_cap)
            while self.kv.allocate_slots(request, num_new) is None:
                victim = self.running.pop()  # the newest running request
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                out.scheduled.append(ScheduledRequest(request, num_new))
                budget -= num_new
                i += 1
                continue
            break

        # A step that had to preempt admits nobody: the pool is already short.
        if not out.preempted:
            self._schedule_waiting(out, budget, now)
        return out

    def _schedule_decodes(self, out: SchedulerOutput, budget: int) -> int:
        """The running requests that lead the list with one token to compute (decodes), scheduled
        together when the pool has a slot for each: one allocate_decode_slots pass instead of an
        allocate_slots call per request (W4 admits prompts beside 1,024 decodes; those steps are
        not scheduled ahead, so the GPU waits for this loop). Returns how many; 0 leaves them all
        to the request-by-request loop, which preempts when the pool is short."""
        running, n = self.running, 0
        for r in running[: min(len(running), budget)]:
            if len(r.prompt_token_ids) + len(r.output_token_ids) - r.num_computed_tokens != 1:
                break
            n += 1
        if n < 2 or not self.kv.allocate_decode_slots(running[:n], 1):
            return 0
        out.scheduled += [ScheduledRequest(r, 1) for r in running[:n]]
        return n

    def schedule_ahead(self, current: SchedulerOutput) -> SchedulerOutput | None:
        """The next step, scheduled while `current` is still running on the GPU (vLLM's async
        scheduling), or None when it cannot be known yet (the normal schedule then runs after
        `current` is read). A pure decode step is followed by the next decode step
        (_decode_ahead); a step that can admit requests, or follows a mixed step, by a mixed one
        (_mixed_ahead)."""
        if current.preempted or not current.scheduled:
            return None
        if self.mixed_ahead and self.waiting and len(self.running) < self.max_num_seqs:
            return self._mixed_ahead(current)  # a seat is free: admit now rather than a step later
        nxt = self._decode_ahead(current)
        if nxt is None and self.mixed_ahead:
            nxt = self._mixed_ahead(current)
        return nxt

    def _decode_ahead(self, current: SchedulerOutput) -> SchedulerOutput | None:
        """The next decode step after a decode step, or None.

        It is known when `current` is a pure decode step (every request samples one token) and no
        request needs its history on the host to sample (penalties); while requests wait to be
        admitted, only every other step is scheduled ahead, unless no seat can free up before the
        next step (all seats taken, none freed by `current`'s length stops, and no request that a
        token could stop): a schedule after reading `current` would admit nobody then either.
        The next step then runs the same requests, one token further, with the input ids taken
        from `current`'s sampled ids on the device. Requests that `current` surely finishes by
        length are left out; one that stops on a token or string wastes one row, whose token is
        dropped. Slots are allocated now; when the pool is short it returns None and the normal
        schedule (which may preempt) runs after `current` is read.
        """
        # Admission happens in normal schedules only: with requests waiting, every other step is
        # one, so none waits more than one step longer, and half the steps still overlap. But with
        # every seat taken until a length stop frees one (W4: all of a wave end together), such a
        # schedule admits nobody and builds the very step scheduled ahead; the GPU would wait for
        # it on every other step (at 256 seats, 0.33 ms per decode step on the H200).
        admit = bool(self.waiting) and current.ahead
        if admit and len(self.running) < self.max_num_seqs:
            return None
        nxt = SchedulerOutput(ahead=True)
        scheduled, finished = nxt.scheduled, RequestStatus.FINISHED_STOPPED
        # The requests whose next two tokens need a block or fill one (about two in block_size):
        # the KV manager's room_end check, done here in the same pass, so that
        # allocate_decode_slots walks only them (it decides the same for the rest: nothing to do).
        kv = self.kv
        room = kv.room_end.get if kv.sliding_window is None else None
        grow: list[Request] = []
        # Once per running request per step: Request's properties are inlined here. The items
        # are current's own (each is one decode token of its request, and nothing changes them).
        for item in current.scheduled:
            r = item.request
            if r.status >= finished:
                continue  # stopped or aborted since `current` was scheduled
            num_output = len(r.output_token_ids)
            num_tokens = len(r.prompt_token_ids) + num_output
            if item.num_tokens != 1 or r.num_computed_tokens + 1 != num_tokens:
                return None
            if r.needs_history:
                return None  # its sampling reads the tokens so far on the host
            if r.grammar is not None:
                nxt.defer_sampling = True  # its mask needs `current`'s token in its matcher
            if admit and r.stops_on_token:
                return None  # `current` may free its seat: admit in a normal schedule
            if num_output + 1 >= r.output_limit:
                continue  # `current` gives its last token (_reaches_length with one pending)
            scheduled.append(item)
            if room is None or num_tokens + 1 > room(r.request_id, -1):  # (num_computed + 2 tokens)
                grow.append(r)
        if not scheduled or (admit and len(scheduled) < len(current.scheduled)):
            return None  # (or `current` frees seats: the next schedule admits)
        # Room for the in-flight token and the next one, for all or none: a partial allocation
        # would hold blocks a step early for requests that then run synchronously.
        if grow and not kv.allocate_decode_slots(grow, 2, in_flight=1):
            return None
        for item in scheduled:
            item.request.num_in_flight_tokens += 1
        return nxt

    def _mixed_ahead(self, current: SchedulerOutput) -> SchedulerOutput | None:
        """The next step after any step, scheduled before `current` is read, or None.

        The running requests, in order, within the token budget: one that `current` samples for
        (its prompt completes, or it decodes) gets its in-flight token as a one-token row fed on
        the device; one whose prompt `current` only partly computes gets its next chunk from the
        host. Each item's offset is what `current` computes for it. Then waiting requests are
        admitted as a normal schedule admits them. None, for the normal schedule to run after
        `current`, when a request needs what only the host has after `current` (penalties'
        history, a grammar's matcher, prompt logprobs) or the pool is short: this never preempts.
        A request `current` may stop on a token wastes its row, whose token is dropped, as with
        _decode_ahead; one `current` surely ends by length is left out."""
        head = self.waiting[0] if self.waiting else None
        if head is not None and _needs_host_state(head):
            return None
        item_of = {id(item.request): item for item in current.scheduled}.get
        nxt = SchedulerOutput(mixed_ahead=True)
        scheduled = nxt.scheduled
        budget, cap, kv = self.max_num_batched_tokens, self.chunk_cap, self.kv
        # Fed, and decoding in `current` (most rows): their blocks are counted and allocated in
        # one allocate_decode_slots pass.
        fed_decodes: list[Request] = []
        others: list[tuple[Request, int, int]] = []  # (request, tokens past its computed, of them in flight)
        needed = 0  # the blocks `others` take
        # Once per running request per step (W4 admits prompts beside ~1,000 of them, and the GPU
        # runs out of queued work if this is slow): _needs_host_state and Request's properties inlined.
        for r in self.running:
            if budget <= 0:
                break
            if r.needs_host_state:
                return None
            item = item_of(id(r))
            offset = 0 if item is None else item.num_tokens
            computed = r.num_computed_tokens + offset
            num_output = len(r.output_token_ids)
            known = len(r.prompt_token_ids) + num_output
            if computed >= known:  # `current` samples its next token
                if num_output + 1 >= r.output_limit:
                    continue  # that is its last token
                if offset == 1:
                    # A fed decode after a fed decode is `current`'s own item again (nothing
                    # changes items once scheduled), as _decode_ahead reuses them.
                    scheduled.append(item if item.fed and item.offset == 1 else ScheduledRequest(r, 1, 1, fed=True))
                    budget -= 1
                    fed_decodes.append(r)
                    continue
                scheduled.append(ScheduledRequest(r, 1, offset, fed=True))
                budget -= 1
                num_new = offset + 1
            else:
                num_tokens = min(known - computed, budget, cap)
                scheduled.append(ScheduledRequest(r, num_tokens, offset))
                budget -= num_tokens
                num_new = offset + num_tokens
            needed += kv.num_new_blocks(r, num_new)
            others.append((r, num_new, offset))
        if fed_decodes:
            if not kv.allocate_decode_slots(fed_decodes, 2, in_flight=1, reserve=needed):
                return None
        elif needed > kv.block_pool.num_free_blocks:
            return None
        for r, num_new, offset in others:
            if kv.allocate_slots(r, num_new, in_flight=offset) is None:
                return None  # (cache effects only: `needed` counted the blocks)
        if budget > 0:
            self._schedule_waiting(nxt, budget, time.monotonic(), ahead=True)
        if not nxt.scheduled:
            return None
        for item in nxt.scheduled:
            item.request.num_in_flight_tokens += item.num_tokens
        return nxt

    def hash_next_admissions(self) -> None:
        """Hash the prompt blocks of the waiting requests the next schedule may admit (deferred
        from arrival, Request.defer_hashes), as far as a step's token budget reaches. EngineCore
        calls it while a step runs on the GPU, so that the schedule after it, which the GPU waits
        for, only looks the hashes up. Already hashed requests cost one comparison each."""
        budget = self.max_num_batched_tokens
        for request in self.waiting:
            if budget <= 0:
                break
            num_tokens = len(request.prompt_token_ids) + len(request.output_token_ids)
            if request.next_block_end <= num_tokens:
                request._update_block_hashes()
            budget -= num_tokens - request.num_computed_tokens

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, now: float, ahead: bool = False) -> None:
        """Admit waiting requests in order while budget, seats and blocks last. ahead (a step
        scheduled before the one in flight is read): stop at a request that needs host state."""
        held_back: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if ahead and _needs_host_state(request):
                break
            if request.grammar is not None and not request.grammar.ready():
                held_back.append(self.waiting.popleft())  # compiling: it takes no seat meanwhile
                continue
            if request.grammar is not None and request.grammar.error is not None:
                self.waiting.popleft()
                self.finish_request(request, RequestStatus.FINISHED_ABORTED)
                self.failed.append(request)
                continue
            if request.next_block_end <= request.num_tokens:
                request._update_block_hashes()  # deferred from arrival (Request.defer_hashes)
            source = self._sibling_source(request)
            if source is False:
                held_back.append(self.waiting.popleft())
                continue
            if source is not None and not self.kv.enable_caching:
                computed_blocks, num_computed = self.kv.shared_prompt_blocks(source, request)
            else:
                computed_blocks, num_computed = self.kv.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_computed, budget, self.chunk_cap)
            if self.kv.allocate_slots(request, num_new, computed_blocks) is None:
                break
            self.waiting.popleft()
            request.num_computed_tokens = num_computed
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_computed
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(held_back))

    def _sibling_source(self, request: Request) -> Request | None | bool:
        """For a later child of an n > 1 request: wait (False) until the first child has computed
        the prompt, then borrow its blocks (the child); None when there is nothing to share."""
        if request.index == 0 or request.num_output_tokens:
            return None
        first = self.first_child.get(request.parent_id)
        if first is None or first.is_finished:
            return None
        if first.status == RequestStatus.RUNNING and first.num_computed_tokens >= first.num_prompt_tokens:
            return first
        return False

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def update_from_output(self, out: SchedulerOutput, sampled_requests: list[Request], tokens: list[int]
                           ) -> list[Request]:
        """Advance each scheduled request, append its sampled token and apply token-level stops.
        sampled_requests and tokens: the rows that sampled, in the runner's row order.

        Returns the requests that produced a token this step; finished ones are already freed.
        """
        finished = RequestStatus.FINISHED_STOPPED
        # Every row of a decode step ahead samples: its requests advance in the token pass
        # (one pass per step over ~1,000 rows instead of two).
        fold = out.ahead and not out.mixed_ahead and len(sampled_requests) == len(out.scheduled)
        if out.mixed_ahead:
            for item in out.scheduled:
                request = item.request
                request.num_in_flight_tokens -= item.num_tokens
                if request.status < finished:  # else stopped or aborted since: its rows are dropped
                    request.num_computed_tokens += item.num_tokens
        elif out.ahead and not fold:
            for item in out.scheduled:
                request = item.request
                request.num_in_flight_tokens -= 1
                if request.status < finished:  # else stopped or aborted since: its row is dropped
                    request.num_computed_tokens += 1
        elif not out.ahead:
            for item in out.scheduled:
                request = item.request
                if request.status < finished:
                    request.num_computed_tokens += item.num_tokens
        return self._append_tokens(sampled_requests, tokens, fold)

    def _append_tokens(self, sampled_requests: list[Request], tokens: list[int], advance: bool) -> list[Request]:
        """Append each sampled token and apply the token-level stops; advance: first read the
        request's one in-flight token back as computed (a decode step ahead)."""
        finished, length_capped = RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED
        updated, stopped = [], []
        # Once per running request per step: Request.append_output_token and _check_stop's common
        # case (stops on EOS and length only) are inlined.
        for request, token in zip(sampled_requests, tokens):
            if advance:
                request.num_in_flight_tokens -= 1
                if request.status >= finished:
                    continue  # stopped or aborted since the step was scheduled: its row is dropped
                request.num_computed_tokens += 1
            elif request.status >= finished:
                continue
            output = request.output_token_ids
            output.append(token)
            num_output = len(output)
            if request.next_block_end <= len(request.prompt_token_ids) + num_output:
                request._update_block_hashes()  # a block filled
            updated.append(request)
            if request.simple_stops:
                if token == request.stop_eos:
                    request.status = finished
                elif num_output >= request.output_limit:  # max_tokens, or max_model_len
                    request.status = length_capped
                else:
                    continue
            elif not self._check_stop(request):
                continue
            stopped.append(request)
        if stopped:
            self._finish_stopped(stopped)
        return updated

    def _finish_stopped(self, stopped: list[Request]) -> None:
        """finish_request for the running requests that stopped in one step (their status set),
        with one pass over the running list instead of a search and a removal each: a wave of W4's
        requests ends in the same few steps, ~30 at a time out of ~1,000."""
        if len(stopped) > 1:
            gone = set(map(id, stopped))
            kept = [r for r in self.running if id(r) not in gone]
            if len(kept) + len(stopped) == len(self.running):
                self.running[:] = kept
                for request in stopped:
                    self._release(request)
                return
        for request in stopped:  # (one, or not all of them running)
            self.finish_request(request, request.status)

    def _check_stop(self, request: Request) -> bool:
        params = request.sampling_params
        num_output = len(request.output_token_ids)
        grammar_done = request.grammar is not None and request.grammar.sync(request.output_token_ids)
        if num_output >= params.min_tokens:
            last = request.output_token_ids[-1]
            if not params.ignore_eos and last == request.eos_token_id:
                request.status = RequestStatus.FINISHED_STOPPED
                return True
            if last in params.stop_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = last
                return True
        if grammar_done:  # it accepted a stop token at the grammar's end (even with ignore_eos)
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if num_output >= request.max_tokens or len(request.prompt_token_ids) + num_output >= self.max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED  # _reaches_length, inlined (hot)
            return True
        return False

    def _reaches_length(self, request: Request, pending: int = 0) -> bool:
        """Whether the request is at its length limit once `pending` more tokens are appended."""
        return (request.num_output_tokens + pending >= request.max_tokens
                or request.num_tokens + pending >= self.max_model_len)

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """Finish (or abort) a request wherever it is, and give its blocks back."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = status
        self._release(request)

    def _release(self, request: Request) -> None:
        """A finished request's blocks go back and the scheduler forgets it."""
        self.kv.free(request)
        self.requests.pop(request.request_id, None)
        if self.first_child.get(request.parent_id) is request:
            del self.first_child[request.parent_id]


def _needs_host_state(r: Request) -> bool:
    """Whether scheduling r needs what the host only has once the step in flight is read: its
    history for penalties, its grammar's matcher, or its prompt logprobs' progress."""
    return r.needs_host_state  # fixed at arrival (Request.__post_init__)
