"""`Cluster.ensure` against kmock: creates, leaves an unchanged object alone. What server-side apply
itself does (reverting live edits, removing dropped fields) is tested on the real API server, in
tests/kube/test_kube_apply.py: kmock does not implement it."""

from __future__ import annotations

import asyncio

import kmock

from pagoda.operator.builders.deployment import build_deployment
from pagoda.operator.config import OperatorConfig
from pagoda.operator.k8s import FIELD_MANAGER, Cluster
from pagoda.operator.spec import ModelServer


def deployment(node_selector: dict | None) -> dict:
    body = {
        "metadata": {"name": "m", "namespace": "default", "uid": "u-1", "generation": 1},
        "spec": {"model": {"uri": "hf://org/m"}, "nodeSelector": node_selector},
    }
    return build_deployment(ModelServer.from_body(body), OperatorConfig(runtime_image="img:test"))


async def test_ensure_creates_by_apply_then_patches(apiserver):
    cluster = Cluster.from_environment()
    first = deployment({"pool": "gpu", "zone": "a"})
    _, action = await asyncio.to_thread(cluster.ensure, first)
    assert action == "created"
    _, action = await asyncio.to_thread(cluster.ensure, deployment({"pool": "cpu"}))
    assert action == "patched"
    live = await asyncio.to_thread(cluster.get, "Deployment", "default", "m")
    assert live["spec"]["template"]["spec"]["nodeSelector"]["pool"] == "cpu"
    applies = [r for r in apiserver if isinstance(r, kmock.Request) and "apply-patch" in r.headers.get("Content-Type", "")]
    assert applies and all(r.params.get("fieldManager") == FIELD_MANAGER for r in applies)
    assert all(r.params.get("force") == "true" for r in applies)
