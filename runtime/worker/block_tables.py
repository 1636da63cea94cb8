"""The host copy of a step's block tables, kept across steps and touched only where it changed.

Row i of the table holds the block ids of the step's i-th sequence. From one step to the next
almost nothing changes: the same requests sit in the same rows, and a decode step adds a block to
about one row in block_size. So each row remembers whose block list it mirrors (the KV manager's
list object for that request, which lives until the request is freed or preempted) and how much of
it; a step rewrites the rows whose owner changed, moving rows that merely shifted (a request
before them finished) with one numpy copy, and appends the new blocks of the rows that grew.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter, is_

import numpy as np

from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager


class BlockTables:
    def __init__(self, max_seqs: int, max_blocks: int):
        self.table = np.zeros((max_seqs, max_blocks), dtype=np.int32)
        self.row_src: list[list | None] = [None] * max_seqs  # the block list each row mirrors
        self.row_ids = np.zeros(max_seqs, dtype=np.uint64)  # id() of each, 0 for None
        self.row_len = np.zeros(max_seqs, dtype=np.int64)  # how many of its blocks the row holds
        # The requests of the last sync's rows, how many, and the KV manager's free count then.
        self.row_req: list = [None] * max_seqs
        self.num_rows = 0
        self.num_frees = -1

    def sync(self, requests: list, kv: KVCacheManager) -> int:
        """Make rows 0..len(requests)-1 hold the requests' blocks; returns the widest row's length."""
        n = len(requests)
        if n <= self.num_rows and kv.num_frees == self.num_frees and all(map(is_, requests, self.row_req[:n])):
            # The same requests in the same rows as the last sync, and no list replaced since (a
            # request gets a new block list only after a free): each row's list is the one it
            # mirrors. Most decode steps; it saves a dict lookup per row.
            srcs = self.row_src[:n]
        else:
            srcs = list(map(kv.req_to_blocks.get, map(_REQUEST_ID, requests), repeat((), n)))
            if not all(map(is_, srcs, self.row_src[:n])):
                self._reassign(srcs)
            self.row_req[:n] = requests
            self.num_frees = kv.num_frees
        self.num_rows = n
        lens = np.fromiter(map(len, srcs), dtype=np.int64, count=n)
        row_len = self.row_len
        grown = np.flatnonzero(lens != row_len[:n])
        if grown.size:
            # The new blocks of every grown row in one flat write (a decode step grows ~1 row in
            # block_size, an admission a prompt's worth).
            starts, counts = row_len[grown], lens[grown] - row_len[grown]
            ids = [b.block_id for i, start in zip(grown.tolist(), starts.tolist()) for b in srcs[i][start:]]
            first = np.cumsum(counts) - counts
            cols = np.arange(len(ids)) - np.repeat(first - starts, counts)
            self.table[np.repeat(grown, counts), cols] = ids
        row_len[:n] = lens
        return int(lens.max()) if n else 0

    def _reassign(self, srcs: list) -> None:
        """Rows whose owner changed: a row whose new owner sat in another row takes that row's
        contents (one fancy-indexed copy, which reads every source before writing); an owner new
        to the table starts empty and is filled by sync's growth pass.

        Owners are matched by identity, through their ids with numpy: when requests finish, every
        row behind them shifts (W4: ~1,000 rows, in a wave of steps at the end), and a dict of
        every row's owner plus a loop over the rows cost ~0.3 ms a step. row_ids are the ids of the
        live lists that row_src holds, so equal ids are the same list."""
        n = len(srcs)
        old_ids, new_ids = self.row_ids, np.fromiter(map(id, srcs), dtype=np.uint64, count=n)
        changed = np.flatnonzero(new_ids != old_ids[:n])
        # A list can sit in two rows (one left over past an earlier, longer batch): take the
        # last, as a dict of every row's owner would.
        order = np.argsort(old_ids, kind="stable")
        sorted_ids = old_ids[order]
        at = np.maximum(np.searchsorted(sorted_ids, new_ids[changed], side="right") - 1, 0)
        found = sorted_ids[at] == new_ids[changed]  # (an empty row's 0 never matches)
        dst, src_rows = changed[found], order[at[found]]
        if dst.size:
            self.table[dst] = self.table[src_rows]
            self.row_len[dst] = self.row_len[src_rows]
        self.row_len[changed[~found]] = 0
        old_ids[:n] = new_ids
        self.row_src[:n] = srcs


_REQUEST_ID = attrgetter("request_id")
