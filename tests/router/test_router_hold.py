"""Scale from zero at the router: a request for a model with no ready replica is held, bounded in
count and time, and released when a replica comes up; a time-out is a 503 with Retry-After."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest
from router_support import REPLICA_FLAGS, ROOT, metric, router_process, wait_for, write_static
from serve_process import pagoda_serve


def _client(router, timeout=300) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=timeout)


def test_held_request_is_released_when_a_replica_comes_up(demo_model, tmp_path):
    static = write_static(tmp_path / "models.yaml", [{"name": "late", "endpoints": []}])
    with router_process(static, "--hold-timeout", "300", log_path=tmp_path / "router.log") as router, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_client(router).completions.create, model="late", prompt="import os\n", max_tokens=6,
                           temperature=0)
        wait_for(lambda: metric(router.url, "pagoda_router_queue_depth", model="late") == 1,
                 "the request held at the router")
        assert metric(router.url, "pagoda_router_scale_from_zero", model="late") == 1
        assert not held.done()
        # The replica starts only now; the request waits through its whole start-up.
        with pagoda_serve(demo_model, "--served-model-name", "late", *REPLICA_FLAGS,
                          log_path=tmp_path / "late.log", cwd=ROOT) as replica:
            assert not held.done()
            write_static(static, [{"name": "late", "endpoints": [replica.url]}])
            reply = held.result(timeout=120)
            assert reply.model == "late" and reply.choices[0].finish_reason == "length"
            assert reply.usage.completion_tokens == 6
            assert metric(replica.url, "vllm:generation_tokens") == 6
        assert metric(router.url, "pagoda_router_queue_depth", model="late") == 0
        assert metric(router.url, "pagoda_router_hold_timeouts", model="late") == 0


def test_hold_times_out_with_a_503_and_retry_after(tmp_path):
    static = write_static(tmp_path / "models.yaml", [{"name": "asleep", "endpoints": []}])
    flags = ("--hold-timeout", "3", "--max-held", "1", "--retry-after", "7")
    with router_process(static, *flags, log_path=tmp_path / "router.log") as router, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_client(router).completions.create, model="asleep", prompt="x", max_tokens=1)
        wait_for(lambda: metric(router.url, "pagoda_router_queue_depth", model="asleep") == 1,
                 "the first request held")
        # The hold is full: the next request is turned away at once, not queued.
        with pytest.raises(openai.InternalServerError) as overflow:
            _client(router).completions.create(model="asleep", prompt="y", max_tokens=1)
        assert overflow.value.status_code == 503
        assert overflow.value.body["code"] == "model_unavailable"
        assert "already waiting" in overflow.value.body["message"]
        assert overflow.value.response.headers["retry-after"] == "7"

        with pytest.raises(openai.InternalServerError) as timed_out:
            held.result(timeout=60)
        assert timed_out.value.status_code == 503
        assert timed_out.value.response.headers["retry-after"] == "7"
        assert timed_out.value.body["type"] == "service_unavailable_error"
        assert "within 3 s" in timed_out.value.body["message"]
        assert metric(router.url, "pagoda_router_hold_timeouts", model="asleep") == 1
        assert metric(router.url, "pagoda_router_queue_depth", model="asleep") == 0
        assert metric(router.url, "pagoda_router_requests", model="asleep", code="503") == 2

        # A held client that gives up frees its place at once, not at the time-out.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{router.url}/v1/completions", json={"model": "asleep", "prompt": "z"}, timeout=0.5,
                       trust_env=False)
        wait_for(lambda: metric(router.url, "pagoda_router_queue_depth", model="asleep") == 0,
                 "the held request dropped with its client")
        assert metric(router.url, "pagoda_router_hold_timeouts", model="asleep") == 1
        assert metric(router.url, "pagoda_router_requests", model="asleep", code="499") == 1
