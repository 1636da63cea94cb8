"""Token embedding and LM head, each rank holding a contiguous slice of the vocabulary.

The vocabulary is cut into equal shards of ceil(vocab / tp) rows; the last one is padded with zero
rows. The embedding looks up the ids in its own shard, zeroes the rest and all-reduces, so every
rank ends with the full embedding. The LM head computes its shard's logits and gathers them on
rank 0, the one rank that samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagoda.runtime.layers.parallel_state import current_tp
from pagoda.runtime.layers.weight_slice import narrow, shape_of


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.tp = current_tp()
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // self.tp.size)
        self.vocab_start = self.tp.rank * self.shard_size
        # Zeros, not empty: the padding rows of the last shard are never loaded.
        self.weight = nn.Parameter(torch.zeros(self.shard_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded) -> None:
        rows = min(self.shard_size, shape_of(loaded)[0] - self.vocab_start)
        param.data[:rows].copy_(narrow(loaded, 0, self.vocab_start, rows))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.shard_size)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill(outside[:, None], 0))


class ParallelLMHead(VocabParallelEmbedding):
    """hidden -> logits over the full vocabulary on rank 0; may share its weight with the
    embedding."""

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.tp.gather_last_dim(F.linear(hidden, self.weight))
        return logits[..., : self.vocab_size]
