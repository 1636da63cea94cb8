"""BlockPool: every KV block of the cache, their reference counts and the prefix cache.

A block with no reference sits in the free queue, which is also the LRU of the prefix cache: a
freed block keeps its hash and stays findable until it reaches the head of the queue and is handed
out again. Freeing appends at the tail, allocation pops from the head, so the least recently used
cached block is evicted first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from pagoda.runtime.core.kv.block_hash import BlockHash


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set once the block is full and cached


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # block_id -> block, in LRU order (head = next to hand out).
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[BlockHash, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot allocate {n} blocks: only {self.num_free_blocks} free")
        # _evict, inlined: once per block handed out (an admitted W4 prompt takes ~40).
        pop, cached = self.free_queue.popitem, self.cached
        out = [pop(False)[1] for _ in range(n)]
        for block in out:
            if block.block_hash is not None:
                if cached.get(block.block_hash) is block:
                    del cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference to blocks found in the prefix cache (or shared by a sibling)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVBlock]) -> None:
        """Drop one reference each; blocks that reach zero join the LRU tail in the given order.

        Callers pass a request's blocks tail first, so a prefix's last blocks are evicted before
        its first ones, which more requests are likely to share.
        """
        free_queue = self.free_queue  # once per block of every finished request: kept tight
        for block in ordered_blocks:
            ref_cnt = block.ref_cnt
            if ref_cnt == 1:
                block.ref_cnt = 0
                free_queue[block.block_id] = block
            elif ref_cnt > 1:
                block.ref_cnt = ref_cnt - 1
            else:
                raise AssertionError(f"block {block.block_id} freed more often than taken")

    def cache_full_block(self, block: KVBlock, block_hash: BlockHash) -> None:
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:
            return  # an identical block is already cached; this one stays private
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def cache_full_blocks(self, blocks: list[KVBlock], block_hashes: list[BlockHash], start: int, end: int) -> None:
        """cache_full_block(blocks[i], block_hashes[i]) for i in range(start, end), in one loop."""
        if not self.enable_caching:
            return
        cached = self.cached
        for block, block_hash in zip(blocks[start:end], block_hashes[start:end]):
            # (A block whose twin is cached already stays private.)
            if block.block_hash is None and block_hash not in cached:
                block.block_hash = block_hash
                cached[block_hash] = block

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None
