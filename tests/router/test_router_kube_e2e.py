"""Scale from zero through the whole Kubernetes path, on loopback: a `pagoda router --kubernetes`
process watching kmock (the API server emulator), a ModelServer at zero replicas, a held request,
the router's /scale write, a real `pagoda serve` replica coming up, its EndpointSlice, and the
request released to it.

kmock serves on the test's event loop, so every wait here is async: nothing may block the loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys

import httpx
import kmock
import kubernetes
import pytest
import yaml
from router_support import REPLICA_FLAGS, ROOT, metric
from serve_process import free_port
from test_router_kube import RESOURCES, endpoint, endpoint_slice, until

NS = "team-a"


@pytest.fixture()
async def api(tmp_path):
    async with kmock.KubernetesEmulator() as server, kmock.Server(server):
        for key, info in RESOURCES.items():
            server.resources[key] = info
        url = str(server.url).rstrip("/")
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": url}}],
            "users": [{"name": "test", "user": {"token": "test"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}]}))
        with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url)) as client:
            yield client, kubeconfig


@contextlib.contextmanager
def process(cmd: list[str], log_path, **env):
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **env})
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def healthy(url: str, proc: subprocess.Popen, log_path, timeout: float = 180) -> None:
    async with httpx.AsyncClient(timeout=2, trust_env=False) as client:
        async def up():
            if proc.poll() is not None:
                pytest.fail(f"{url} exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                return (await client.get(f"{url}/health")).status_code == 200
            return False

        await until(up, f"{url} healthy", timeout)


async def test_a_modelserver_at_zero_wakes_for_a_held_request(api, demo_model, tmp_path):
    client, kubeconfig = api
    custom = kubernetes.client.CustomObjectsApi(client)
    modelserver = {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer",
                   "metadata": {"name": "late", "namespace": NS},
                   "spec": {"model": {"uri": "hf://acme/late", "name": "late"}, "resources": {"gpus": 0},
                            "replicas": 0, "scaling": {"minReplicas": 0, "maxReplicas": 2},
                            "routing": {"aliases": ["sleepy"]}}}
    await asyncio.to_thread(custom.create_namespaced_custom_object, "pagoda.dev", "v1alpha1", NS, "modelservers",
                            modelserver)

    def get():
        return custom.get_namespaced_custom_object("pagoda.dev", "v1alpha1", NS, "modelservers", "late")

    port = free_port()
    router_url = f"http://127.0.0.1:{port}"
    router_cmd = [sys.executable, "-m", "pagoda.runtime.cli", "router", "--kubernetes", "--namespace", NS,
                  "--host", "127.0.0.1", "--port", str(port), "--hold-timeout", "300", "--log-level", "warning",
                  "--public-url", "http://pagoda-router.pagoda-system.svc:8080"]
    with process(router_cmd, tmp_path / "router.log", KUBECONFIG=str(kubeconfig)) as router:
        await healthy(router_url, router, tmp_path / "router.log", timeout=60)
        async with httpx.AsyncClient(base_url=router_url, timeout=300, trust_env=False) as http:
            held = asyncio.create_task(http.post("/v1/completions", json={
                "model": "sleepy", "prompt": "import os\n", "max_tokens": 5, "temperature": 0}))

            async def scaled():
                return (await asyncio.to_thread(get))["spec"]["replicas"] == 1

            # The router raised the ModelServer's /scale to its minimum active replicas (1 at min 0).
            await until(scaled, "spec.replicas raised to 1 by the router", timeout=60)
            assert not held.done()
            assert (await asyncio.to_thread(get))["status"]["router"]["model"] == "late"
            queue = await asyncio.to_thread(metric, router_url, "pagoda_router_queue_depth", model_server=f"{NS}/late")
            assert queue == 1

            # The "Deployment" comes up: a real replica, then the EndpointSlice its Service gets.
            replica_port = free_port()
            serve_cmd = [sys.executable, "-m", "pagoda.runtime.cli", "serve", str(demo_model), "--served-model-name",
                         "late", "--host", "127.0.0.1", "--port", str(replica_port), *REPLICA_FLAGS]
            with process(serve_cmd, tmp_path / "replica.log") as replica:
                await healthy(f"http://127.0.0.1:{replica_port}", replica, tmp_path / "replica.log")
                assert not held.done()
                slc = endpoint_slice("late-x7k2p", [endpoint("127.0.0.1", "late-0")], service="late")
                slc["metadata"]["namespace"] = NS
                slc["ports"][0]["port"] = replica_port
                await asyncio.to_thread(kubernetes.client.DiscoveryV1Api(client).create_namespaced_endpoint_slice,
                                        NS, slc)
                reply = await asyncio.wait_for(held, 120)
                assert reply.status_code == 200, reply.text
                body = reply.json()
                assert body["model"] == "late" and body["usage"]["completion_tokens"] == 5
            queue = await asyncio.to_thread(metric, router_url, "pagoda_router_queue_depth", model_server=f"{NS}/late")
            assert queue == 0
