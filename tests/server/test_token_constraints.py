"""logit_bias, allowed_token_ids and bad_words over HTTP with the real `openai` SDK: each changes
the output as specified, on both endpoints, and each bad value is a 400 naming its field."""

from __future__ import annotations

import openai
import pytest
import torch

from .live import MODEL

SEEDS = range(8)
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def letters(hf_tiny) -> dict[str, int]:
    """Single-letter tokens: the text then shows exactly which tokens were drawn."""
    ids = {c: hf_tiny.tokenizer.convert_tokens_to_ids(c) for c in "abc"}
    assert all(i is not None and i != hf_tiny.tokenizer.unk_token_id for i in ids.values())
    return ids


def test_logit_bias_100_forces_the_token_on_both_endpoints(oai, letters):
    b = letters["b"]
    for seed in SEEDS:
        r = oai.completions.create(model=MODEL, prompt="x = ", max_tokens=6, temperature=1.0, seed=seed,
                                   logit_bias={str(b): 100})
        assert r.choices[0].text == "b" * 6
    chat = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0,
                                       logit_bias={str(b): 100})
    assert chat.choices[0].message.content == "b" * 5
    plain = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0)
    assert plain.choices[0].message.content != "b" * 5


def test_logit_bias_matches_transformers(oai, hf_tiny):
    ids = hf_tiny.tokenizer("x = ").input_ids
    bias = {300: 3.0, 120: -5.0, 77: 2.0}
    want = hf_tiny.tokenizer.decode(
        hf_tiny.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                               sequence_bias={(t,): b for t, b in bias.items()},
                               pad_token_id=hf_tiny.tokenizer.pad_token_id)[0, len(ids):])
    r = oai.completions.create(model=MODEL, prompt="x = ", max_tokens=8, temperature=0,
                               logit_bias={str(t): b for t, b in bias.items()})
    assert r.choices[0].text == want


def test_allowed_token_ids_bound_the_output_and_bad_words_remove_one(oai, letters):
    allowed = list(letters.values())
    seen = set()
    for seed in SEEDS:
        r = oai.completions.create(model=MODEL, prompt="x = ", max_tokens=12, temperature=1.0, seed=seed,
                                   extra_body={"allowed_token_ids": allowed})
        assert set(r.choices[0].text) <= set("abc")
        seen |= set(r.choices[0].text)
        banned = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=1.0,
                                             seed=seed, n=2,
                                             extra_body={"allowed_token_ids": allowed, "bad_words": ["a"]})
        for c in banned.choices:
            assert set(c.message.content) <= set("bc") and len(c.message.content) == 12
    assert "a" in seen  # without bad_words the model does draw it


@pytest.mark.parametrize(("extra", "param"), [
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"5": -100.5}}, "logit_bias"),
    ({"logit_bias": {"five": 1}}, "logit_bias"),
    ({"logit_bias": {"-3": 1}}, "logit_bias"),
    ({"logit_bias": {"100000": 1}}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [1, 100000]}, "allowed_token_ids"),
    ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
    ({"bad_words": [""]}, "bad_words"),
    ({"bad_words": ["   "]}, "bad_words"),
    ({"bad_words": "abc"}, "bad_words"),
])
def test_bad_constraints_are_400s_naming_the_field(oai, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=extra)
    assert info.value.body["param"] == param, info.value.body
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body=extra)
    assert info.value.body["param"] == param, info.value.body
