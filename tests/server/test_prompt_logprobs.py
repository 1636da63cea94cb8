"""prompt_logprobs as vLLM returns them, and echo with max_tokens 0 (prompt scoring), with the real
`openai` SDK; every logprob against transformers' log-softmax on the same weights."""

from __future__ import annotations

import openai
import pytest

from .live import MODEL

PROMPT = "def step(self):\n    return self.value"


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def _check_prompt_logprobs(entries, ids, hf, k):
    """vLLM's shape: None first, then token id (a JSON key) -> {logprob, rank, decoded_token}."""
    ref = hf.logprobs(ids)  # row i predicts token i + 1
    assert len(entries) == len(ids) and entries[0] is None
    for pos in range(1, len(ids)):
        row, tok = ref[pos - 1], ids[pos]
        entry = {int(t): lp for t, lp in entries[pos].items()}
        assert tok in entry and len(entry) in (k, k + 1)
        assert entry[tok]["logprob"] == pytest.approx(float(row[tok]), abs=2e-3)
        assert entry[tok]["rank"] == int((row > row[tok]).sum()) + 1
        assert entry[tok]["decoded_token"] == hf.tokenizer.decode([tok])
        top = row.topk(k).indices.tolist()
        assert {t for t, lp in entry.items() if lp["rank"] <= k} == set(top)


def test_completion_prompt_logprobs_match_transformers_even_when_cached(oai, hf_tiny):
    ids = hf_tiny.tokenizer(PROMPT).input_ids
    oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)  # the prompt's blocks are cached now
    for _ in range(2):  # a request for prompt logprobs recomputes the prompt (vLLM skips the cache)
        r = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0,
                                   extra_body={"prompt_logprobs": 3})
        _check_prompt_logprobs(r.choices[0].model_extra["prompt_logprobs"], ids, hf_tiny, 3)
    plain = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert plain.choices[0].model_extra.get("prompt_logprobs") is None


def test_chat_prompt_logprobs_cover_the_templated_prompt(oai, hf_tiny):
    messages = [{"role": "user", "content": "Name a prime."}]
    text = hf_tiny.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = hf_tiny.tokenizer(text, add_special_tokens=False).input_ids
    r = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body={"prompt_logprobs": 1})
    _check_prompt_logprobs(r.model_extra["prompt_logprobs"], ids, hf_tiny, 1)


def test_prompt_logprobs_with_stream_is_a_400(oai):
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, stream=True,
                               extra_body={"prompt_logprobs": 1})
    assert info.value.body["param"] == "prompt_logprobs"


def _check_scored(lp, ids, hf):
    ref = hf.logprobs(ids)
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == hf.tokenizer.decode(ids)
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(float(ref[i - 1, ids[i]]), abs=2e-3)


def test_echo_with_max_tokens_0_scores_the_prompt(oai, hf_tiny):
    prompts = [PROMPT, "import os\nimport sys"]
    r = oai.completions.create(model=MODEL, prompt=prompts, max_tokens=0, echo=True, logprobs=1)
    assert [c.text for c in r.choices] == prompts
    for c, p in zip(r.choices, prompts):
        _check_scored(c.logprobs, hf_tiny.tokenizer(p).input_ids, hf_tiny)
    assert r.usage.completion_tokens == 0
    assert r.usage.prompt_tokens == sum(len(hf_tiny.tokenizer(p).input_ids) for p in prompts)
    chunks = list(oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1,
                                         stream=True))
    assert "".join(c.choices[0].text for c in chunks) == PROMPT
    streamed = [lp for c in chunks if c.choices[0].logprobs for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed == [None, *r.choices[0].logprobs.token_logprobs[1:]]


def test_max_tokens_0_without_echo_is_a_400(oai):
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    assert info.value.body["param"] == "max_tokens"
