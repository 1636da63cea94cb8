"""An offline batch's requests handed to the engine a few steps ahead of its scheduler.

Adding a request is host work: validation, the output state and its detokenizer, the core's
Request. For W4's 1,024 prompts that was about 150 ms on a 2-core CPU before the first step was
launched, with the GPU idle all along (e2e/results/feed-ab-172915a/). The scheduler only ever
looks at the head of its waiting queue, as far as one step's token budget reaches. So the feed
adds requests only until the queue holds LEAD_STEPS budgets of prompt tokens not yet scheduled,
and adds more between steps. Between two steps the GPU is running the step launched ahead
(EngineCore.step), so those adds cost it nothing.

Each schedule sees the same head of the queue as it would with every request added first, so the
steps are the same. The exception is a prompt whose prefix is cached: it takes less of the budget
than its length, so a step may admit past the lead. When a step drains the queue while prompts are
left, the lead doubles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

# Budgets of unscheduled prompt tokens kept waiting: the first step() call schedules two steps
# (the one it runs and the one it launches ahead), and each later call one.
LEAD_STEPS = 3


class RequestFeed:
    """add(item) adds one request and returns its prompt length; items are added in order."""

    def __init__(self, items: Iterable, add: Callable[[object], int], waiting, budget_tokens: int | None):
        self._items: Iterator = iter(items)
        self._add = add
        self._waiting = waiting  # the scheduler's queue (a deque of Requests), read from the tail
        # None: the engine's budget is unknown here, so every request goes in at once.
        self.lead = None if budget_tokens is None else LEAD_STEPS * budget_tokens
        self.done = False
        self.failed = False  # an add raised (a prompt that failed validation): nothing more is added
        self._topped_up = False

    def top_up(self) -> None:
        """Add requests until the waiting queue holds the lead's prompt tokens, or none are left."""
        if self.done:
            return
        have = 0
        if self.lead is not None:
            if self._topped_up and not self._waiting:
                self.lead *= 2  # a step took every waiting request: cached prefixes ran past the lead
            self._topped_up = True
            have = self._waiting_tokens()
        while self.lead is None or have < self.lead:
            item = next(self._items, _END)
            if item is _END:
                self.done = True
                return
            try:
                have += self._add(item)  # a request with n > 1 counts its prompt once: more is added, not less
            except Exception:
                self.failed = self.done = True
                raise

    def _waiting_tokens(self) -> int:
        """Prompt tokens of the waiting requests, from the tail (the newest) until the lead is met."""
        total = 0
        for request in reversed(self._waiting):
            total += len(request.prompt_token_ids) - request.num_computed_tokens
            if total >= self.lead:
                break
        return total


_END = object()
