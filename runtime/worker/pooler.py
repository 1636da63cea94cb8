"""Pooler: each prompt's final-norm hidden states -> one vector, as its chunks are computed.

The pooling runner sends prompts through the same scheduler, KV cache and chunked prefill as
generation; instead of sampling, each step hands its hidden states here. LAST takes the prompt's
last row, CLS its first, MEAN the average of all rows, summed in float32 across the chunks of a
long prompt (the running sum lives here between steps). A chunk that starts at position 0 starts
the prompt afresh, so a preempted request, recomputed from its start, is pooled once. MEAN and CLS
need every row's hidden state, so the engine runs them without prefix caching (a cached prefix is
never computed); LAST needs only the last row, which is always computed.

A checkpoint's sentence-transformers Dense modules then project the completed vectors
(worker/st_dense.py). The vectors come back raw (float32, unnormalized): normalization and matryoshka truncation are
per request, done by the frontend (frontend/pooling.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pagoda.runtime.core.request import Request
from pagoda.runtime.core.scheduler import ScheduledRequest


class Pooler:
    def __init__(self, pooling_type: str, project=None):
        self.pooling_type = pooling_type
        self.project = project  # the checkpoint's Dense modules (st_dense.DenseStack), or None
        self.partial: dict[str, tuple[Request, torch.Tensor]] = {}  # MEAN: running sum; CLS: row 0

    def pool(self, hidden: torch.Tensor, scheduled: Sequence[ScheduledRequest]
             ) -> tuple[list[str], torch.Tensor] | None:
        """The ids of the prompts this step completes and their pooled vectors (on the device, not
        yet copied back), or None. `scheduled` is in the batch's row order."""
        self._forget_finished()
        kind, done_ids, done_rows = self.pooling_type, [], []
        if kind == "MEAN":
            sums = segment_sums(hidden, [s.num_tokens for s in scheduled])
        row0 = 0
        for i, item in enumerate(scheduled):
            r, n = item.request, item.num_tokens
            start = r.num_computed_tokens
            end = start + n
            done = end == r.num_prompt_tokens
            if kind == "LAST":
                if done:
                    done_ids.append(r.request_id)
                    done_rows.append(hidden[row0 + n - 1].float())
                row0 += n
                continue
            if start == 0:
                self.partial.pop(r.request_id, None)  # a first chunk, or a preempted prompt again
                value = hidden[row0].float() if kind == "CLS" else sums[i]
            else:
                previous = self.partial.pop(r.request_id)[1]
                value = previous if kind == "CLS" else previous + sums[i]
            if done:
                done_ids.append(r.request_id)
                done_rows.append(value / r.num_prompt_tokens if kind == "MEAN" else value)
            else:
                self.partial[r.request_id] = (r, value)
            row0 += n
        if not done_ids:
            return None
        vectors = torch.stack(done_rows)
        return done_ids, vectors if self.project is None else self.project(vectors)

    def _forget_finished(self) -> None:
        """Running sums of prompts aborted between chunks."""
        if self.partial:
            for request_id in [k for k, (r, _) in self.partial.items() if r.is_finished]:
                del self.partial[request_id]


def segment_sums(hidden: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Per-sequence float32 sums of consecutive row groups, in one scatter-add on the device."""
    host = torch.from_numpy(np.repeat(np.arange(len(counts)), counts))
    if hidden.is_cuda:  # pinned and non-blocking: a pageable copy would wait for the forward
        host = host.pin_memory()
    segments = host.to(hidden.device, non_blocking=True)
    rows = hidden[: segments.numel()].float()
    return torch.zeros(len(counts), hidden.shape[-1], device=hidden.device).index_add_(0, segments, rows)
