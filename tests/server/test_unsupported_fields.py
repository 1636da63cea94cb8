"""Every request field Pagoda does not implement, vLLM's or OpenAI's, is a 400 naming it; so is a
field nobody defines. A known field sent with the value that asks for nothing (null, or "off") is
accepted, as clients that send every default expect; the legacy guided_* fields point to
structured_outputs."""

from __future__ import annotations

import openai
import pytest

from pagoda.runtime.frontend.server.unsupported import NOT_IMPLEMENTED

from .live import MODEL

ROUTES = {
    "completions": lambda oai, extra: oai.completions.create(model=MODEL, prompt="hi", max_tokens=2,
                                                             extra_body=extra),
    "chat": lambda oai, extra: oai.chat.completions.create(model=MODEL, max_tokens=2, extra_body=extra,
                                                           messages=[{"role": "user", "content": "hi"}]),
}
NOT_ON_COMPLETIONS = {"echo"}  # implemented there


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def _refused(oai, route, extra) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        ROUTES[route](oai, extra)
    return info.value.body


@pytest.mark.parametrize("route", ROUTES)
def test_every_unimplemented_field_is_a_400_naming_it(oai, route):
    for name in NOT_IMPLEMENTED:
        if route == "completions" and name in NOT_ON_COMPLETIONS:
            continue
        body = _refused(oai, route, {name: {"on": 12345}})
        assert body["param"] == name and "not supported" in body["message"], body


@pytest.mark.parametrize("route", ROUTES)
def test_unknown_fields_are_400s(oai, route):
    for name in ("frobnicate", "temprature", "guided_decoding", "top_n"):
        body = _refused(oai, route, {name: 1})
        assert body["param"] == name and "not a field" in body["message"], body


@pytest.mark.parametrize("route", ROUTES)
def test_values_that_ask_for_nothing_are_accepted(oai, route):
    harmless = {"use_beam_search": False, "length_penalty": 1, "priority": 0, "service_tier": "auto",
                "store": False, "metadata": None, "spaces_between_special_tokens": True,
                "return_token_ids": False}
    assert ROUTES[route](oai, harmless).usage.completion_tokens >= 1


def test_legacy_guided_fields_name_structured_outputs(oai):
    body = _refused(oai, "completions", {"guided_choice": ["a", "b"]})
    assert body["param"] == "guided_choice" and "structured_outputs" in body["message"]
