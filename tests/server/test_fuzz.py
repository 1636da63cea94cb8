"""schemathesis reads /openapi.json and throws generated requests, valid and invalid, at every
route: none may get a 5xx, and the engine must still be up afterwards."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode

from .live import LiveServer

EXAMPLES = 12  # per operation and mode: bounded, so the fuzz stays a few seconds


@pytest.fixture(scope="module")
def fuzz_server(tiny_dir):
    # A short max_model_len keeps every accepted request cheap.
    s = LiveServer(tiny_dir, max_model_len=24, max_num_seqs=16)
    yield s
    s.close()


def test_no_server_errors(fuzz_server):
    # schemathesis' own pytest plugin does not load under this pytest, so its strategies drive
    # hypothesis directly (the same cases `schemathesis run` would send).
    schema = schemathesis.openapi.from_url(fuzz_server.base_url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/tokenize"}
    for op in operations:
        # A GET without parameters has no invalid form to generate.
        modes = list(GenerationMode) if op.method.upper() == "POST" else [GenerationMode.POSITIVE]
        for mode in modes:
            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def fuzz(case):
                response = case.call(base_url=fuzz_server.base_url, timeout=30)
                case.validate_response(response, checks=[not_a_server_error])

            fuzz()


def test_engine_survives_the_fuzz(fuzz_server):
    assert httpx.get(fuzz_server.base_url + "/health").status_code == 200
    fuzz_server.wait_idle()
