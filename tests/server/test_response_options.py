"""stream_options.continuous_usage_stats, truncate_prompt_tokens (with truncation_side) and
return_tokens_as_token_ids with the real `openai` SDK, against transformers' greedy output."""

from __future__ import annotations

import openai
import pytest

from .live import MODEL

PROMPT = "class Scheduler:\n    def schedule(self, budget):\n        return"
MESSAGES = [{"role": "user", "content": "Name a prime."}]
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def _ids(hf, text):
    return hf.tokenizer(text).input_ids


def test_continuous_usage_stats_put_usage_on_every_chunk(oai, hf_tiny):
    n_prompt = len(_ids(hf_tiny, PROMPT))
    # logprobs list each chunk's own tokens, so every chunk's count can be checked against what the
    # stream has carried so far, however the server grouped the tokens into chunks
    chunks = list(oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
                                         logprobs=0, stream_options=CONTINUOUS))
    assert all(c.usage is not None and c.usage.prompt_tokens == n_prompt for c in chunks)
    carried = 0
    for c in chunks:
        carried += sum(len(choice.logprobs.tokens) for choice in c.choices if choice.logprobs)
        assert c.usage.completion_tokens == carried
    assert carried == 6
    assert all(c.usage.total_tokens == n_prompt + c.usage.completion_tokens for c in chunks)
    chat = list(oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0,
                                            stream=True, stream_options=CONTINUOUS))
    assert all(c.usage is not None for c in chat) and chat[-1].usage.completion_tokens == 5
    assert [c.usage.completion_tokens for c in chat] == sorted(c.usage.completion_tokens for c in chat)
    plain = list(oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, stream=True,
                                        stream_options={"include_usage": True}))
    assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens == 6


def test_truncate_prompt_tokens_keeps_the_last_or_first_tokens(oai, hf_tiny):
    ids = _ids(hf_tiny, PROMPT)
    for side, kept in ((None, ids[-5:]), ("left", ids[-5:]), ("right", ids[:5])):
        extra = {"truncate_prompt_tokens": 5, **({"truncation_side": side} if side else {})}
        r = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, echo=True,
                                   extra_body=extra)
        assert r.usage.prompt_tokens == 5
        assert r.choices[0].text == hf_tiny.text(kept) + hf_tiny.text(hf_tiny.greedy(kept, 6))
    whole = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"truncate_prompt_tokens": -1})
    assert whole.usage.prompt_tokens == len(ids)
    chat = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                       extra_body={"truncate_prompt_tokens": 3})
    assert chat.usage.prompt_tokens == 3


@pytest.mark.parametrize("k", [257, 0, -2])
def test_truncate_prompt_tokens_out_of_range_is_a_400(oai, k):
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"truncate_prompt_tokens": k})
    assert info.value.body["param"] == "truncate_prompt_tokens"


def test_return_tokens_as_token_ids(oai, hf_tiny):
    new = hf_tiny.greedy(_ids(hf_tiny, PROMPT), 5)
    r = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2,
                               extra_body={"return_tokens_as_token_ids": True})
    lp = r.choices[0].logprobs
    assert lp.tokens == [f"token_id:{t}" for t in new]
    assert all(key.startswith("token_id:") for top in lp.top_logprobs for key in top)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(new))]
    chat = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2, extra_body={"return_tokens_as_token_ids": True})
    content = chat.choices[0].logprobs.content
    assert all(e.token.startswith("token_id:") and all(t.token.startswith("token_id:") for t in e.top_logprobs)
               for e in content) and len(content) == chat.usage.completion_tokens
    plain = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    assert plain.choices[0].logprobs.tokens == [hf_tiny.tokenizer.decode([t]) for t in new]
