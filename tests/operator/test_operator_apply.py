"""`Cluster.ensure`: create, leave alone, patch, and remove what the new manifest dropped."""

from __future__ import annotations

import asyncio

from pagoda.operator.builders.deployment import build_deployment
from pagoda.operator.config import OperatorConfig
from pagoda.operator.k8s import Cluster, merge_patch
from pagoda.operator.spec import ModelServer


def test_merge_patch_nulls_dropped_keys_and_replaces_lists():
    old = {"a": 1, "m": {"x": 1, "y": 2}, "l": [1, 2], "same": {"k": "v"}}
    new = {"a": 2, "m": {"x": 1}, "l": [3], "same": {"k": "v"}, "n": {"z": 0}}
    assert merge_patch(old, new) == {"a": 2, "m": {"y": None}, "l": [3], "n": {"z": 0}}
    assert merge_patch(old, old) == {}


def deployment(node_selector: dict | None) -> dict:
    body = {
        "metadata": {"name": "m", "namespace": "default", "uid": "u-1", "generation": 1},
        "spec": {"model": {"uri": "hf://org/m"}, "nodeSelector": node_selector},
    }
    return build_deployment(ModelServer.from_body(body), OperatorConfig(runtime_image="img:test"))


async def test_ensure_removes_a_dropped_node_selector_entry(apiserver):
    cluster = Cluster.from_environment()
    first = deployment({"pool": "gpu", "zone": "a"})
    _, action = await asyncio.to_thread(cluster.ensure, first)
    assert action == "created"
    _, action = await asyncio.to_thread(cluster.ensure, first)
    assert action == "unchanged"  # a second pass writes nothing
    _, action = await asyncio.to_thread(cluster.ensure, deployment({"pool": "gpu"}))
    assert action == "patched"
    live = await asyncio.to_thread(cluster.get, "Deployment", "default", "m")
    assert live["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
