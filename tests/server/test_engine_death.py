"""A dead engine is noticed at once: requests in flight get a 503 (or, mid-stream, an error event)
in OpenAI's shape, /health answers 503, the gauges drop to zero (a stale queue would read to an
autoscaler as one that never drains), and `pagoda serve` exits non-zero so that the pod restarts."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_process import pagoda_serve

from .live import MODEL, LiveServer
from .test_errors import assert_error_shape

HANG_GUARD = 120  # seconds: only so that a broken server fails the test instead of hanging it
GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "kv_cache_capacity_tokens")


def gauges(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=HANG_GUARD).text
    families = {f.name.split(":", 1)[-1]: f for f in text_string_to_metric_families(text)}
    return {name: families[name].samples[0].value for name in GAUGES}


def until(condition, what: str):
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def post_in_thread(url: str, body: dict) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def send():
        result["resp"] = httpx.post(url, json=body, timeout=HANG_GUARD)

    thread = threading.Thread(target=send)
    thread.start()
    return thread, result


def test_engine_process_death_fails_requests_in_flight_and_zeroes_the_gauges(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=64, engine_mode="process")
    deaths: list[str] = []
    s.client.on_engine_death.append(deaths.append)
    try:
        assert gauges(s.base_url)["kv_cache_capacity_tokens"] > 0
        engine = s.client.proc
        engine.send_signal(signal.SIGSTOP)  # the request below stays in flight: the engine never answers
        thread, result = post_in_thread(s.v1 + "/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4})
        until(lambda: gauges(s.base_url)["num_requests_waiting"] >= 1, "the request is waiting")
        engine.send_signal(signal.SIGKILL)  # as an OOM kill takes it
        thread.join(HANG_GUARD)
        err = assert_error_shape(result["resp"], 503)
        assert err["code"] == "engine_unavailable" and "engine process exited" in err["message"]
        assert set(gauges(s.base_url).values()) == {0.0}
        health = httpx.get(s.base_url + "/health", timeout=HANG_GUARD)
        assert assert_error_shape(health, 503)["code"] == "engine_unavailable"
        assert len(deaths) == 1 and "engine process exited" in deaths[0]
        with pytest.raises(openai.InternalServerError) as info:
            openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0).completions.create(
                model=MODEL, prompt="hi", max_tokens=2)
        assert info.value.status_code == 503
    finally:
        s.close()
    assert len(deaths) == 1  # shutting down is no second death


def test_engine_loop_failure_mid_stream_ends_the_stream_with_an_error(tiny_dir):
    s = LiveServer(tiny_dir, max_model_len=64, engine_mode="thread")
    deaths: list[str] = []
    s.client.on_engine_death.append(deaths.append)
    core = s.client.engine
    step, calls = core.step, []

    def failing_step():
        calls.append(1)
        if len(calls) > 1:  # the first step writes the first token; the second fails
            raise RuntimeError("injected step failure")
        return step()

    core.step = failing_step
    try:
        oai = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        stream = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=20, extra_body={"ignore_eos": True}, stream=True)
        with pytest.raises(openai.APIError) as info:
            for _ in stream:
                pass
        assert "injected step failure" in info.value.message
        assert len(deaths) == 1 and "injected step failure" in deaths[0]
        assert httpx.get(s.base_url + "/health", timeout=HANG_GUARD).status_code == 503
        assert set(gauges(s.base_url).values()) == {0.0}
    finally:
        s.close()
    assert len(deaths) == 1


def test_pagoda_serve_exits_when_its_engine_dies(tiny_dir, tmp_path):
    log = tmp_path / "serve.log"
    with pagoda_serve(tiny_dir, "--device", "cpu", "--max-model-len", "64", "--engine-mode", "process",
                      log_path=log) as server:
        (engine,) = psutil.Process(server.process.pid).children()
        engine.send_signal(signal.SIGSTOP)
        thread, result = post_in_thread(server.url + "/v1/completions",
                                        {"model": str(tiny_dir), "prompt": "hi", "max_tokens": 4})
        until(lambda: gauges(server.url)["num_requests_waiting"] >= 1, "the request is waiting")
        engine.send_signal(signal.SIGKILL)
        thread.join(HANG_GUARD)
        assert assert_error_shape(result["resp"], 503)["code"] == "engine_unavailable"
        try:
            code = server.process.wait(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`pagoda serve` kept running without its engine:\n{server.log_tail()}")
        assert code == 1, server.log_tail()
        assert "the engine died" in server.log_tail()
