"""Teacher-forced logits agree with transformers to 1e-4 in fp32, through the three ways a step
reaches the paged KV cache: a first prefill, a chunk that extends a cached prefix, and one-token
decode steps. Two sequences run side by side in every step (varlen batching), and their block
tables are interleaved, so a wrong block lookup shows up as a wrong logit."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.tools.tiny_models import FAMILIES
from pagoda.runtime.worker.attention_context import AttentionContext, attention_context
from pagoda.runtime.worker.model_loader import load_model

BLOCK = 8
# Per sequence: first prefill, then the extension chunk, then decode steps. Long enough that the
# tiny windowed families (window 12) drop keys from view in every phase.
PHASES = {"prefill": (21, 30), "extend": (14, 9), "decode": (1, 1)}
DECODE_STEPS = 5
ATOL = 1e-4


def engine_logits(path: str, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Per sequence, the engine's logits at every position, built up phase by phase."""
    cfg = ModelConfig.from_path(Path(path), "float32", 256)
    model = load_model(cfg, torch.device("cpu"))
    layers = model.attention_layers()
    num_blocks = 2 * (256 // BLOCK)
    kv = torch.zeros(2, len(layers), num_blocks, BLOCK, layers[0].num_kv_heads, cfg.head_dim)
    for i, layer in enumerate(layers):
        layer.k_cache, layer.v_cache = kv[0, i], kv[1, i]
    # Sequence s owns blocks s, s + 2, s + 4, ...: interleaved, never contiguous.
    tables = torch.tensor([[s + 2 * b for b in range(num_blocks // 2)] for s in range(2)], dtype=torch.int32)
    done, out = [0, 0], [[], []]
    steps = [PHASES["prefill"], PHASES["extend"]] + [PHASES["decode"]] * DECODE_STEPS
    for lens in steps:
        ids, positions, slots, qsl = [], [], [], [0]
        for s, n in enumerate(lens):
            for p in range(done[s], done[s] + n):
                ids.append(seqs[s][p])
                positions.append(p)
                slots.append(int(tables[s, p // BLOCK]) * BLOCK + p % BLOCK)
            qsl.append(qsl[-1] + n)
        seq_lens = [done[s] + n for s, n in enumerate(lens)]
        ctx = AttentionContext(
            slot_mapping=torch.tensor(slots),
            block_tables=tables,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            max_query_len=max(lens),
            max_seq_len=max(seq_lens),
        )
        with torch.inference_mode(), attention_context(ctx):
            logits = model.compute_logits(model(torch.tensor(ids), torch.tensor(positions)))
        for s in range(2):
            out[s].append(logits[qsl[s] : qsl[s + 1]])
            done[s] = seq_lens[s]
    return [torch.cat(rows) for rows in out]


@pytest.mark.parametrize("family", FAMILIES)
def test_teacher_forced_logits_match_transformers(tiny_models, hf, family):
    path = tiny_models[family]
    rng = random.Random(11)
    total = [sum(phase[s] for phase in (PHASES["prefill"], PHASES["extend"])) + DECODE_STEPS for s in range(2)]
    seqs = [[rng.randrange(5, 512) for _ in range(n)] for n in total]
    got = engine_logits(path, seqs)
    model = hf.model(path)
    for s, seq in enumerate(seqs):
        with torch.no_grad():
            want = model(torch.tensor([seq])).logits[0].float()
        assert got[s].shape == want.shape
        err = (got[s] - want).abs().max(dim=-1).values
        worst = int(err.argmax())
        assert err.max() <= ATOL, f"sequence {s}: position {worst} off by {err.max():.2e}"
