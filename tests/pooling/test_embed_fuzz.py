"""schemathesis against a pooling server's /v1/embeddings: generated requests, valid and invalid,
never get a 5xx, and the engine is up and idle afterwards."""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from server.live import LiveServer


def test_no_server_errors_on_embeddings(st_mean):
    server = LiveServer(st_mean, max_model_len=24, max_num_seqs=16)
    try:
        schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json")
        [op] = [r.ok() for r in schema.get_all_operations() if r.ok().path == "/v1/embeddings"]
        for mode in GenerationMode:
            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=25, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def fuzz(case):
                response = case.call(base_url=server.base_url, timeout=30)
                case.validate_response(response, checks=[not_a_server_error])

            fuzz()
        assert httpx.get(server.base_url + "/health").status_code == 200
        assert server.wait_idle()["kv_cache_usage"] == 0.0
    finally:
        server.close()
