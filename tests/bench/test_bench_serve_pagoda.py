"""The load generator against a real `pagoda serve` (tiny random-weight model, CPU, loopback)."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from serve_process import pagoda_serve

from pagoda.runtime.cli import main
from pagoda.runtime.tools.bench import serve, workloads


@pytest.fixture
def pagoda_server(tmp_path):
    model = workloads.model_folder("tiny", tmp_path / "tiny")
    flags = ("--load-format", "dummy", "--device", "cpu", "--max-model-len", "256", "--served-model-name", "tiny",
             "--log-level", "warning")
    # No wait here: `bench serve --wait-for-server` is under test too.
    with pagoda_serve(model, *flags, log_path=tmp_path / "server.log", wait=False) as server:
        yield server.url, server.process


def _counter(metrics_text: str, name: str) -> float:
    match = re.search(rf"^vllm:{name}_total{{[^}}]*}} ([0-9.e+]+)$", metrics_text, re.M)
    assert match, f"vllm:{name}_total missing from /metrics"
    return float(match.group(1))


def test_bench_serve_against_pagoda(pagoda_server, tmp_path):
    url, proc = pagoda_server
    out = tmp_path / "results"
    rc = main(["bench", "serve", "--base-url", url + "/v1", "--wait-for-server", "180", "--request-rate", "8", "inf",
               "--num-prompts", "4", "--input-len", "16:32", "--output-len", "4:8", "--seed", "1", "--warmup-prompts", "2",
               "--no-progress", "--out", str(out)])
    assert proc.poll() is None, (tmp_path / "server.log").read_text()
    assert rc == 0
    (path,) = out.glob("W3-pagoda-*.json")
    record = json.loads(path.read_text())
    assert record["model"] == "tiny" and record["prompt_format"] == "ids"
    assert (out / record["plot"]).read_bytes()[:4] == b"\x89PNG"
    for index, rate in enumerate(record["rates"]):
        # Each rate after the first gets fresh prompts, so no rate rides on another's prefix cache.
        requests = workloads.serving_requests(4, 1 + index * serve.RATE_SEED_STRIDE, (16, 32), (4, 8))
        assert rate["completed"] == 4 and rate["failed"] == 0 and rate["errors"] == {}
        # The server honoured min_tokens/ignore_eos and took the token-id prompts as they are.
        assert rate["output_len_mismatches"] == 0 and rate["usage_reported"]
        assert rate["output_tokens"] == sum(r.output_len for r in requests)
        assert rate["prompt_tokens"] == sum(len(r.prompt_token_ids) for r in requests)
        assert 0 < rate["ttft_ms_p50"] <= rate["ttft_ms_p99"] <= rate["e2e_ms_p99"]
        assert 0 < rate["tpot_ms_p50"] <= rate["tpot_ms_p99"]
        assert rate["itl_ms_p50"] > 0
        assert rate["output_tokens_per_s"] == pytest.approx(rate["output_tokens"] / rate["duration_s"])
        # The server's split of the rate's first tokens: this rate's four requests, no warm-up's
        side = rate["server_side"]
        assert side["queue"]["count"] == side["prefill"]["count"] == side["ttft"]["count"] == 4
        assert side["queue"]["buckets"]["+Inf"] == 4 and 0 < side["prefill"]["mean_ms"] <= side["ttft"]["mean_ms"]
        assert len(rate["ttft_slowest"]) == 4 and rate["ttft_slowest"][0]["ttft_ms"] == pytest.approx(
            rate["ttft_ms_p99"], rel=0.2)
    # The server's own counters agree with what the generator measured, plus the 1-token probe
    # and the warm-up (2 requests of 16 tokens, drawn with their own seed).
    warmup = workloads.serving_requests(2, 1 + serve.WARMUP_SEED_OFFSET, (16, 32), (16, 16))
    requests = workloads.serving_requests(4, 1, (16, 32), (4, 8))
    metrics = httpx.get(url + "/metrics", timeout=30).text
    total_out = sum(r["output_tokens"] for r in record["rates"])
    assert _counter(metrics, "generation_tokens") == total_out + 1 + 2 * 16
    total_prompt = sum(r["prompt_tokens"] for r in record["rates"])
    extra_prompt = len(requests[0].prompt_token_ids) + sum(len(r.prompt_token_ids) for r in warmup)
    assert _counter(metrics, "prompt_tokens") == total_prompt + extra_prompt
