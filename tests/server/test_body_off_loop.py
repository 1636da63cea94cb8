"""JSON bodies are parsed and validated on a worker thread (server/body.py): while one is being
parsed, /health and other routes answer; and what the route answers to any body, good or bad, is
what FastAPI's own parsing answers."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from pagoda.runtime.frontend.server import body as body_module
from pagoda.runtime.frontend.server.body import OffLoopBodyRoute, parse_json
from pagoda.runtime.frontend.server.errors import install_error_handlers
from pagoda.runtime.frontend.server.protocol import ChatCompletionRequest, CompletionRequest

from .live import MODEL

HANG_GUARD = 120  # seconds: only so that a broken server fails the test instead of hanging it

ROUTES = [
    ("/v1/completions", {"model": MODEL, "prompt": "hello there", "max_tokens": 2}),
    ("/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("/tokenize", {"model": MODEL, "prompt": "hello there"}),
    ("/detokenize", {"model": MODEL, "tokens": [1, 2, 3]}),
]


@pytest.mark.parametrize(("path", "payload"), ROUTES)
def test_other_routes_answer_while_a_body_is_parsed(server, monkeypatch, path, payload):
    entered, hold = threading.Event(), threading.Event()

    def held_parse(raw: bytes):
        entered.set()
        assert hold.wait(HANG_GUARD), "the test never released the parser"
        return parse_json(raw)

    monkeypatch.setattr(body_module, "parse_json", held_parse)
    result: dict = {}
    sender = threading.Thread(target=lambda: result.setdefault(
        "resp", httpx.post(server.base_url + path, json=payload, timeout=HANG_GUARD)))
    sender.start()
    try:
        assert entered.wait(HANG_GUARD), "the body never reached the parser"
        # The parser is held mid-call; on the event loop this would stall every route.
        with httpx.Client(base_url=server.base_url, timeout=HANG_GUARD) as http:
            assert http.get("/health").status_code == 200
            assert http.get("/v1/models").json()["data"][0]["id"] == MODEL
    finally:
        hold.set()
        sender.join(HANG_GUARD)
    assert result["resp"].status_code == 200, result["resp"].text


# Bodies (raw bytes, content type) covering every way in: good, malformed, mistyped, invalid Unicode.
BODIES = [
    (b'{"model": "m", "prompt": "hi", "max_tokens": 2}', "application/json"),
    (b'{"model": "m", "prompt": "hi", "max_tokens": 2, "max_tokens": 0}', "application/json"),
    (b'{"model": "m", "prompt": "hi", "temperature": NaN}', "application/json"),
    (b'{"model": "m", "prompt": "hi", "max_tokens": "many"}', "application/json"),
    (b'{"model": "m", "prompt": [1, "a"]}', "application/json"),
    (b'{"model": "m", "prompt": "\\ud800"}', "application/json"),
    (b'{"model": "m", "prompt": "\xff\xfe"}', "application/json"),
    (b'{"model": "m", "prompt": "hi", "\\udc00": 1}', "application/json"),
    (b'{"model": "m", "prompt": "hi", "nonsense": 1}', "application/json"),
    (b'{"model": "m", "prompt": "hi"', "application/json"),
    (b'{"model": "m", "prompt": "hi"} x', "application/json"),
    (b'\xef\xbb\xbf{"model": "m", "prompt": "hi"}', "application/json"),
    (b'[1, 2]', "application/json"),
    (b'{"prompt": "hi"}', "application/json"),
    (b'', "application/json"),
    (b'{"model": "m", "prompt": "hi"}', "text/plain"),
    (b'{"model": "m", "prompt": "hi"}', "application/vnd.api+json"),
    (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "application/json"),
]


def _app(route_class) -> TestClient:
    app = FastAPI()
    app.router.route_class = route_class
    install_error_handlers(app)

    @app.post("/c")
    async def complete(req: CompletionRequest):
        return req.model_dump(mode="json")

    @app.post("/chat")
    async def chat(req: ChatCompletionRequest):
        return req.model_dump(mode="json")

    return TestClient(app)


class _SurrogateEscapeRoute(APIRoute):
    """FastAPI's own parsing and validation, on the loop, with the body decoded as the server decodes it."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def route(request):
            class Decoded(type(request)):
                async def json(self):
                    return json.loads((await self.body()).decode("utf-8", "surrogateescape"))

            return await handler(Decoded(request.scope, request.receive))

        return route


@pytest.mark.parametrize(("raw", "content_type"), BODIES)
@pytest.mark.parametrize("path", ["/c", "/chat"])
def test_answers_equal_fastapis_own(raw, content_type, path):
    ours, fastapis = _app(OffLoopBodyRoute), _app(_SurrogateEscapeRoute)
    headers = {"content-type": content_type}
    got = ours.post(path, content=raw, headers=headers)
    want = fastapis.post(path, content=raw, headers=headers)
    assert (got.status_code, got.json()) == (want.status_code, want.json())


@pytest.mark.parametrize("text", [
    '{"a": 1, "a": 2}', '{"a": NaN, "b": -Infinity}', '{"a": 123456789012345678901234567890}', '{"a": -0.0}',
    '{"a": 1e400}', '{"a": "\\ud83d\\ude00 \\u00e9 \\u0000"}', '{"a": "\\ud800"}', '{"\\udfff": [1.5e3, true, null]}',
    '{"a": "caf\u00e9 \u20ac"}', '{"a": 9007199254740993, "b": 0.1}',
])
def test_parse_json_reads_as_json_loads(text):
    assert repr(parse_json(text.encode())) == repr(json.loads(text))
