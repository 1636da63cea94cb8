"""A step's model inputs: built on the host with numpy, sent in one copy, kept in fixed buffers.

InputBuffers are the device tensors the model reads (input_ids, positions, slot_mapping,
block_tables, seq_lens, query_start_loc, logits_indices). They are allocated once, so a CUDA
graph captured over them stays valid. BatchBuilder writes each step's metadata into a pinned host
staging array, copies the used prefix to the device in one H2D copy, and scatters it into the
buffers with device copies. Nothing is read back, so building a batch never waits for the GPU.

Block tables change little from step to step, so the builder keeps a persistent host table and
rewrites a row only where its owner or length changed (block_tables.py). Every step is built with
numpy over whole columns, read from the requests with C-level maps; a step with prefill rows
copies each chunk's token ids row by row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, itemgetter

import numpy as np
import torch

from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.request import Request
from pagoda.runtime.core.scheduler import SchedulerOutput
from pagoda.runtime.worker.block_tables import BlockTables


class InputBuffers:
    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int, device: torch.device):
        self.max_tokens, self.max_seqs, self.max_blocks = max_tokens, max_seqs, max_blocks
        self.device = device
        i32, i64 = torch.int32, torch.int64
        self.input_ids = torch.zeros(max_tokens, dtype=i64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=i64, device=device)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=i64, device=device)
        self.seq_lens = torch.zeros(max_seqs, dtype=i32, device=device)
        self.query_start_loc = torch.zeros(max_seqs + 1, dtype=i32, device=device)
        self.block_tables = torch.zeros(max_seqs, max_blocks, dtype=i32, device=device)
        self.logits_indices = torch.zeros(max_seqs, dtype=i64, device=device)
        stage = 3 * max_tokens + 3 * max_seqs + 1 + max_seqs * max_blocks
        pin = device.type == "cuda"
        # Two host stages, used in turn: a step may not sync at all (a prefill chunk samples
        # nothing), so the stage written now must not be one whose copy may still be in flight.
        self.host_stages = [torch.zeros(stage, dtype=i32, pin_memory=pin) for _ in range(2)]
        self.copy_done = [torch.cuda.Event() if pin else None for _ in range(2)]
        self.device_stage = torch.zeros(stage, dtype=i32, device=device)
        self.turn = 0

    def reset_padding(self) -> None:
        """Inputs that are safe for any batch size: token 0 at position 0, writing and reading
        nothing. Graph capture runs on these."""
        self.input_ids.zero_()
        self.positions.zero_()
        self.slot_mapping.fill_(-1)
        self.seq_lens.zero_()
        self.query_start_loc.copy_(torch.arange(self.max_seqs + 1, dtype=torch.int32))

    def next_stage(self) -> np.ndarray:
        self.turn ^= 1
        event = self.copy_done[self.turn]
        if event is not None:
            event.synchronize()  # the copy from two steps ago; long done in practice
        return self.host_stages[self.turn].numpy()

    def send(self, layout: StageLayout) -> None:
        """One H2D copy of the used prefix of the stage, then device-side scatters into place."""
        n = layout.end
        self.device_stage[:n].copy_(self.host_stages[self.turn][:n], non_blocking=True)
        if self.copy_done[self.turn] is not None:
            self.copy_done[self.turn].record()
        d, t, s = self.device_stage, layout.tokens, layout.seqs
        self.input_ids[:t].copy_(d[layout.ids : layout.ids + t])
        self.positions[:t].copy_(d[layout.pos : layout.pos + t])
        self.slot_mapping[:t].copy_(d[layout.slots : layout.slots + t])
        self.seq_lens[:s].copy_(d[layout.seq_lens : layout.seq_lens + s])
        self.query_start_loc[: s + 1].copy_(d[layout.qsl : layout.qsl + s + 1])
        if layout.num_logits:
            self.logits_indices[: layout.num_logits].copy_(d[layout.logits : layout.logits + layout.num_logits])
        rows, width = layout.table_rows, layout.table_width
        if rows and width:
            self.block_tables[:rows, :width].copy_(d[layout.table : layout.table + rows * width].view(rows, width))


@dataclass(slots=True)
class StageLayout:
    """Offsets of each field in the staging array, for `tokens` (padded) rows and `seqs` seqs."""

    tokens: int
    seqs: int
    num_logits: int
    table_rows: int
    table_width: int
    ids: int = 0
    pos: int = 0
    slots: int = 0
    seq_lens: int = 0
    qsl: int = 0
    logits: int = 0
    table: int = 0
    end: int = 0

    def __post_init__(self) -> None:
        self.pos = self.ids + self.tokens
        self.slots = self.pos + self.tokens
        self.seq_lens = self.slots + self.tokens
        self.qsl = self.seq_lens + self.seqs
        self.logits = self.qsl + self.seqs + 1
        self.table = self.logits + self.num_logits
        self.end = self.table + self.table_rows * self.table_width


@dataclass(slots=True)
class StepBatch:
    num_tokens: int  # real tokens
    num_seqs: int  # real sequences
    padded_seqs: int  # what the model runs on: a graph bucket for decode, else num_seqs
    padded_tokens: int
    max_query_len: int
    max_seq_len: int
    num_decode_seqs: int = 0  # the leading one-token sequences of a mixed step
    sample_requests: list[Request] = field(default_factory=list)
    sample_all_rows: bool = False  # the sampled rows are exactly rows 0..num_seqs-1, in order
    # (request, first hidden row, first and last+1 prompt position it predicts) for prompt logprobs
    prompt_rows: list[tuple[Request, int, int, int]] = field(default_factory=list)
    layout: StageLayout | None = None  # where each field sits in the staged host array
    pad_seqs: int = 0  # >0: a decode step padded to this CUDA-graph bucket
    # A step scheduled ahead of a mixed one: the rows whose input id is the step in flight's
    # sample (the runner copies it in on the device) and their requests, and per sampled row the
    # tokens its request has in flight (1 for those rows, else 0).
    fed_rows: np.ndarray | None = None
    fed_requests: list[Request] = field(default_factory=list)
    sample_pending: list[int] = field(default_factory=list)


def _column(values, n: int) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=n)


_REQUEST, _NUM_TOKENS, _OFFSET, _FED = (attrgetter(a) for a in ("request", "num_tokens", "offset", "fed"))
_COMPUTED, _PROMPT, _OUTPUT = (attrgetter(a) for a in ("num_computed_tokens", "prompt_token_ids", "output_token_ids"))
_PROMPT_LOGPROBS = attrgetter("sampling_params.prompt_logprobs")


def _token_at(r: Request, index: int) -> int:
    """Token `index` of the request's prompt + output."""
    num_prompt = len(r.prompt_token_ids)
    return r.prompt_token_ids[index] if index < num_prompt else r.output_token_ids[index - num_prompt]


def batch_order(scheduled: list) -> tuple[list, list]:
    """The scheduled requests in row order, and the one-token ones among them. One-token rows come
    first, so attention can send them to the decode kernel as one slice."""
    decodes = [s for s in scheduled if s.num_tokens == 1]
    if 0 < len(decodes) < len(scheduled):
        scheduled = decodes + [s for s in scheduled if s.num_tokens != 1]
    return scheduled, decodes


class BatchBuilder:
    def __init__(self, buffers: InputBuffers, block_size: int):
        self.buffers = buffers
        self.block_size = block_size
        self.tables = BlockTables(buffers.max_seqs, buffers.max_blocks)
        self._rows = np.arange(buffers.max_seqs + 1)
        self._tokens = np.arange(buffers.max_tokens)

    def build(self, sched: SchedulerOutput, kv: KVCacheManager, pad_seqs: int | None,
              pad_tokens: int | None = None) -> StepBatch:
        """Write the step's inputs into the buffers. pad_seqs (decode steps only) pads the batch
        to that many one-token sequences; pad_tokens (mixed-step graphs) pads it to that many
        rows that belong to no sequence."""
        scheduled = sched.scheduled
        num_seqs = len(scheduled)
        # A step scheduled ahead is one decode token per request by construction.
        num_tokens = num_seqs if sched.ahead else sum(s.num_tokens for s in scheduled)
        # A step scheduled ahead runs one token past what the requests have computed and hold:
        # that token is still in flight, and the runner copies it into input_ids on the device.
        ahead = int(sched.ahead)
        batch = None
        if num_tokens == num_seqs and not sched.mixed_ahead:
            batch = self._decode_rows(list(map(_REQUEST, scheduled)), kv, ahead, pad_seqs, pad_tokens)
        if batch is None:
            batch = self._mixed_rows(sched, kv, ahead, pad_seqs, pad_tokens)
        self.buffers.send(batch.layout)
        batch.pad_seqs = pad_seqs or 0
        return batch

    def _decode_rows(self, requests: list[Request], kv: KVCacheManager, ahead: int, pad_seqs: int | None,
                     pad_tokens: int | None) -> StepBatch | None:
        """A step of one token per sequence, each the sequence's last known token (or the one in
        flight), so every row samples: built with numpy over whole columns. None when a row is a
        one-token prefill chunk (it samples nothing, and may want prompt logprobs): the general
        path builds that step."""
        bs, n = self.block_size, len(requests)
        pos = _column(map(_COMPUTED, requests), n)
        if ahead:
            ids = None  # in flight: the runner copies them in on the device
        else:
            ids = []
            for r, start in zip(requests, pos.tolist()):
                prompt, output = r.prompt_token_ids, r.output_token_ids
                if start + 1 != len(prompt) + len(output):
                    return None
                ids.append(output[-1] if output else prompt[-1])
        width = self.tables.sync(requests, kv)
        padded = pad_seqs or n
        padded_tokens = pad_tokens or padded
        if ahead:
            pos += 1
        batch = StepBatch(n, n, padded, padded_tokens, 1, int(pos.max()) + 1, num_decode_seqs=n,
                          sample_requests=requests, sample_all_rows=True)
        layout = batch.layout = StageLayout(padded_tokens, padded, 0, n, width)
        st = self.buffers.next_stage()
        st[layout.ids : layout.ids + n] = 0 if ids is None else ids
        st[layout.pos : layout.pos + n] = pos
        blocks = self.tables.table[self._rows[:n], pos // bs]
        st[layout.slots : layout.slots + n] = blocks * bs + pos % bs
        st[layout.seq_lens : layout.seq_lens + n] = pos + 1
        st[layout.qsl : layout.qsl + n + 1] = self._rows[: n + 1]
        self._pad(st, layout, n, n)
        st[layout.table : layout.end].reshape(n, width)[:] = self.tables.table[:n, :width]
        return batch

    def _mixed_rows(self, sched: SchedulerOutput, kv: KVCacheManager, ahead: int, pad_seqs: int | None,
                    pad_tokens: int | None) -> StepBatch:
        scheduled = sched.scheduled
        bs = self.block_size
        num_seqs = len(scheduled)
        # Per-row columns, read with C-level maps and computed with numpy: W4 admits prompts
        # beside ~1,000 decodes, and the GPU waits for this step (a Python loop over the rows cost
        # ~1.5 ms of it).
        n = _column(map(_NUM_TOKENS, scheduled), num_seqs)
        fed = _column(map(_FED, scheduled), num_seqs)
        offset = _column(map(_OFFSET, scheduled), num_seqs)
        one = n == 1
        nd = int(one.sum())
        if 0 < nd < num_seqs and not one[:nd].all():  # batch_order: the one-token rows first
            order = np.argsort(~one, kind="stable")
            scheduled = list(itemgetter(*order.tolist())(scheduled))
            n, fed, offset = n[order], fed[order], offset[order]
        requests = list(map(_REQUEST, scheduled))
        start = _column(map(_COMPUTED, requests), num_seqs) + offset + ahead
        end = start + n
        known = (_column(map(len, map(_PROMPT, requests)), num_seqs)
                 + _column(map(len, map(_OUTPUT, requests)), num_seqs))
        row_end = np.cumsum(n)
        row0 = row_end - n
        num_tokens = int(row_end[-1])
        padded = pad_seqs or num_seqs
        padded_tokens = pad_tokens or num_tokens + (padded - num_seqs)
        width = self.tables.sync(requests, kv)
        table = self.tables.table

        # Sampled rows: those that end their request's known tokens (a fed row's known tokens
        # include the one in flight), first on the host: whether they are all rows decides the layout.
        batch = StepBatch(num_tokens, num_seqs, padded, padded_tokens, int(n.max()), int(end.max()),
                          num_decode_seqs=nd)
        sampled = end == known + ahead + fed
        sampled_list = sampled.tolist()
        batch.sample_requests = list(compress(requests, sampled_list))
        logits_rows = row_end[sampled] - 1
        if sched.mixed_ahead:
            batch.sample_pending = fed[sampled].tolist()
        prompt_logprobs = list(map(_PROMPT_LOGPROBS, requests))
        if prompt_logprobs.count(None) != num_seqs:
            for i in (i for i, k in enumerate(prompt_logprobs) if k is not None):
                # Row p predicts prompt token p + 1; take the ones not reported yet.
                r, s0, e0 = requests[i], int(start[i]), int(end[i])
                first = max(s0 + 1, 1 + r.num_prompt_logprobs)
                last = min(e0 + 1, r.num_prompt_tokens)
                if first < last:
                    batch.prompt_rows.append((r, int(row0[i]) + first - 1 - s0, first, last))
        batch.sample_all_rows = len(batch.sample_requests) == num_seqs == num_tokens
        layout = batch.layout = StageLayout(
            padded_tokens, padded, 0 if batch.sample_all_rows else len(batch.sample_requests), num_seqs, width
        )
        st = self.buffers.next_stage()
        ids = st[layout.ids : layout.ids + padded_tokens]

        # Positions and slots of every token at once: token t of row i is at start[i] + t - row0[i].
        p = np.repeat(start - row0, n) + self._tokens[:num_tokens]
        st[layout.pos : layout.pos + num_tokens] = p
        blocks = table.ravel().take(np.repeat(self._rows[:num_seqs] * table.shape[1], n) + p // bs)
        st[layout.slots : layout.slots + num_tokens] = blocks.astype(np.int64) * bs + p % bs
        qsl = st[layout.qsl : layout.qsl + num_seqs + 1]
        qsl[0] = 0
        qsl[1:] = row_end
        # Input ids: the one-token rows lead (batch_order), row i being scheduled[i]; a fed row's
        # is 0 (the runner copies its token in), as is a step ahead's (in flight).
        if ahead or fed[:nd].all():
            ids[:nd] = 0
        else:
            ids[:nd] = [0 if f else _token_at(r, i) for r, f, i in zip(requests, fed[:nd].tolist(), start.tolist())]
        if sched.mixed_ahead and not ahead:
            batch.fed_rows = np.flatnonzero(fed[:nd])
            batch.fed_requests = list(compress(requests, fed[:nd].tolist()))
        for i in range(nd, num_seqs):
            s0, r0 = int(start[i]), int(row0[i])
            ids[r0 : int(row_end[i])] = requests[i].token_ids_slice(s0, s0 + int(n[i]))
        st[layout.seq_lens : layout.seq_lens + num_seqs] = end
        self._pad(st, layout, num_tokens, num_seqs)
        if layout.num_logits:
            st[layout.logits : layout.logits + layout.num_logits] = logits_rows
        st[layout.table : layout.end].reshape(num_seqs, width)[:] = table[:num_seqs, :width]
        return batch

    @staticmethod
    def _pad(st: np.ndarray, layout: StageLayout, num_tokens: int, num_seqs: int) -> None:
        """Padding rows: token 0 at position 0, no cache write, an empty context, one query row each."""
        t, padded = layout.tokens, layout.seqs
        st[layout.ids + num_tokens : layout.ids + t] = 0
        st[layout.pos + num_tokens : layout.pos + t] = 0
        st[layout.slots + num_tokens : layout.slots + t] = -1
        st[layout.seq_lens + num_seqs : layout.seq_lens + padded] = 0
        if padded > num_seqs:  # decode padding: one-token sequences of no context
            st[layout.qsl + num_seqs + 1 : layout.qsl + padded + 1] = np.arange(num_tokens + 1, t + 1)
