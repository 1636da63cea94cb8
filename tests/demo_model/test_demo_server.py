"""The demo model through `pagoda serve` and the real OpenAI client.

Held-out perplexity computed from the server's prompt log-probabilities (`echo` + `logprobs` on
/v1/completions) matches transformers' within 1%, and the server reports prefix-cache hits on
prompts that share a long import header while returning transformers' greedy text.
"""

from __future__ import annotations

import math
import os

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

WINDOW = 256  # tokens per held-out window
NUM_WINDOWS = 4


def heldout_windows(tokenizer, heldout: dict[str, str], max_model_len: int) -> list[list[int]]:
    size = min(WINDOW, max_model_len - 1)  # room for the one generated token
    windows = []
    for source in heldout.values():
        ids = tokenizer(source, add_special_tokens=False).input_ids
        if len(ids) >= size:
            windows.append(ids[:size])
    assert len(windows) >= 2, "the held-out modules should give at least two full windows"
    return windows[:NUM_WINDOWS]


@torch.no_grad()
def hf_token_logprobs(hf_model, ids: list[int]) -> list[float]:
    logits = hf_model(torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def test_heldout_perplexity_matches_transformers(
    openai_client, served_model_name, hf_model, tokenizer, heldout, max_model_len
):
    engine_lp, hf_lp = [], []
    for ids in heldout_windows(tokenizer, heldout, max_model_len):
        response = openai_client.completions.create(
            model=served_model_name, prompt=ids, max_tokens=1, echo=True, logprobs=1, seed=0
        )
        token_logprobs = response.choices[0].logprobs.token_logprobs
        assert len(token_logprobs) >= len(ids)
        assert token_logprobs[0] is None  # the first prompt token has no context to be scored in
        window_engine = token_logprobs[1 : len(ids)]
        window_hf = hf_token_logprobs(hf_model, ids)
        worst = max(abs(a - b) for a, b in zip(window_engine, window_hf))
        assert worst < 1e-2, f"a prompt log-probability differs from transformers' by {worst:.3g} nats"
        engine_lp += window_engine
        hf_lp += window_hf

    ppl_engine = math.exp(-sum(engine_lp) / len(engine_lp))
    ppl_hf = math.exp(-sum(hf_lp) / len(hf_lp))
    assert abs(ppl_engine / ppl_hf - 1) < 0.01, (
        f"perplexity {ppl_engine:.4f} (server) vs {ppl_hf:.4f} (transformers)"
    )


def prefix_cache_hits(base_url: str, model_name: str) -> float:
    families = text_string_to_metric_families(httpx.get(f"{base_url}/metrics", timeout=10).text)
    return sum(
        sample.value
        for family in families
        if family.name == "vllm:prefix_cache_hits"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("model_name") == model_name
    )


def test_server_reports_prefix_cache_hits(
    demo_server, openai_client, served_model_name, tokenizer, hf_greedy, header_prompts
):
    block_size, max_tokens = 16, 12
    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in header_prompts[:2]]
    cached_blocks_tokens = block_size * (len(os.path.commonprefix(prompts)) // block_size)
    before = prefix_cache_hits(demo_server, served_model_name)
    for ids in prompts:  # one after the other, so the second finds the first's blocks
        response = openai_client.completions.create(
            model=served_model_name,
            prompt=ids,
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        expected = tokenizer.decode(hf_greedy(ids, max_tokens)[0], skip_special_tokens=True)
        assert response.choices[0].text == expected
    assert prefix_cache_hits(demo_server, served_model_name) - before >= cached_blocks_tokens > 0
