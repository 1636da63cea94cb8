"""Tokenizing and chat templates run on a worker thread, not on the event loop: while a prompt is
being tokenized, /health and other routes answer. A text too long for the context, whatever its
size, is refused before the tokenizer sees it, in OpenAI's error shape."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from .live import MODEL, LiveServer
from .test_errors import assert_error_shape

HANG_GUARD = 120  # seconds: only so that a broken server fails the test instead of hanging it


class SpyTokenizer:
    """The real tokenizer, with every call recorded and, while `hold` is clear, held."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.texts: list[str] = []
        self.entered = threading.Event()
        self.hold = threading.Event()
        self.hold.set()

    def __call__(self, text, **kwargs):
        self.texts.append(text)
        self.entered.set()
        assert self.hold.wait(HANG_GUARD), "the test never released the tokenizer"
        return self._tokenizer(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


@pytest.fixture(scope="module")
def spied(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=64)
    renderer = s.app.state.renderer
    spy = SpyTokenizer(renderer.tokenizer)
    renderer.tokenizer = spy
    yield s, renderer, spy
    spy.hold.set()
    s.close()


ROUTES = [
    ("/v1/completions", lambda text: {"model": MODEL, "prompt": text, "max_tokens": 2}, "prompt"),
    ("/v1/completions", lambda text: {"model": MODEL, "prompt": ["fine", text], "max_tokens": 2}, "prompt"),
    ("/v1/chat/completions", lambda text: {"model": MODEL, "max_tokens": 2,
                                           "messages": [{"role": "user", "content": text}]}, "messages"),
    ("/tokenize", lambda text: {"prompt": text}, "prompt"),
    ("/tokenize", lambda text: {"messages": [{"role": "user", "content": text}]}, "messages"),
]


@pytest.mark.parametrize(("path", "body", "param"), ROUTES)
def test_other_routes_answer_while_a_prompt_is_tokenized(spied, path, body, param):
    server, _, spy = spied
    spy.hold.clear()
    spy.entered.clear()
    result: dict = {}

    def send():
        result["resp"] = httpx.post(server.base_url + path, json=body("hello there"), timeout=HANG_GUARD)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        assert spy.entered.wait(HANG_GUARD), "the request never reached the tokenizer"
        # The tokenizer is held mid-call; on the event loop this would stall every route.
        with httpx.Client(base_url=server.base_url, timeout=HANG_GUARD) as http:
            assert http.get("/health").status_code == 200
            assert http.get("/v1/models").json()["data"][0]["id"] == MODEL
            assert http.get("/metrics").status_code == 200
    finally:
        spy.hold.set()
        sender.join(HANG_GUARD)
    assert result["resp"].status_code == 200, result["resp"].text


@pytest.mark.parametrize(("path", "body", "param"), ROUTES)
def test_text_over_the_character_bound_is_refused_untokenized(spied, path, body, param):
    server, renderer, spy = spied
    spy.texts.clear()
    text = "a" * (renderer.max_chars + 1)
    err = assert_error_shape(httpx.post(server.base_url + path, json=body(text), timeout=HANG_GUARD), 400)
    assert (err["param"], err["code"]) == (param, "context_length_exceeded")
    assert "64" in err["message"]
    assert not any(len(t) > renderer.max_chars for t in spy.texts)
    # The server keeps serving, and a text at the bound still reaches the tokenizer (and then the
    # token count decides).
    oai = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    assert oai.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt="a " * (renderer.max_chars // 2), max_tokens=2)
    assert info.value.body["code"] == "context_length_exceeded"
    assert any(len(t) == renderer.max_chars for t in spy.texts)


def test_the_bound_holds_no_real_prompt_back(spied):
    """No token spells more characters than the bound assumes, so every text that fits the context
    passes it: the bound is the vocabulary's longest entry, and decoding any one token is shorter."""
    _, renderer, _ = spied
    tokenizer = renderer.tokenizer._tokenizer
    longest = max(len(tokenizer.decode([i])) for i in range(len(tokenizer)))
    assert longest <= renderer.chars_per_token
