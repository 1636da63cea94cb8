"""The host copy of a step's block tables, kept across steps and touched only where it changed.

Row i of the table holds the block ids of the step's i-th sequence. From one step to the next
almost nothing changes: the same requests sit in the same rows, and a decode step adds a block to
about one row in block_size. So each row remembers whose block list it mirrors (the KV manager's
list object for that request, which lives until the request is freed or preempted) and how much of
it; a step rewrites the rows whose owner changed, moving rows that merely shifted (a request
before them finished) with one numpy copy, and appends the new blocks of the rows that grew.
"""

from __future__ import annotations

from operator import is_

import numpy as np

from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager


class BlockTables:
    def __init__(self, max_seqs: int, max_blocks: int):
        self.table = np.zeros((max_seqs, max_blocks), dtype=np.int32)
        self.row_src: list[list | None] = [None] * max_seqs  # the block list each row mirrors
        self.row_len = np.zeros(max_seqs, dtype=np.int64)  # how many of its blocks the row holds

    def sync(self, requests: list, kv: KVCacheManager) -> int:
        """Make rows 0..len(requests)-1 hold the requests' blocks; returns the widest row's length."""
        n = len(requests)
        lists = kv.req_to_blocks
        srcs = [lists.get(r.request_id, ()) for r in requests]
        if not all(map(is_, srcs, self.row_src[:n])):
            self._reassign(srcs)
        lens = np.fromiter(map(len, srcs), dtype=np.int64, count=n)
        row_len, table = self.row_len, self.table
        for i in np.flatnonzero(lens != row_len[:n]).tolist():
            start, src = int(row_len[i]), srcs[i]
            table[i, start : len(src)] = [b.block_id for b in src[start:]]
        row_len[:n] = lens
        return int(lens.max()) if n else 0

    def _reassign(self, srcs: list) -> None:
        """Rows whose owner changed: a row whose new owner sat in another row takes that row's
        contents (one fancy-indexed copy, which reads every source before writing); an owner new
        to the table starts empty and is filled by sync's growth pass."""
        prev = self.row_src
        where = {id(src): j for j, src in enumerate(prev) if src is not None}
        dst, src_rows, fresh = [], [], []
        for i, src in enumerate(srcs):
            if src is prev[i]:
                continue
            j = where.get(id(src))
            if j is None:
                fresh.append(i)
            else:
                dst.append(i)
                src_rows.append(j)
        if dst:
            self.table[dst] = self.table[src_rows]
            self.row_len[dst] = self.row_len[src_rows]
        self.row_len[fresh] = 0
        prev[: len(srcs)] = srcs
