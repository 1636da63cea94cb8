"""Shared fixtures: one tiny checkpoint per family, and transformers' greedy output on it.

transformers is the reference: the engine must reproduce its greedy tokens exactly, whatever the
batching, chunking, preemption or prefix caching.
"""

from __future__ import annotations

import random

import pytest
import torch

from pagoda.runtime.tools.tiny_models import FAMILIES, build_tiny_model

MAX_NEW_TOKENS = 10
# Varied lengths around block boundaries (tests use block_size=8), up to several blocks.
PROMPT_LENGTHS = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 24, 31, 33, 47, 64, 90]


def make_prompts(seed: int = 0, lengths=PROMPT_LENGTHS) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids from 5 up skip the special tokens, so a prompt is ordinary text.
    return [[rng.randrange(5, 512) for _ in range(n)] for n in lengths]


def make_shared_prefix_prompts(seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(5, 512) for _ in range(40)]
    other = [rng.randrange(5, 512) for _ in range(20)]
    prompts = []
    for i in range(16):
        head = prefix if i % 4 else other  # two prefix groups
        prompts.append(head + [rng.randrange(5, 512) for _ in range(1 + 3 * i)])
    return prompts


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny")
    return {family: str(build_tiny_model(root / family, family)) for family in FAMILIES}


class HFReference:
    """Greedy continuations from transformers' generate, computed once per (model, prompt)."""

    def __init__(self):
        self.models: dict[str, object] = {}
        self.cache: dict[tuple, list[int]] = {}

    def model(self, path: str):
        if path not in self.models:
            from transformers import AutoModelForCausalLM

            self.models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return self.models[path]

    def greedy(
        self, path: str, prompt: list[int], max_new_tokens: int = MAX_NEW_TOKENS, **kwargs
    ) -> list[int]:
        key = (path, tuple(prompt), max_new_tokens, repr(sorted(kwargs.items())))  # kwargs may hold dicts
        if key not in self.cache:
            model = self.model(path)
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    **kwargs,
                )
            self.cache[key] = out[0, len(prompt) :].tolist()
        return self.cache[key]


@pytest.fixture(scope="session")
def hf() -> HFReference:
    return HFReference()
