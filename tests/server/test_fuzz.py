"""schemathesis reads /openapi.json and throws generated requests, valid and invalid, at every
route: none may get a 5xx, and the engine must still be up afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
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


# What schemathesis never generates: JSON that escapes a lone surrogate, bytes that are not UTF-8,
# and fields far larger than any limit the server sets (a string of 2 MB, under the body limit).
BAD_VALUES = {
    "lone surrogate": b'"a\\ud800"',
    "invalid utf-8": b'"a\xffb"',
    "utf-8 encoded surrogate": b'"\xed\xa0\x80"',
    "oversized string": b'"' + b"x " * (1 << 20) + b'"',
}
MARK = "\x01pagoda-fuzz\x01"


def string_slots(value, path=()):
    """Every place in a JSON document that holds a string, or could: values, and object keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, ("key", key))
            yield from string_slots(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from string_slots(item, (*path, i))
    elif isinstance(value, str):
        yield path


def marked(body, slot):
    """The body with MARK where the slot was (a copy)."""
    body = json.loads(json.dumps(body))
    *parents, last = slot
    target = body
    for step in parents:
        target = target[step]
    if isinstance(last, tuple):  # an object key
        target[MARK] = target.pop(last[1])
    else:
        target[last] = MARK
    return body


def test_no_server_errors_on_bad_unicode_or_oversized_fields(fuzz_server):
    schema = schemathesis.openapi.from_url(fuzz_server.base_url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    posts = [op for op in operations if op.method.upper() == "POST"]
    assert {op.path for op in posts} >= {"/v1/completions", "/v1/chat/completions", "/tokenize"}
    with httpx.Client(base_url=fuzz_server.base_url, timeout=60) as http:
        for op in posts:
            @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE), data=st.data())
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def fuzz(case, data):
                slots = list(string_slots(case.body))
                if not slots:
                    return
                slot = data.draw(st.sampled_from(slots), label="field")
                bad = data.draw(st.sampled_from(sorted(BAD_VALUES)), label="value")
                content = json.dumps(marked(case.body, slot)).encode().replace(
                    json.dumps(MARK).encode(), BAD_VALUES[bad])
                resp = http.post(case.path, content=content, headers={"content-type": "application/json"})
                assert resp.status_code < 500, (case.path, slot, bad, resp.text[:500])
                if resp.status_code >= 400:
                    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}

            fuzz()
        assert http.get("/health").status_code == 200
