"""The real `openai` package against a live server: completions and chat, checked against
transformers' greedy generate and log-softmax on the same weights."""

from __future__ import annotations

import asyncio

import openai
import pytest

from .live import MODEL

PROMPT = "def step(self):\n    return"


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def _ids(hf, text: str) -> list[int]:
    return hf.tokenizer(text).input_ids


def _finish(new_ids, hf, max_tokens) -> str:
    return "stop" if hf.tokenizer.eos_token_id in new_ids else "length"


def test_models_say_the_weights_are_random(oai):
    (card,) = oai.models.list().data
    assert card.id == MODEL
    assert card.model_extra["random_weights"] is True
    assert "RANDOM" in card.model_extra["description"]


def test_completion_greedy_matches_transformers(oai, hf_tiny):
    new = hf_tiny.greedy(_ids(hf_tiny, PROMPT), 12)
    r = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    assert r.choices[0].text == hf_tiny.text(new)
    assert r.choices[0].finish_reason == _finish(new, hf_tiny, 12)
    assert r.usage.prompt_tokens == len(_ids(hf_tiny, PROMPT))
    assert r.usage.completion_tokens == len(new)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_prompt_forms(oai, hf_tiny):
    prompts = ["import torch", "class Scheduler:"]
    want = [hf_tiny.text(hf_tiny.greedy(_ids(hf_tiny, p), 6)) for p in prompts]
    as_text = oai.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in as_text.choices] == [0, 1]
    assert [c.text for c in as_text.choices] == want
    one_ids = oai.completions.create(model=MODEL, prompt=_ids(hf_tiny, prompts[0]), max_tokens=6, temperature=0)
    assert one_ids.choices[0].text == want[0]
    many_ids = oai.completions.create(model=MODEL, prompt=[_ids(hf_tiny, p) for p in prompts], max_tokens=6,
                                      temperature=0)
    assert [c.text for c in many_ids.choices] == want


def test_completion_echo_and_logprobs_match_transformers(oai, hf_tiny):
    prompt_ids = _ids(hf_tiny, PROMPT)
    new = hf_tiny.greedy(prompt_ids, 4)
    r = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=2)
    (choice,) = r.choices
    assert choice.text == PROMPT + hf_tiny.text(new)
    lp = choice.logprobs
    all_ids = prompt_ids + new
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(all_ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = hf_tiny.logprobs(all_ids)  # row i predicts token i + 1
    for i in range(1, len(all_ids)):
        assert lp.token_logprobs[i] == pytest.approx(float(ref[i - 1, all_ids[i]]), abs=2e-3)
    for i in range(len(prompt_ids), len(all_ids)):  # generated: greedy, so the top-1 is the token
        top = lp.top_logprobs[i]  # keyed by token text: tokens that print alike (U+FFFD) share a key
        best = ref[i - 1].topk(2).values.tolist()
        assert 1 <= len(top) <= 2 and max(top.values()) == pytest.approx(best[0], abs=2e-3)
        assert all(any(v == pytest.approx(b, abs=2e-3) for b in best) for v in top.values())
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_completion_n2_and_seed(oai):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, n=2, seed=1234, logprobs=0)
    a = oai.completions.create(**kw)
    b = oai.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in a.choices)


MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "Another one?"},
]


def _chat_ids(hf) -> list[int]:
    text = hf.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return hf.tokenizer(text, add_special_tokens=False).input_ids


def test_chat_greedy_matches_transformers(oai, hf_tiny):
    prompt_ids = _chat_ids(hf_tiny)
    new = hf_tiny.greedy(prompt_ids, 10)
    r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=10, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == hf_tiny.text(new)
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(new)
    # The deprecated max_tokens means the same.
    old = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0)
    assert old.choices[0].message.content == r.choices[0].message.content


def test_chat_stream_with_usage_equals_the_answer(oai):
    kw = dict(model=MODEL, messages=MESSAGES, max_completion_tokens=12, temperature=0)
    whole = oai.chat.completions.create(**kw)
    chunks = list(oai.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_logprobs_match_transformers(oai, hf_tiny):
    prompt_ids = _chat_ids(hf_tiny)
    new = hf_tiny.greedy(prompt_ids, 5)
    r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=5, temperature=0,
                                    logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == len(new)
    ref = hf_tiny.logprobs(prompt_ids + new)
    for i, entry in enumerate(content):
        row = ref[len(prompt_ids) - 1 + i]
        assert entry.logprob == pytest.approx(float(row[new[i]]), abs=2e-3)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(row.topk(3).values.tolist(), abs=2e-3)
        assert entry.bytes == list(entry.token.encode())


def test_chat_n_seed_and_stop(oai):
    kw = dict(model=MODEL, messages=MESSAGES, max_completion_tokens=10, temperature=0.9, seed=7, n=2)
    a, b = oai.chat.completions.create(**kw), oai.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    greedy = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=24, temperature=0)
    text = greedy.choices[0].message.content
    stop = next(text[i:i + 2] for i in range(3, len(text) - 1)
                if text[i:i + 2].isprintable() and "\ufffd" not in text[i:i + 2])
    r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=24, temperature=0,
                                    stop=[stop])
    assert r.choices[0].message.content == text[: text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop


async def test_async_client_concurrent_requests(server, hf_tiny):
    client = openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    prompts = ["a = 1", "for x in", "return self", "import json"]
    want = [hf_tiny.text(hf_tiny.greedy(_ids(hf_tiny, p), 8)) for p in prompts]
    got = await asyncio.gather(*(client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0)
                                 for p in prompts))
    assert [r.choices[0].text for r in got] == want
    await client.close()


def test_vllm_extra_sampling_fields(oai, hf_tiny):
    prompt_ids = _ids(hf_tiny, PROMPT)
    greedy = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0).choices[0].text
    # top_k=1 and min_p=1 leave only the most likely token: greedy, whatever the temperature.
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        r = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=1.0, seed=3,
                                   extra_body=extra)
        assert r.choices[0].text == greedy, extra
    # repetition_penalty as transformers applies it, over prompt and output.
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        out = hf_tiny.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                                     repetition_penalty=1.5, pad_token_id=hf_tiny.tokenizer.pad_token_id)
    new = out[0, len(prompt_ids):].tolist()
    if hf_tiny.tokenizer.eos_token_id in new:
        new = new[: new.index(hf_tiny.tokenizer.eos_token_id) + 1]
    r = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0,
                               extra_body={"repetition_penalty": 1.5})
    assert r.choices[0].text == hf_tiny.text(new)


def test_stop_token_ids_min_tokens_and_ignore_eos(cycle_server, cycle_model):
    client = openai.OpenAI(base_url=cycle_server.v1, api_key="x", max_retries=0)
    p, q, r, s, t = cycle_model.letters
    base = dict(model=MODEL, prompt=[p], max_tokens=12, temperature=0)
    hit = client.completions.create(**base, extra_body={"stop_token_ids": [s]}).choices[0]
    assert (hit.text, hit.finish_reason, hit.model_extra["stop_reason"]) == ("qr", "stop", s)
    # min_tokens: as in vLLM, stop tokens are masked out until 5 tokens exist, so the walk leaves "s".
    late = client.completions.create(**base, extra_body={"stop_token_ids": [s], "min_tokens": 5})
    assert late.choices[0].text.startswith("qr") and not late.choices[0].text.startswith("qrs")
    assert late.usage.completion_tokens >= 5
    eos = client.completions.create(**base, extra_body={"ignore_eos": True}).choices[0]
    assert eos.text == "qrstpqrstpqr" and eos.finish_reason == "length"


def test_version_and_health(server):
    import httpx

    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.base_url + "/version").json()["version"]
