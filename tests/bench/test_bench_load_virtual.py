"""The load generator's logic in virtual time (tests/bench/virtual_time.py): a stub server in an
httpx.MockTransport sends its first token FIRST_DELAY after a request arrives and one more every
INTERVAL. With the loop's virtual clock injected, TTFT, TPOT, every inter-token gap and every send
time are known exactly, so the tests check the generator's arithmetic and schedule to the nanosecond
without reading the wall clock."""

from __future__ import annotations

import heapq
import json

import httpx
import pytest
from virtual_time import run_virtual

from pagoda.runtime.tools.bench.serve_client import (
    RequestResult,
    arrival_offsets,
    run_load,
    slowest_first_tokens,
    summarize,
)
from pagoda.runtime.tools.bench.workloads import serving_requests

FIRST_DELAY = 0.060
INTERVAL = 0.020
URL = "http://stub/v1/completions"


class Stub:
    """An OpenAI-style SSE completions endpoint whose timing is fixed; it records, in loop time,
    when each request arrived and how many were in flight."""

    def __init__(self, loop):
        self.loop = loop
        self.arrivals: list[float] = []
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.transport = httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        import asyncio

        body = json.loads(await request.aread())
        self.arrivals.append(self.loop.time())
        self.bodies.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

        async def events():
            await asyncio.sleep(FIRST_DELAY)
            for i in range(body["max_tokens"]):
                if i:
                    await asyncio.sleep(INTERVAL)
                chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            # Done before the last event: the client stops reading at [DONE], so code after the
            # final yield would never run.
            self.in_flight -= 1
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=events(), headers={"content-type": "text/event-stream"})


def _run(rate: float, max_concurrency: int | None, n: int = 6, seed: int = 3):
    requests = serving_requests(n, seed, (8, 16), (5, 9))

    async def main(loop):
        stub = Stub(loop)
        results, duration = await run_load(URL, requests, [r.prompt_token_ids for r in requests], "stub-model",
                                           rate, max_concurrency, seed=seed, progress=False, clock=loop.time,
                                           transport=stub.transport)
        return stub, results, duration

    return requests, *run_virtual(main)


def service_time(output_len: int) -> float:
    return FIRST_DELAY + (output_len - 1) * INTERVAL


def test_timing_math_is_exact():
    requests, stub, results, duration = _run(float("inf"), None)
    assert stub.arrivals == [0.0] * 6 and stub.max_in_flight == 6  # all at once
    for req, res in zip(requests, results):
        assert res.success and res.usage_reported and res.output_tokens == req.output_len
        assert res.ttft_s == pytest.approx(FIRST_DELAY, abs=1e-9)
        assert res.itl_s == pytest.approx([INTERVAL] * (req.output_len - 1), abs=1e-9)
        assert res.tpot_s == pytest.approx(INTERVAL, abs=1e-9)
        assert res.latency_s == pytest.approx(service_time(req.output_len), abs=1e-9)
    assert duration == pytest.approx(max(service_time(r.output_len) for r in requests), abs=1e-9)
    summary = summarize(results, duration, float("inf"))
    assert summary["completed"] == 6 and summary["failed"] == 0 and summary["output_len_mismatches"] == 0
    assert summary["ttft_ms_p99"] == pytest.approx(FIRST_DELAY * 1e3)
    assert summary["tpot_ms_p50"] == pytest.approx(INTERVAL * 1e3)
    assert summary["itl_ms_p50"] == pytest.approx(INTERVAL * 1e3)
    total = sum(r.output_len for r in requests)
    assert summary["output_tokens_per_s"] == pytest.approx(total / duration)
    # The payload forces each drawn length (vLLM's min_tokens + ignore_eos) and asks for usage.
    for req, body in zip(requests, stub.bodies):
        assert body["prompt"] == req.prompt_token_ids and body["max_tokens"] == body["min_tokens"] == req.output_len
        assert body["ignore_eos"] and body["stream"] and body["stream_options"] == {"include_usage": True}


def test_poisson_sends_each_request_at_its_offset():
    requests, stub, results, _ = _run(20.0, None)
    assert all(r.success for r in results)
    assert stub.arrivals == pytest.approx(arrival_offsets(6, 20.0, seed=3), abs=1e-9)
    assert [r.sent_s for r in results] == pytest.approx(stub.arrivals, abs=1e-9)  # each result knows its send


def test_the_slowest_first_tokens_come_with_what_was_sent_before_them():
    """A burst: four requests sent within 0.3 s, the last of them the slowest; a lone request sent
    much later is second slowest, with nothing in flight or in its window."""
    def done(sent, prompt_len, ttft, latency):
        return RequestResult(prompt_len, 8, success=True, ttft_s=ttft, latency_s=latency, sent_s=sent)

    burst = [done(1.0, 100, 0.05, 0.5), done(1.1, 200, 0.08, 0.5), done(1.2, 300, 0.10, 0.5),
             done(1.3, 400, 0.40, 0.9)]
    lone = done(5.0, 50, 0.30, 0.6)
    quick = [done(7.0 + i, 10, 0.01, 0.1) for i in range(10)]
    slowest = slowest_first_tokens(burst + [lone] + quick)
    assert len(slowest) == 8 and [s["ttft_ms"] for s in slowest[:3]] == [400.0, 300.0, 100.0]
    top = slowest[0]
    assert top["sent_s"] == 1.3 and top["prompt_len"] == 400 and top["first_token_at_s"] == pytest.approx(1.7)
    assert top["in_flight_at_send"] == 3 and top["sent_in_window_before"] == 3
    assert top["prompt_tokens_in_window_before"] == 600
    assert slowest[1]["in_flight_at_send"] == 0 and slowest[1]["sent_in_window_before"] == 0
    assert summarize(burst + [lone], 6.0, 1.0)["ttft_slowest"] == slowest_first_tokens(burst + [lone])


def test_concurrency_cap_delays_requests_until_a_slot_frees():
    """With a cap of 2, request i goes at max(its Poisson offset, the moment a slot frees): a
    two-server FIFO queue whose service times are the stub's fixed ones."""
    requests, stub, results, duration = _run(20.0, 2, n=10)
    assert all(r.success for r in results)
    expected, free_at = [], [0.0, 0.0]
    for offset, req in zip(arrival_offsets(10, 20.0, seed=3), requests):
        start = max(offset, heapq.heappop(free_at))
        expected.append(start)
        heapq.heappush(free_at, start + service_time(req.output_len))
    assert stub.arrivals == pytest.approx(expected, abs=1e-9)
    assert expected != pytest.approx(arrival_offsets(10, 20.0, seed=3))  # the cap did delay some
    assert stub.max_in_flight == 2
    assert duration == pytest.approx(max(free_at), abs=1e-9)
