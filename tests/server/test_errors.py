"""Bad input gets a clear error in OpenAI's shape, as the client's own exception types, and nobody
else's request is disturbed."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import openai
import pytest

from .live import MODEL, LiveServer


def assert_error_shape(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


# Each bad sampling parameter: test_openapi.py::test_every_validation_error_names_its_field.


def test_prompt_plus_max_tokens_over_max_model_len_gives_the_numbers(oai, server):
    prompt_len = len(httpx.post(server.base_url + "/tokenize", json={"prompt": "hello world"}).json()["tokens"])
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt="hello world", max_tokens=300)
    message = info.value.body["message"]
    for number in (256, prompt_len + 300, prompt_len, 300):
        assert str(number) in message
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x " * 300}])
    assert "256" in info.value.body["message"]


def test_malformed_json(server):
    resp = httpx.post(server.v1 + "/completions", content=b'{"model": "tiny", "prompt": ',
                      headers={"content-type": "application/json"})
    assert_error_shape(resp, 400)
    resp = httpx.post(server.v1 + "/chat/completions", json={"model": MODEL, "messages": "not a list"})
    assert assert_error_shape(resp, 400)["param"] == "messages"


def test_unknown_model_is_404(oai):
    with pytest.raises(openai.NotFoundError) as info:
        oai.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])


def test_body_too_large_is_413(server):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 999999999\r\n\r\n")
        s.settimeout(10)
        reply = b""
        while not reply.endswith(b"}}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    head, body = reply.decode().split("\r\n\r\n", 1)
    assert head.startswith("HTTP/1.1 413")
    assert json.loads(body)["error"]["code"] == "request_too_large"


@pytest.fixture(scope="module")
def keyed_server(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=64, api_key="s3cret")
    yield s
    s.close()


def test_api_key(keyed_server):
    wrong = openai.OpenAI(base_url=keyed_server.v1, api_key="s3cre", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    err = assert_error_shape(httpx.post(keyed_server.v1 + "/completions", json={"prompt": "hi"}), 401)
    assert err["code"] == "invalid_api_key"
    assert_error_shape(httpx.post(keyed_server.base_url + "/tokenize", json={"prompt": "a"}), 401)
    good = openai.OpenAI(base_url=keyed_server.v1, api_key="s3cret", max_retries=0)
    assert good.completions.create(model=MODEL, prompt="hi", max_tokens=2).usage.completion_tokens >= 1
    # Probes and scrapers need no key.
    assert httpx.get(keyed_server.base_url + "/health").status_code == 200
    assert httpx.get(keyed_server.base_url + "/metrics").status_code == 200


def test_queue_full_is_429(queue_server, cycle_model):
    """max_num_seqs=1 and max_queue_len=2: one runs, two wait, the fourth is refused."""
    client = openai.OpenAI(base_url=queue_server.v1, api_key="x", max_retries=0)
    results, errors = [], []

    def long_request():
        try:
            results.append(client.completions.create(model=MODEL, prompt=cycle_model.letters, max_tokens=150,
                                                     temperature=0))
        except Exception as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    threads = [threading.Thread(target=long_request) for _ in range(3)]
    threads[0].start()
    _wait_for(lambda: queue_server.stats()["num_running"] == 1)
    threads[1].start()
    threads[2].start()
    _wait_for(lambda: queue_server.stats()["num_waiting"] == 2)
    with pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert "2" in info.value.body["message"]
    for t in threads:
        t.join()
    assert not errors and len(results) == 3
    queue_server.wait_idle()
    client.completions.create(model=MODEL, prompt="hi", max_tokens=2)  # served again once there is room


def _wait_for(predicate, timeout: float = 10.0):
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_bad_requests_do_not_disturb_a_running_stream(cycle_server, cycle_model):
    body = {"model": MODEL, "prompt": cycle_model.letters[:1], "max_tokens": 120, "temperature": 0}
    want = httpx.post(cycle_server.v1 + "/completions", json=body, timeout=60).json()["choices"][0]["text"]
    text = ""
    with httpx.stream("POST", cycle_server.v1 + "/completions", json={**body, "stream": True}, timeout=60) as r:
        for i, line in enumerate(r.iter_lines()):
            if i == 4:  # mid-stream: a burst of bad requests
                assert httpx.post(cycle_server.v1 + "/completions", content=b"{").status_code == 400
                assert httpx.post(cycle_server.v1 + "/completions", json={"prompt": [10**6]}).status_code == 400
                assert httpx.post(cycle_server.v1 + "/completions",
                                  json={"model": "nope", "prompt": "a"}).status_code == 404
                assert httpx.post(cycle_server.v1 + "/completions",
                                  json={"prompt": "a", "max_tokens": 10**6}).status_code == 400
                assert httpx.post(cycle_server.v1 + "/chat/completions",
                                  json={"messages": [{"role": "wizard", "content": "a"}]}).status_code == 400
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
    assert text == want
    assert httpx.get(cycle_server.base_url + "/health").status_code == 200


def test_engine_down_is_503(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=64)
    try:
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices

        def broken_step():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        s.client.engine.step = broken_step  # the engine fails in the middle of serving
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert info.value.status_code == 503 and "illegal memory access" in info.value.body["message"]
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
        assert info.value.status_code == 503
        assert_error_shape(httpx.get(s.base_url + "/health"), 503)
        # What needs no engine still answers.
        assert httpx.get(s.base_url + "/metrics").status_code == 200
        assert httpx.post(s.base_url + "/tokenize", json={"prompt": "a b"}).status_code == 200
    finally:
        s.close()
