"""Routing by `model` through a real router to real replicas: names, aliases, unknown models."""

from __future__ import annotations

import httpx
import openai
import pytest
from router_support import metric


def _client(router) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _served(replica) -> float:
    return metric(replica.url, "vllm:prompt_tokens")


@pytest.mark.parametrize("model,replica,served_as", [("alpha", "alpha", "alpha"), ("beta", "beta", "beta"),
                                                     ("a", "alpha", "alpha")])
def test_each_model_goes_to_its_own_replica(router, replicas, model, replica, served_as):
    other = "beta" if replica == "alpha" else "alpha"
    before = {name: _served(r) for name, r in replicas.items()}
    reply = _client(router).completions.create(model=model, prompt="def parse(text):", max_tokens=4,
                                               temperature=0)
    assert reply.model == served_as  # an alias reaches the replica under the name it serves
    assert reply.usage.prompt_tokens > 0
    assert _served(replicas[replica]) == before[replica] + reply.usage.prompt_tokens
    assert _served(replicas[other]) == before[other]


def test_chat_is_routed_and_matches_a_direct_request(router, replicas):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list."}]
    routed = _client(router).chat.completions.create(model="beta", messages=messages, max_tokens=12,
                                                     temperature=0)
    direct = openai.OpenAI(base_url=f"{replicas['beta'].url}/v1", api_key="unused", max_retries=0).chat.completions \
        .create(model="beta", messages=messages, max_tokens=12, temperature=0)
    assert routed.choices[0].message.content == direct.choices[0].message.content
    assert routed.usage == direct.usage


def test_models_lists_every_name_and_alias(router):
    listed = {m.id: m for m in _client(router).models.list().data}
    assert set(listed) == {"alpha", "a", "beta"}
    assert listed["a"].model_extra["root"] == "alpha"
    assert listed["beta"].model_extra["ready_replicas"] == 1


@pytest.mark.parametrize("name,root", [("alpha", "alpha"), ("a", "alpha"), ("beta", "beta")])
def test_a_model_is_retrieved_by_name_or_alias(router, name, root):
    card = _client(router).models.retrieve(name)
    assert card.id == name and card.model_extra["root"] == root
    assert card.model_extra["ready_replicas"] == 1


@pytest.mark.parametrize("name", ["gamma", "org/gamma"])  # a served name may hold a "/"
def test_retrieving_an_unknown_model_is_a_404_in_openai_shape(router, name):
    with pytest.raises(openai.NotFoundError) as info:
        _client(router).models.retrieve(name)
    assert info.value.body["code"] == "model_not_found" and f"`{name}`" in info.value.body["message"]


def test_unknown_model_is_a_404_in_openai_shape(router):
    with pytest.raises(openai.NotFoundError) as info:
        _client(router).completions.create(model="gamma", prompt="x", max_tokens=1)
    assert info.value.body["code"] == "model_not_found"
    assert "gamma" in info.value.body["message"]


@pytest.mark.parametrize("body,param", [(b"{not json", None), (b'{"prompt": "x"}', "model"),
                                        (b'["model"]', "model")])
def test_a_request_without_a_model_is_a_400(router, body, param):
    reply = httpx.post(f"{router.url}/v1/completions", content=body, headers={"content-type": "application/json"},
                       timeout=10, trust_env=False)
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert reply.json()["error"]["param"] == param


def test_a_replica_error_comes_back_unchanged(router, replicas):
    """The replica's own 400 (max_tokens too large for the model) is relayed with its body."""
    body = {"model": "beta", "prompt": "x", "max_tokens": 10**6}
    routed = httpx.post(f"{router.url}/v1/completions", json=body, timeout=30, trust_env=False)
    direct = httpx.post(f"{replicas['beta'].url}/v1/completions", json=body, timeout=30, trust_env=False)
    assert routed.status_code == direct.status_code == 400
    assert routed.content == direct.content
