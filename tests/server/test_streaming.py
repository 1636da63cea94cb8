"""Streaming over raw HTTP: SSE framing, whole characters, stop strings that never leak, aborts on
disconnect, and 64 concurrent streaming clients."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from pagoda.runtime.frontend.server.protocol import ChatCompletionChunk, CompletionResponse

from .live import HF, MODEL


def read_sse(base_url: str, path: str, body: dict) -> tuple[httpx.Headers, list[str]]:
    with httpx.stream("POST", base_url + path, json=body, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        return resp.headers, list(resp.iter_lines())


def parse_events(lines: list[str]) -> list:
    """Check the framing (`data: ...` then a blank line, ending with `data: [DONE]`) and decode."""
    assert lines[-2:] == ["data: [DONE]", ""], lines[-3:]
    events = []
    for i in range(0, len(lines), 2):
        assert lines[i].startswith("data: "), lines[i]
        assert lines[i + 1] == "", f"event {i // 2} is not followed by a blank line"
        payload = lines[i][len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    assert events.count("[DONE]") == 1
    return events[:-1]


def completion_text(events, index: int = 0) -> str:
    return "".join(c["text"] for e in events for c in e["choices"] if c["index"] == index)


@pytest.fixture(scope="module")
def hf_cycle(cycle_model) -> HF:
    return HF(cycle_model.path)


def test_sse_framing_chat(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    headers, lines = read_sse(server.base_url, "/v1/chat/completions", body)
    assert headers["content-type"].startswith("text/event-stream")
    events = parse_events(lines)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert len({e["id"] for e in events}) == 1
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    *content, last, usage = events
    assert last["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["finish_reason"] is None for e in [events[0], *content] for c in e["choices"])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1
    # The per-token chunks are built from dicts, not models: they must be exactly the model's JSON.
    assert all(ChatCompletionChunk.model_validate(e).model_dump(mode="json") == e for e in events)
    streamed = "".join(c["delta"]["content"] or "" for e in events[1:-1] for c in e["choices"])
    whole = httpx.post(server.v1 + "/chat/completions", json={**body, "stream": False}).json()
    assert streamed == whole["choices"][0]["message"]["content"]
    assert usage["usage"] == whole["usage"]


def test_sse_framing_completions_n2(server):
    body = {"model": MODEL, "prompt": "x = ", "max_tokens": 6, "temperature": 0.8, "seed": 5, "n": 2,
            "stream": True, "stream_options": {"include_usage": True}}
    _, lines = read_sse(server.base_url, "/v1/completions", body)
    events = parse_events(lines)
    *chunks, usage = events
    assert usage["choices"] == []
    assert all(CompletionResponse.model_validate(e).model_dump(mode="json") == e for e in events)
    whole = httpx.post(server.v1 + "/completions", json={**body, "stream": False}).json()
    for choice in whole["choices"]:
        mine = [c for e in chunks for c in e["choices"] if c["index"] == choice["index"]]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert mine[-1]["finish_reason"] == choice["finish_reason"]
        assert all(c["finish_reason"] is None for c in mine[:-1])
    assert usage["usage"] == whole["usage"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "x = ", "logprobs": 2, "echo": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 2}),
])
def test_streamed_logprobs_have_the_models_shape(server, path, body):
    body = {"model": MODEL, "max_tokens": 5, "temperature": 0, "stream": True, **body}
    events = parse_events(read_sse(server.base_url, path, body)[1])
    model = CompletionResponse if path == "/v1/completions" else ChatCompletionChunk
    assert all(model.model_validate(e).model_dump(mode="json") == e for e in events)
    assert any(c["logprobs"] for e in events for c in e["choices"])


def test_multibyte_characters_are_never_split(cycle_server, cycle_model, hf_cycle):
    """Each "€" is three single-byte tokens; no streamed delta may carry part of one."""
    prompt, max_tokens = cycle_model.euro, 4 * 6
    want = hf_cycle.text(hf_cycle.greedy(prompt, max_tokens))
    assert want == "x€" * 6
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    events = parse_events(read_sse(cycle_server.base_url, "/v1/completions", body)[1])
    deltas = [c["text"] for e in events for c in e["choices"]]
    assert "".join(deltas) == want
    assert len(deltas) > 1 and not any("\ufffd" in d for d in deltas)
    whole = httpx.post(cycle_server.v1 + "/completions", json={**body, "stream": False}).json()
    assert whole["choices"][0]["text"] == want


@pytest.mark.parametrize("stop", [["tp"], ["rst", "zz"], ["qrstpq"]])
@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_never_leak(cycle_server, cycle_model, hf_cycle, stop, include):
    prompt = cycle_model.letters[:1]  # "p", then "qrstpqrst..."
    reference = hf_cycle.text(hf_cycle.greedy(prompt, 20))
    assert reference.startswith("qrstpqrst")
    cut = min(reference.index(s) for s in stop if s in reference)
    matched = next(s for s in stop if reference.startswith(s, cut))
    want = reference[: cut + (len(matched) if include else 0)]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0, "stop": stop,
            "include_stop_str_in_output": include}
    whole = httpx.post(cycle_server.v1 + "/completions", json=body).json()["choices"][0]
    assert (whole["text"], whole["finish_reason"], whole["stop_reason"]) == (want, "stop", matched)
    events = parse_events(read_sse(cycle_server.base_url, "/v1/completions", {**body, "stream": True})[1])
    streamed = ""
    for e in events:
        streamed += e["choices"][0]["text"]
        if not include:
            assert not any(s in streamed for s in stop), f"stop string leaked: {streamed!r}"
            # Nothing past the cut is ever sent, even for a moment.
            assert want.startswith(streamed)
    assert streamed == want
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stop", ["<END>", "tp"])
def test_streamed_text_lags_by_at_most_the_stop_string(cycle_server, cycle_model, hf_cycle, stop):
    """One holdback: a stream lags the text its tokens spell by at most len(stop) - 1 characters
    (what could still start a stop string), and ends with the non-streamed answer's text."""
    prompt = cycle_model.letters[:1]  # "p", then "qrstpqrst...": one character per token
    reference = hf_cycle.text(hf_cycle.greedy(prompt, 24))
    want = reference[: reference.index(stop)] if stop in reference else reference
    # logprobs=0 names each chunk's tokens, so the test knows the text those tokens spell.
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": [stop],
            "logprobs": 0, "stream": True}
    events = parse_events(read_sse(cycle_server.base_url, "/v1/completions", body)[1])
    streamed, spelled, lags = "", "", []
    for e in events:
        (choice,) = e["choices"]
        streamed += choice["text"]
        spelled += "".join(choice["logprobs"]["tokens"])
        if choice["finish_reason"] is None:
            assert spelled.startswith(streamed)
            lags.append(len(spelled) - len(streamed))
    assert max(lags) == len(stop) - 1  # held back while it might be a stop string, and no more
    assert streamed == want
    whole = httpx.post(cycle_server.v1 + "/completions", json={**body, "stream": False}).json()["choices"][0]
    assert whole["text"] == streamed
    assert whole["finish_reason"] == events[-1]["choices"][0]["finish_reason"]


def _abort_count(server) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.base_url + "/metrics").text
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:request_success":
            return sum(s.value for s in fam.samples
                       if s.name.endswith("_total") and s.labels.get("finished_reason") == "abort")
    return 0.0


def test_stream_disconnect_aborts_and_frees_blocks(cycle_server, cycle_model):
    cycle_server.wait_idle()
    aborted = _abort_count(cycle_server)
    body = {"model": MODEL, "prompt": cycle_model.letters, "max_tokens": 500, "temperature": 0, "stream": True}
    with httpx.stream("POST", cycle_server.v1 + "/completions", json=body, timeout=30) as resp:
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert got[0].startswith("data: ")
        busy = cycle_server.stats()
        assert busy["num_running"] == 1 and busy["kv_cache_usage"] > 0
    # 500 tokens take seconds; the abort frees the blocks long before that.
    idle = cycle_server.wait_idle(timeout=3.0)
    assert idle["kv_cache_usage"] == 0.0
    assert _abort_count(cycle_server) == aborted + 1


def test_non_streaming_disconnect_aborts(cycle_server, cycle_model):
    cycle_server.wait_idle()
    aborted = _abort_count(cycle_server)
    body = {"model": MODEL, "prompt": cycle_model.letters, "max_tokens": 500, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        # 500 tokens take about a second on an idle 2-core machine; give up well before that.
        httpx.post(cycle_server.v1 + "/completions", json=body, timeout=0.2)
    idle = cycle_server.wait_idle(timeout=3.0)
    assert idle["kv_cache_usage"] == 0.0
    assert _abort_count(cycle_server) == aborted + 1


async def test_64_concurrent_streaming_clients(cycle_server, cycle_model, hf_cycle):
    client = openai.AsyncOpenAI(base_url=cycle_server.v1, api_key="unused", max_retries=0, timeout=120)
    # Whole characters as prompts: "x", "€" (three byte tokens) and each of "pqrst".
    starts = [cycle_model.euro[:1], cycle_model.euro[1:]] + [[t] for t in cycle_model.letters]
    jobs = [(starts[i % len(starts)], 8 + i % 9) for i in range(64)]
    # Greedy decoding of m tokens is the first m of a longer greedy run: one reference per prompt.
    longest = {tuple(p): hf_cycle.greedy(list(p), max(m for _, m in jobs)) for p in starts}
    want = {(tuple(p), m): hf_cycle.text(longest[tuple(p)][:m]) for p, m in jobs}

    async def one(prompt, max_tokens):
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True})
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        return text, finish, usage

    results = await asyncio.gather(*(one(p, m) for p, m in jobs))
    await client.close()
    for (prompt, max_tokens), (text, finish, usage) in zip(jobs, results):
        assert text == want[(tuple(prompt), max_tokens)]
        assert finish == "length" and usage.completion_tokens == max_tokens
        assert usage.prompt_tokens == len(prompt)
    cycle_server.wait_idle()
