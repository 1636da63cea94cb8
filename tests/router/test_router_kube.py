"""Kubernetes discovery: parsing real-shaped ModelServers and EndpointSlices, and the watch itself
against kmock (the project's in-process API server emulator)."""

from __future__ import annotations

import asyncio
import copy

import kmock
import kubernetes
import kubernetes_validate
import pytest

from pagoda.router.fleet import Fleet
from pagoda.router.kube import KubernetesDiscovery, endpoints_from_slices, group_from_modelserver

K8S_VERSION = "1.37"

MODELSERVER = {
    "apiVersion": "pagoda.dev/v1alpha1",
    "kind": "ModelServer",
    "metadata": {"name": "demo", "namespace": "team-a", "uid": "0d8e6f8e-1", "generation": 2,
                 "resourceVersion": "4411"},
    "spec": {
        "model": {"uri": "hf://acme/coder-1b"},
        "resources": {"gpus": 0},
        "replicas": 0,
        "scaling": {"minReplicas": 0, "maxReplicas": 3},
        "routing": {"aliases": ["coder", "team-a/coder"],
                    "loadBalancing": {"strategy": "PrefixHash", "prefixCharLength": 256}},
    },
    "status": {"phase": "Ready", "replicas": 0},
}


def endpoint(ip: str, pod: str, ready: bool | None = True, terminating: bool = False) -> dict:
    conditions = {"serving": ready is not False, "terminating": terminating}
    if ready is not None:
        conditions["ready"] = ready
    return {"addresses": [ip], "conditions": conditions, "nodeName": "node-1", "zone": "zone-a",
            "targetRef": {"kind": "Pod", "namespace": "team-a", "name": pod, "uid": f"uid-{pod}"}}


def endpoint_slice(name: str, endpoints: list[dict], service: str = "demo", address_type: str = "IPv4") -> dict:
    """An EndpointSlice as the EndpointSlice controller writes it for the operator's Service."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "team-a", "generateName": f"{service}-",
                     "labels": {"kubernetes.io/service-name": service,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                                "app.kubernetes.io/managed-by": "pagoda-operator"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": "svc-uid",
                                          "controller": True, "blockOwnerDeletion": True}]},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }


def test_the_sample_objects_are_valid_kubernetes_objects():
    kubernetes_validate.validate(endpoint_slice("demo-abc12", [endpoint("10.1.0.5", "demo-0")]), K8S_VERSION,
                                 strict=True)


def test_a_modelserver_becomes_a_group():
    spec = group_from_modelserver(MODELSERVER)
    assert spec.key == "team-a/demo"
    assert spec.served_name == "acme/coder-1b"  # model.name unset: org/name, as the Deployment serves it
    assert spec.names == ("acme/coder-1b", "coder", "team-a/coder")
    assert (spec.strategy, spec.prefix_char_length) == ("PrefixHash", 256)
    assert (spec.replicas, spec.scale_from_zero_replicas) == (0, 1)


def test_the_defaults_are_the_crds():
    obj = copy.deepcopy(MODELSERVER)
    obj["spec"] = {"model": {"uri": "hf://acme/coder-1b", "name": "coder"}, "scaling": {"minReplicas": 2,
                                                                                        "maxReplicas": 4}}
    spec = group_from_modelserver(obj)
    assert spec.names == ("coder",)
    assert (spec.strategy, spec.prefix_char_length, spec.scale_from_zero_replicas) == ("LeastLoad", 100, 2)


def test_a_modelserver_the_spec_rejects_is_an_error():
    obj = copy.deepcopy(MODELSERVER)
    obj["spec"]["routing"]["loadBalancing"]["strategy"] = "Random"
    with pytest.raises(ValueError, match="strategy"):
        group_from_modelserver(obj)


def test_only_ready_endpoints_that_are_not_terminating_are_routed():
    slices = [
        endpoint_slice("demo-abc12", [endpoint("10.1.0.5", "demo-0"), endpoint("10.1.0.6", "demo-1", ready=False),
                                      endpoint("10.1.0.7", "demo-2", ready=None)]),
        endpoint_slice("demo-def34", [endpoint("10.1.0.8", "demo-3", terminating=True)]),
        endpoint_slice("demo-v6", [endpoint("fd00::9", "demo-4")], address_type="IPv6"),
    ]
    got = endpoints_from_slices(slices)
    assert [(e.url, e.name) for e in got] == [("http://10.1.0.5:8000", "demo-0"), ("http://10.1.0.7:8000", "demo-2"),
                                              ("http://[fd00::9]:8000", "demo-4")]


# ---- the watch, against kmock ---------------------------------------------------------------------

RESOURCES = {
    "pagoda.dev/v1alpha1/modelservers": kmock.ResourceInfo(
        kind="ModelServer", namespaced=True, subresources={"status", "scale"},
        verbs={"get", "list", "watch", "create", "patch", "delete"}),
    "discovery.k8s.io/v1/endpointslices": kmock.ResourceInfo(
        kind="EndpointSlice", namespaced=True, verbs={"get", "list", "watch", "create", "patch", "delete"}),
}


@pytest.fixture()
async def api():
    async with kmock.KubernetesEmulator() as server, kmock.Server(server):
        for key, info in RESOURCES.items():
            server.resources[key] = info
        config = kubernetes.client.Configuration(host=str(server.url).rstrip("/"))
        with kubernetes.client.ApiClient(config) as client:
            yield server, client


async def until(predicate, what: str, timeout: float = 20.0):
    """Poll on the event loop (the emulator serves on it too, so a predicate that calls the API is
    async); a bound against hangs."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not ((await predicate()) if asyncio.iscoroutinefunction(predicate) else predicate()):
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("namespaces", [None, ["team-a", "team-b"]])
async def test_the_watch_follows_modelservers_and_their_endpoints(api, namespaces):
    server, client = api
    custom = kubernetes.client.CustomObjectsApi(client)
    slices_api = kubernetes.client.DiscoveryV1Api(client)
    body = {k: v for k, v in copy.deepcopy(MODELSERVER).items() if k != "status"}
    await asyncio.to_thread(custom.create_namespaced_custom_object, "pagoda.dev", "v1alpha1", "team-a",
                            "modelservers", body)

    fleet = Fleet()
    discovery = KubernetesDiscovery(namespaces, api_client=client, public_url="http://pagoda-router.pagoda-system.svc:8080")
    task = asyncio.create_task(discovery.run(fleet))
    try:
        await asyncio.wait_for(discovery.wait_synced(), 20)
        group = fleet.lookup("coder")
        assert group is not None and group.spec.key == "team-a/demo" and group.endpoints == ()

        # The router writes where to reach this ModelServer into its status.
        async def router_status():
            obj = await asyncio.to_thread(custom.get_namespaced_custom_object, "pagoda.dev", "v1alpha1", "team-a",
                                          "modelservers", "demo")
            return (obj.get("status") or {}).get("router")

        async def written():
            return await router_status() is not None

        await until(written, "status.router written")
        assert await router_status() == {"endpoint": "http://pagoda-router.pagoda-system.svc:8080/v1",
                                   "model": "acme/coder-1b", "aliases": ["coder", "team-a/coder"],
                                   "strategy": "PrefixHash"}

        # At zero, a held request asks the ModelServer's /scale for its minimum active replicas.
        await discovery.scale_from_zero(group.spec)
        obj = await asyncio.to_thread(custom.get_namespaced_custom_object, "pagoda.dev", "v1alpha1", "team-a",
                                      "modelservers", "demo")
        assert obj["spec"]["replicas"] == 1
        await until(lambda: fleet.lookup("coder").spec.replicas == 1, "the scale seen through the watch")

        slc = endpoint_slice("demo-abc12", [endpoint("10.1.0.5", "demo-0"), endpoint("10.1.0.6", "demo-1", False)])
        await asyncio.to_thread(slices_api.create_namespaced_endpoint_slice, "team-a", slc)
        await until(lambda: len(group.endpoints) == 1, "the ready endpoint routed")
        assert group.endpoints[0].url == "http://10.1.0.5:8000" and group.ready.is_set()

        patch = {"endpoints": [endpoint("10.1.0.5", "demo-0"), endpoint("10.1.0.6", "demo-1")]}
        await asyncio.to_thread(slices_api.patch_namespaced_endpoint_slice, "demo-abc12", "team-a", patch)
        await until(lambda: len(group.endpoints) == 2, "the second endpoint ready")

        await asyncio.to_thread(slices_api.delete_namespaced_endpoint_slice, "demo-abc12", "team-a")
        await until(lambda: group.endpoints == (), "the endpoints gone with their slice")
        assert not group.ready.is_set()

        await asyncio.to_thread(custom.delete_namespaced_custom_object, "pagoda.dev", "v1alpha1", "team-a",
                                "modelservers", "demo")
        await until(lambda: fleet.lookup("coder") is None, "the group gone with its ModelServer")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
