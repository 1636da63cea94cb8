"""/metrics: vLLM's names (`vllm:`) with a model_name label, Pagoda's own figures under `pagoda:`,
moving correctly under load."""

from __future__ import annotations

import threading
import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from .live import MODEL

GAUGES = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "cache_config_info"]
COUNTERS = ["prompt_tokens", "generation_tokens", "num_preemptions", "prefix_cache_queries",
            "prefix_cache_hits", "request_success"]
HISTOGRAMS = ["time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds", "request_time_per_output_token_seconds", "request_prefill_time_seconds",
              "request_decode_time_seconds", "request_inference_time_seconds", "request_prompt_tokens",
              "request_generation_tokens"]


def scrape(server) -> dict[str, float]:
    """Samples by name (plus finished_reason for request_success), summed over other labels."""
    resp = httpx.get(server.base_url + "/metrics")
    assert resp.status_code == 200
    values: dict[str, float] = {}
    for fam in text_string_to_metric_families(resp.text):
        for s in fam.samples:
            if not s.name.startswith(("vllm:", "pagoda:")) or s.name == "vllm:cache_config_info":
                continue
            assert s.labels.get("model_name") == MODEL, s
            key = s.name
            if "finished_reason" in s.labels:
                key += "{" + s.labels["finished_reason"] + "}"
            if "le" in s.labels:
                continue
            values[key] = values.get(key, 0.0) + s.value
    return values


def test_exposition_has_the_design_set(server):
    resp = httpx.get(server.base_url + "/metrics")
    assert resp.headers["content-type"].startswith("text/plain")
    kinds = {fam.name: fam.type for fam in text_string_to_metric_families(resp.text)}
    for name in GAUGES:
        assert kinds["vllm:" + name] == "gauge"
    for name in COUNTERS:
        assert kinds["vllm:" + name] == "counter"
    for name in HISTOGRAMS:
        assert kinds["vllm:" + name] == "histogram"
    assert kinds["pagoda:kv_cache_capacity_tokens"] == "gauge"
    values = scrape(server)
    assert values["pagoda:kv_cache_capacity_tokens"] == server.client.memory_plan.kv_capacity_tokens
    # The KV cache's configuration as labels of a constant 1, as vLLM exports it.
    (info,) = [s for fam in text_string_to_metric_families(resp.text) for s in fam.samples
               if s.name == "vllm:cache_config_info"]
    assert info.value == 1
    assert info.labels["num_gpu_blocks"] == str(server.client.memory_plan.num_kv_blocks)
    assert info.labels["block_size"] == str(server.client.memory_plan.block_size)
    assert info.labels["enable_prefix_caching"] in ("True", "False")


def test_metrics_move_under_load(queue_server, cycle_model):
    """max_num_seqs=1: requests queue up, and the waiting gauge shows it while they do."""
    queue_server.wait_idle()
    before = scrape(queue_server)
    client = openai.OpenAI(base_url=queue_server.v1, api_key="x", max_retries=0)
    jobs = [(cycle_model.letters, 40), (cycle_model.euro, 30), (cycle_model.letters[:2], 25)]
    results: list = [None] * len(jobs)

    def run(i):
        prompt, max_tokens = jobs[i]
        results[i] = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    threads[0].start()  # the first runs; max_queue_len=2 leaves room for the other two to wait
    while queue_server.stats()["num_running"] == 0:
        time.sleep(0.005)
    for t in threads[1:]:
        t.start()
    peak_waiting, peak_running, peak_usage = 0.0, 0.0, 0.0
    while any(t.is_alive() for t in threads):
        now = scrape(queue_server)
        peak_waiting = max(peak_waiting, now["vllm:num_requests_waiting"])
        peak_running = max(peak_running, now["vllm:num_requests_running"])
        peak_usage = max(peak_usage, now["vllm:kv_cache_usage_perc"])
        time.sleep(0.01)
    for t in threads:
        t.join()
    queue_server.wait_idle()
    after = scrape(queue_server)

    def delta(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert peak_waiting >= 1 and peak_running == 1 and peak_usage > 0
    assert after["vllm:num_requests_waiting"] == 0 and after["vllm:num_requests_running"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0
    # The token counters equal the tokens served.
    assert delta("vllm:prompt_tokens_total") == sum(r.usage.prompt_tokens for r in results)
    assert delta("vllm:generation_tokens_total") == sum(r.usage.completion_tokens for r in results)
    assert delta("vllm:request_success_total{length}") == len(jobs)
    # One observation per request, and one inter-token gap per token after the first.
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_time_per_output_token_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds", "request_inference_time_seconds"):
        assert delta(f"vllm:{name}_count") == len(jobs), name
        assert delta(f"vllm:{name}_sum") > 0, name
    # The per-request token histograms sum to the tokens served.
    assert delta("vllm:request_prompt_tokens_sum") == sum(r.usage.prompt_tokens for r in results)
    assert delta("vllm:request_generation_tokens_sum") == sum(r.usage.completion_tokens for r in results)
    assert delta("vllm:request_generation_tokens_count") == len(jobs)
    assert delta("vllm:inter_token_latency_seconds_count") == sum(r.usage.completion_tokens - 1 for r in results)
    # The engine's own counters come through too.
    assert delta("vllm:prefix_cache_queries_total") >= sum(r.usage.prompt_tokens for r in results)
