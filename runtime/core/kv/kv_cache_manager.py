"""KVCacheManager: each request's block table, allocated as its tokens arrive, over a BlockPool.

It answers the scheduler's three questions: how much of a new request's prompt is already cached
(get_computed_blocks), whether a request can have slots for its next tokens (allocate_slots), and
what to give back when a request finishes or is preempted (free).

When every layer attends through a sliding window (sliding_window: the widest), a block wholly
before the window of the request's next query is never read again: allocate_slots gives it back
at once, and the table keeps null_block in its place, so positions still map to table columns.
Long requests then hold about window / block_size blocks, whatever their length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagoda.runtime.core.kv.block_pool import BlockPool, KVBlock

if TYPE_CHECKING:
    from pagoda.runtime.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 sliding_window: int | None = None):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.sliding_window = sliding_window
        # Stands in for a block given back under the window: no pool block, and no kernel reads it.
        self.null_block = KVBlock(0)
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # how many of a request's blocks are hashed
        self.num_dropped_blocks: dict[str, int] = {}  # leading blocks given back under the window
        # Per request, a token count up to which allocate_slots has nothing to do: its blocks hold
        # that many tokens and none of them completes a block not yet cached. allocate_decode_slots
        # checks every running request every step (W4: ~1,000 rows), and this makes the common
        # case one lookup and one comparison; past it the full check (_has_room) decides.
        self.room_end: dict[str, int] = {}
        # Frees so far: a request's block list is a new list object only after a free, so a
        # mirror of the lists (BlockTables) may keep its rows' lists while this is unchanged.
        self.num_frees = 0
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    def usage(self) -> float:
        return self.block_pool.usage()

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of the request, in whole blocks.

        It never covers the whole sequence: the last token is always computed, because its logits
        are needed to sample the next one.
        """
        if not self.enable_caching or request.wants_prompt_logprobs:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += len(blocks) * self.block_size
        return blocks, len(blocks) * self.block_size

    def shared_prompt_blocks(self, source: Request, request: Request) -> tuple[list[KVBlock], int]:
        """Full prompt blocks a sibling (n > 1) may borrow from the first child, which computed them."""
        computed = min(source.num_computed_tokens, source.num_prompt_tokens)
        n = min(computed // self.block_size, (request.num_tokens - 1) // self.block_size)
        if self.num_dropped_blocks.get(source.request_id):
            return [], 0  # its first blocks are gone (sliding window): nothing to borrow from 0
        blocks = self.req_to_blocks.get(source.request_id, [])[:n]
        return blocks, len(blocks) * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVBlock] | None = None,
        in_flight: int = 0,
    ) -> list[KVBlock] | None:
        """Give the request room for num_new_tokens more tokens; None (and no change) if it can't.

        new_computed_blocks are prefix-cache hits for a request being scheduled for the first time;
        its num_computed_tokens must not yet count them. in_flight: of num_new_tokens, those the
        step on the GPU computes (a step scheduled ahead): the window moves past them too.
        """
        if self.sliding_window is not None:
            self._drop_out_of_window(request, in_flight)
        if not new_computed_blocks and self._has_room(request, num_new_tokens):
            return []
        return self._allocate(request, num_new_tokens, new_computed_blocks or [])

    def _drop_out_of_window(self, request: Request, in_flight: int = 0) -> None:
        """Give back the blocks that lie wholly before the window of the request's next query
        (position num_computed_tokens + in_flight, which sees from there - window + 1 on: the
        same bound the attention kernels start their reads at). A block the step in flight still
        reads may go: whatever reuses it is written by a later step on the same stream."""
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return
        first_needed = max(0, request.num_computed_tokens + in_flight - self.sliding_window + 1) // self.block_size
        start = self.num_dropped_blocks.get(request.request_id, 0)
        if first_needed <= start:
            return
        dropped = blocks[start:first_needed]
        blocks[start:first_needed] = [self.null_block] * len(dropped)
        self.num_dropped_blocks[request.request_id] = first_needed
        # Cached blocks stay findable in the LRU for other requests with the same prefix.
        self.block_pool.free_blocks(list(reversed(dropped)))

    def num_live_blocks(self, request: Request) -> int:
        """Blocks the request holds from the pool (its table, less the blocks given back)."""
        blocks = self.req_to_blocks.get(request.request_id, ())
        return len(blocks) - self.num_dropped_blocks.get(request.request_id, 0)

    def _has_room(self, request: Request, num_new_tokens: int) -> bool:
        """The common decode case, checked without building anything: the request's blocks hold
        the new tokens and no block filled up, so there is nothing to allocate or cache."""
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks is None:
            return False
        total = request.num_computed_tokens + num_new_tokens
        full = min(total // self.block_size, len(request.block_hashes))
        return total <= len(blocks) * self.block_size and full <= self.num_cached_blocks.get(
            request.request_id, 0
        )

    def allocate_decode_slots(self, requests: list[Request], num_new_tokens: int, in_flight: int = 0,
                              reserve: int = 0) -> bool:
        """allocate_slots(r, num_new_tokens, in_flight=in_flight) for every running request, or for
        none (False) when the pool cannot give them all their new blocks and `reserve` more (which
        the caller allocates next). Most requests have room already (room_end, then _has_room,
        inlined: one pass per step over every running request), so only the rest are allocated."""
        if self.sliding_window is not None:
            if sum(self.num_new_blocks(r, num_new_tokens) for r in requests) + reserve > self.block_pool.num_free_blocks:
                return False
            for r in requests:
                self.allocate_slots(r, num_new_tokens, in_flight=in_flight)
            return True
        bs, tables, num_cached, room = self.block_size, self.req_to_blocks, self.num_cached_blocks, self.room_end.get
        rest, needed = [], 0
        for r in requests:
            total = r.num_computed_tokens + num_new_tokens
            if total <= room(r.request_id, -1):
                continue
            blocks = tables.get(r.request_id, ())
            if total > len(blocks) * bs:
                needed += -(-total // bs) - len(blocks)
            elif min(total // bs, len(r.block_hashes)) <= num_cached.get(r.request_id, 0):
                continue  # room, and no block newly full to cache
            rest.append(r)
        if needed + reserve > self.block_pool.num_free_blocks:
            return False
        for r in rest:
            self._allocate(r, num_new_tokens, [])
        return True

    def num_new_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Blocks allocate_slots would take from the pool for a running request (no cache hits)."""
        total = request.num_computed_tokens + num_new_tokens
        return max(cdiv(total, self.block_size) - len(self.req_to_blocks.get(request.request_id, ())), 0)

    def _allocate(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVBlock]
    ) -> list[KVBlock] | None:
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        total = num_computed + num_new_tokens
        num_needed = cdiv(total, self.block_size) - len(blocks) - len(new_computed_blocks)
        # Cached hits that sit in the free queue stop being free once we take them.
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_needed + num_evictable_hits > self.block_pool.num_free_blocks:
            return None
        self.block_pool.touch(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(max(num_needed, 0))
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        blocks.extend(new_computed_blocks)
        blocks.extend(new_blocks)
        num_cached = self._cache_full_blocks(request, blocks, total)
        bs = self.block_size
        self.room_end[request.request_id] = min(len(blocks) * bs, (num_cached + 1) * bs - 1)
        return new_blocks

    def _cache_full_blocks(self, request: Request, blocks: list[KVBlock], num_tokens: int) -> int:
        """Cache the request's blocks that num_tokens fill; returns how many are cached now."""
        # A block is cached once its tokens are known and scheduled; the forward pass writes every
        # layer's KV for the whole batch before any attention reads it, so a request scheduled in
        # the same step may already hit it.
        start = self.num_cached_blocks.get(request.request_id, 0)
        end = min(num_tokens // self.block_size, len(request.block_hashes))
        if end > start:
            self.block_pool.cache_full_blocks(blocks, request.block_hashes, start, end)
        num_cached = self.num_cached_blocks[request.request_id] = max(start, end)
        return num_cached

    def free(self, request: Request) -> None:
        self.num_frees += 1
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.room_end.pop(request.request_id, None)
        dropped = self.num_dropped_blocks.pop(request.request_id, 0)
        self.block_pool.free_blocks(reversed(blocks[dropped:] if dropped else blocks))

    def num_wasted_slots(self, request: Request) -> int:
        """Allocated slots the request has not filled and no launched step is filling: under one
        block by construction."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        return len(blocks) * self.block_size - request.num_computed_tokens - request.num_in_flight_tokens
