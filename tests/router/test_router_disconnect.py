"""A client that leaves the router mid-request cancels the replica's request: its KV blocks are freed."""

from __future__ import annotations

import httpx
import pytest
from router_support import metric, wait_for

LONG = {"prompt": "def main(argv=None):", "max_tokens": 900, "temperature": 0, "ignore_eos": True}


def _busy(replica) -> tuple[float, float]:
    return metric(replica.url, "vllm:num_requests_running"), metric(replica.url, "vllm:kv_cache_usage_perc")


def _aborts(replica) -> float:
    return metric(replica.url, "vllm:request_success", finished_reason="abort")


def _idle(replica):
    return _busy(replica) == (0.0, 0.0)


@pytest.mark.parametrize("model", ["alpha", "beta"])  # PrefixHash and LeastLoad
def test_stream_disconnect_frees_the_replicas_blocks(router, replicas, model):
    replica = replicas[model]
    wait_for(lambda: _idle(replica), "the replica idle before the test")
    aborts = _aborts(replica)
    with httpx.stream("POST", f"{router.url}/v1/completions", json={"model": model, "stream": True, **LONG},
                      timeout=60, trust_env=False) as reply:
        lines = reply.iter_lines()
        first = [next(lines) for _ in range(6)]
        assert first[0].startswith("data: ")
        running, usage = wait_for(lambda: (b := _busy(replica))[0] and b, "the request running on the replica")
        assert running == 1 and usage > 0
    # 900 tokens take far longer than this bound on the CPU; only an abort frees the blocks this soon.
    wait_for(lambda: _idle(replica), "the replica's KV blocks freed after the client left", timeout=10)
    assert _aborts(replica) == aborts + 1
    assert metric(router.url, "pagoda_router_in_flight_requests", model=model) == 0


def test_non_streaming_disconnect_frees_the_replicas_blocks(router, replicas):
    replica = replicas["beta"]
    wait_for(lambda: _idle(replica), "the replica idle before the test")
    aborts = _aborts(replica)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{router.url}/v1/completions", json={"model": "beta", **LONG}, timeout=1.5, trust_env=False)
    wait_for(lambda: _idle(replica), "the replica's KV blocks freed after the client left", timeout=10)
    assert _aborts(replica) == aborts + 1
