"""The load generator's engine room: stream requests to an OpenAI-compatible `/v1/completions`
endpoint on a Poisson schedule, and time every token that comes back.

Per request: TTFT (send to first non-empty chunk), every inter-token gap between non-empty chunks,
TPOT = (latency - TTFT) / (output tokens - 1) with the server's own token count from `usage`, and
end-to-end latency. Timing uses perf_counter on the client, so it includes HTTP, the server's
queue, tokenization and detokenization: what a user meets.

The clock is a parameter (and the HTTP transport one of run_load's), so tests drive the generator
in virtual time and check its arithmetic exactly instead of against the wall clock.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np

from pagoda.runtime.tools.bench.workloads import BenchRequest


@dataclass(slots=True)
class RequestResult:
    prompt_len: int
    expected_output_len: int
    success: bool = False
    error: str | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    num_chunks: int = 0
    usage_reported: bool = False
    sent_s: float | None = None  # when it was sent, from the run's start

    @property
    def tpot_s(self) -> float | None:
        if not self.success or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def build_payload(request: BenchRequest, model: str, prompt) -> dict:
    """Lengths are forced: min_tokens = max_tokens and EOS ignored (vLLM's extensions)."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": request.output_len,
        "min_tokens": request.output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


Clock = Callable[[], float]


async def stream_completion(client: httpx.AsyncClient, url: str, payload: dict, headers: dict,
                            result: RequestResult, clock: Clock = time.perf_counter) -> RequestResult:
    start = clock()
    last = start
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {body[:300]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = clock()
                chunk = json.loads(data)
                if chunk.get("error"):
                    result.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    return result
                if chunk.get("usage"):
                    result.usage_reported = True
                    result.output_tokens = chunk["usage"].get("completion_tokens", 0)
                    result.prompt_tokens = chunk["usage"].get("prompt_tokens")
                choices = chunk.get("choices") or []
                if choices and choices[0].get("text"):
                    if result.ttft_s is None:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
                    result.num_chunks += 1
        result.latency_s = clock() - start
        if not result.usage_reported:
            result.output_tokens = result.num_chunks
        if result.ttft_s is None:
            result.error = "the stream carried no tokens"
        else:
            result.success = True
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, TypeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


def arrival_offsets(num_requests: int, request_rate: float, seed: int) -> list[float]:
    """Send times in seconds from the start: a Poisson process (exponential gaps) at request_rate,
    or all at zero for an infinite rate."""
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(num_requests):
        offsets.append(t)
        t += rng.expovariate(request_rate)
    return offsets


async def run_load(
    url: str,
    requests: list[BenchRequest],
    prompts: list,
    model: str,
    request_rate: float,
    max_concurrency: int | None = None,
    headers: dict | None = None,
    seed: int = 0,
    timeout_s: float = 1800.0,
    progress: bool = True,
    clock: Clock = time.perf_counter,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[list[RequestResult], float]:
    """Send every request at its arrival time; return the results and the wall time from the first
    send to the last completion. `clock` must tick with the event loop's own clock, which times
    asyncio.sleep (both are the wall clock outside tests)."""
    from tqdm.auto import tqdm

    offsets = arrival_offsets(len(requests), request_rate, seed)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    # httpx caps a pool at 100 connections by default: that would be a hidden concurrency limit.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(timeout_s, connect=60.0)
    bar = tqdm(total=len(requests), desc=f"rate {request_rate:g}", disable=not progress, leave=False)

    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False, transport=transport) as client:
        start = clock()

        async def one(request: BenchRequest, prompt, offset: float) -> RequestResult:
            delay = start + offset - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            result = RequestResult(prompt_len=len(request.prompt_token_ids), expected_output_len=request.output_len)
            payload = build_payload(request, model, prompt)
            if limit is None:
                result.sent_s = clock() - start
                await stream_completion(client, url, payload, headers or {}, result, clock)
            else:
                async with limit:
                    result.sent_s = clock() - start
                    await stream_completion(client, url, payload, headers or {}, result, clock)
            bar.update(1)
            return result

        results = await asyncio.gather(*(one(r, p, o) for r, p, o in zip(requests, prompts, offsets)))
        duration = clock() - start
    bar.close()
    return list(results), duration


def _percentiles(name: str, values_s: list[float]) -> dict:
    if not values_s:
        return {f"{name}_ms_{k}": None for k in ("mean", "p50", "p90", "p99")}
    ms = np.asarray(values_s) * 1e3
    return {
        f"{name}_ms_mean": float(ms.mean()),
        f"{name}_ms_p50": float(np.percentile(ms, 50)),
        f"{name}_ms_p90": float(np.percentile(ms, 90)),
        f"{name}_ms_p99": float(np.percentile(ms, 99)),
    }


SLOWEST = 8  # the slowest first tokens a summary describes


def slowest_first_tokens(results: list[RequestResult], window_s: float = 1.0) -> list[dict]:
    """The SLOWEST requests by TTFT, slowest first, each with what the server had on its hands when it
    was sent: requests in flight then, and the requests and prompt tokens sent in the window before.
    A burst shows as many tokens sent just before; a stall (a collection, a compile) as slow first
    tokens of requests sent at unrelated moments that all end about the same time."""
    timed = [r for r in results if r.success and r.sent_s is not None]
    out = []
    for r in sorted(timed, key=lambda r: r.ttft_s, reverse=True)[:SLOWEST]:
        before = [o for o in timed if r.sent_s - window_s <= o.sent_s < r.sent_s]
        out.append({
            "sent_s": round(r.sent_s, 4), "prompt_len": r.prompt_len, "ttft_ms": round(r.ttft_s * 1e3, 2),
            "first_token_at_s": round(r.sent_s + r.ttft_s, 4),
            "in_flight_at_send": sum(o.sent_s <= r.sent_s < o.sent_s + o.latency_s for o in timed if o is not r),
            "sent_in_window_before": len(before),
            "prompt_tokens_in_window_before": sum(o.prompt_len for o in before),
        })
    return out


def summarize(results: list[RequestResult], duration_s: float, request_rate: float) -> dict:
    ok = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok)
    errors: dict[str, int] = {}
    for r in failed:
        errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    return {
        "request_rate": "inf" if math.isinf(request_rate) else request_rate,
        "completed": len(ok),
        "failed": len(failed),
        "errors": errors,
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration_s,
        "output_tokens_per_s": output_tokens / duration_s,
        "total_tokens_per_s": (output_tokens + prompt_tokens) / duration_s,
        "output_tokens": output_tokens,
        "prompt_tokens": prompt_tokens,
        # Requests whose length the server did not honour (min_tokens/ignore_eos unsupported?).
        "output_len_mismatches": sum(r.output_tokens != r.expected_output_len for r in ok),
        "usage_reported": all(r.usage_reported for r in ok) if ok else False,
        **_percentiles("ttft", [r.ttft_s for r in ok]),
        **_percentiles("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]),
        **_percentiles("itl", [g for r in ok for g in r.itl_s]),
        **_percentiles("e2e", [r.latency_s for r in ok]),
        "ttft_slowest": slowest_first_tokens(ok),
    }
