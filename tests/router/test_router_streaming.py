"""Streaming through the router: what the client gets is, byte for byte, what the replica sent."""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import httpx
import pytest
from router_support import router_process, write_static
from tap import Tap

PROMPT = "class LRUCache:\n    def __init__(self, capacity):"


@pytest.fixture(scope="module")
def tapped(replicas, tmp_path_factory):
    """A router whose only endpoint for `alpha` is a tap in front of the alpha replica. PrefixHash
    needs no scrapes of /metrics, so the tap sees only the test's requests."""
    tap = Tap(urlparse(replicas["alpha"].url).port)
    folder = tmp_path_factory.mktemp("tapped")
    static = write_static(folder / "models.yaml", [{"name": "alpha", "endpoints": [tap.url],
                                                         "loadBalancing": {"strategy": "PrefixHash"}}])
    with router_process(static, log_path=folder / "router.log") as router:
        yield router, tap
    tap.close()


def _events(body: bytes) -> list[str]:
    return [e for e in body.decode().split("\n\n") if e]


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": "alpha", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"model": "alpha", "messages": [{"role": "user", "content": "Merge two dicts."}],
                              "max_tokens": 24, "temperature": 0, "stream": True}),
])
def test_stream_bytes_are_the_replicas_bytes(tapped, path, body):
    router, tap = tapped
    before = len(tap.responses())
    chunks = []
    with httpx.stream("POST", router.url + path, json=body, timeout=60, trust_env=False) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        chunks = list(reply.iter_raw())
    received = b"".join(chunks)
    # Several chunks reached the client (not one buffered body), and they add up to the replica's body.
    assert len(chunks) > 1
    responses = tap.responses()
    assert len(responses) == before + 1
    status, sent = responses[-1]
    assert status == 200
    assert received == sent
    events = _events(received)
    assert events[-1] == "data: [DONE]" and len(events) > 3


def _masked(text: str) -> str:
    """A response with its per-request fields (id, created) blanked: all else must match."""
    text = re.sub(r'"id": ?"[^"]*"', '"id": ""', text)
    return re.sub(r'"created": ?\d+', '"created": 0', text)


def test_non_streaming_body_equals_a_direct_request(tapped, replicas):
    router, _ = tapped
    body = {"model": "alpha", "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 2}
    routed = httpx.post(router.url + "/v1/completions", json=body, timeout=60, trust_env=False)
    direct = httpx.post(replicas["alpha"].url + "/v1/completions", json=body, timeout=60, trust_env=False)
    assert routed.status_code == direct.status_code == 200
    assert routed.headers["content-length"] == direct.headers["content-length"]
    assert _masked(routed.text) == _masked(direct.text)


def test_stream_carries_the_same_text_as_a_direct_stream(tapped, replicas):
    """Chunk boundaries follow the replica's steps, so two streams may cut differently; the text,
    the finish reason and every event's fields are the same."""
    router, _ = tapped
    body = {"model": "alpha", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": True}

    def stream(url):
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60, trust_env=False) as reply:
            events = [json.loads(e[6:]) for e in _events(reply.read()) if e != "data: [DONE]"]
        return ("".join(e["choices"][0]["text"] for e in events), events[-1]["choices"][0]["finish_reason"],
                {tuple(sorted(e)) for e in events})

    assert stream(router.url) == stream(replicas["alpha"].url)
