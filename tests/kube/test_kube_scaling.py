"""Scaling on the real control plane, with real `pagoda serve` processes behind kwok's pods
(pod_servers.py):

- the operator's autoscaler: load on the pods' IPs queues requests, the autoscaler (scraping those
  IPs) raises the ModelServer's /scale, the reconcile scales the Deployment, the ReplicaSet makes
  pods, the scheduler places them; once the load stops, replicas step down after the delay;
- scale from zero (the fleet issue): `pagoda router --kubernetes`, as the chart's router
  ServiceAccount, holds a request for a ModelServer at zero, raises its /scale, and releases the
  request when the EndpointSlice controller publishes the new pod as ready.

Waits are bounded polls; nothing here asserts how long anything took.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading

import httpx
import pytest
from kube_cluster import ROOT, service_account_kubeconfig, wait_for
from pod_servers import (
    NODE_LABEL,
    host_cidr,
    make_node,
    pod_addresses,
    ready_pod_ips,
    requests_served,
    servers_for_pods,
)
from serve_process import free_port

from pagoda.operator.autoscaler.manifests import build_scaled_object
from pagoda.operator.spec import ModelServer

MODEL = "tiny"
SERVERS = "app.kubernetes.io/component=server,pagoda.dev/modelserver={}"
DELAY = 4  # scaleDownDelaySeconds
PUBLIC_URL = "http://pagoda-router.pagoda-system.svc:8080"  # what the chart passes


def modelserver(name: str, ns: str, node: str | None = None, **spec) -> dict:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"uri": f"hf://org/{name}", "name": MODEL},
            "resources": {"gpus": 0},
            "cache": {"enabled": False},
            "engine": {"maxNumSeqs": 1},
            **({"nodeSelector": {NODE_LABEL: node}} if node else {}),
            **spec,
        },
    }


class ReplicasWatch:
    """Every spec.replicas the API server stored for one ModelServer, in order, from a watch."""

    def __init__(self, kube, name: str, ns: str):
        self.values: list[int] = []
        self._process = subprocess.Popen(
            [str(kube.bin / "kubectl"), "--kubeconfig", str(kube.kubeconfig), "get", "modelserver", name, "-n", ns,
             "--watch", "--output-watch-events", "-o", "jsonpath={.object.spec.replicas}{\"\\n\"}"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._process.stdout:
            if line.strip():
                value = int(line)
                if not self.values or self.values[-1] != value:
                    self.values.append(value)

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(10)


class Load:
    """Closed-loop clients, one request in flight each, spread round-robin over the Ready pods' IPs
    (as a Service would), in threads; every answer must be a 200."""

    def __init__(self, kube, ns: str, selector: str, workers: int):
        self.kube, self.ns, self.selector = kube, ns, selector
        self.targets: list[str] = []
        self.completed, self.failures = 0, []
        self._stop = threading.Event()
        self._turn = itertools.count()
        self._threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(workers)]
        self._threads.append(threading.Thread(target=self._follow_pods, daemon=True))

    def _follow_pods(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(Exception):
                self.targets = ready_pod_ips(self.kube, self.ns, self.selector)

    def _worker(self) -> None:
        body = {"model": MODEL, "prompt": "the queue grows", "max_tokens": 48, "ignore_eos": True}
        with httpx.Client(timeout=60, trust_env=False) as client:
            while not self._stop.is_set():
                targets = self.targets
                if not targets:
                    self._stop.wait(0.1)
                    continue
                ip = targets[next(self._turn) % len(targets)]
                try:
                    response = client.post(f"http://{ip}:8000/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    self.failures.append(f"{ip}: {exc!r}")
                    continue
                if response.status_code == 200:
                    self.completed += 1
                else:
                    self.failures.append(f"{ip}: {response.status_code} {response.text[:200]}")

    def __enter__(self) -> Load:
        self.targets = ready_pod_ips(self.kube, self.ns, self.selector)
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)


def condition(ms: dict, type_: str) -> dict:
    return next((c for c in (ms.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def test_the_autoscaler_follows_the_queue_on_real_pods(kube, operator, tiny_model, tmp_path):
    ns = kube.namespace("scale")
    cidr = "127.11.2.0/24"
    node = make_node(kube, "serve-scale", cidr)
    addresses = pod_addresses(cidr, 3)
    scaling = {"mode": "operator", "minReplicas": 1, "maxReplicas": 3, "targetWaitingRequests": 1,
               "scrapeIntervalSeconds": 1, "scaleUpStabilizationSeconds": 1, "scaleDownDelaySeconds": DELAY}
    selector = SERVERS.format("scaled")
    with servers_for_pods(tiny_model, MODEL, addresses, tmp_path) as servers:
        kube.apply(modelserver("scaled", ns, node, replicas=1, scaling=scaling))
        history = ReplicasWatch(kube, "scaled", ns)
        try:
            ms = wait_for(lambda: (m := kube.get("modelserver", "scaled", ns))["status"].get("phase") == "Ready" and m,
                          "Ready at one replica")  # fmt: skip
            assert ready_pod_ips(kube, ns, selector) == addresses[:1], "kwok gave the pod the first address"
            # Idle: measured from the real server's /metrics, within target.
            wait_for(lambda: condition(kube.get("modelserver", "scaled", ns), "ScalingActive").get("reason")
                     == "WithinTarget", "the autoscaler to measure the idle pod")  # fmt: skip
            assert ms["spec"]["replicas"] == 1

            with Load(kube, ns, selector, workers=6) as load:
                # Six clients on one pod that runs one request at a time: about five waiting, target one.
                wait_for(lambda: kube.get("deployment", "scaled", ns)["status"].get("readyReplicas") == 3,
                         "three ready replicas under load", timeout=180)  # fmt: skip
                assert sorted(ready_pod_ips(kube, ns, selector)) == addresses, "every pod on a real server"
                assert kube.get("modelserver", "scaled", ns)["spec"]["replicas"] == 3
                wait_for(lambda: kube.get("modelserver", "scaled", ns)["status"].get("desiredReplicas") == 3,
                         "desiredReplicas 3 in the status")  # fmt: skip
                wait_for(lambda: len(load.targets) == 3 and all(
                    requests_served(s) > 0 for s in servers.values()),
                    "every replica to serve some of the load")  # fmt: skip
            assert load.failures == [] and load.completed > 0
            rise = history.values[: history.values.index(3) + 1]
            assert rise == sorted(set(rise)) and rise[0] == 1, f"only up while loaded: {history.values}"
            wait_for(lambda: [e for e in kube.events(ns, "scaled") if e["reason"] == "ScaledUp"], "a ScaledUp event")

            # The load stopped: down one step per delay, to minReplicas, and the Deployment follows.
            wait_for(lambda: kube.get("deployment", "scaled", ns)["status"].get("replicas") == 1,
                     "the Deployment back at one replica", timeout=180)  # fmt: skip
            assert history.values == [*rise, 2, 1], "down one step per delay"
            wait_for(lambda: (st := kube.get("modelserver", "scaled", ns)["status"]).get("desiredReplicas") == 1
                     and st.get("waitingRequests") == 0, "desiredReplicas 1 and no waiting requests in the status")  # fmt: skip
            wait_for(lambda: len([e for e in kube.events(ns, "scaled") if e["reason"] == "ScaledDown"]) == 2,
                     "two ScaledDown events")  # fmt: skip
        finally:
            history.stop()
            kube.kubectl("delete", "modelserver", "scaled", "-n", ns, "--wait=true", "--timeout=120s")


@contextlib.contextmanager
def router_process(kube, ns: str, log):
    """`pagoda router --kubernetes`, authenticated as the chart's router ServiceAccount."""
    port = free_port()
    kubeconfig = service_account_kubeconfig(kube, name="pagoda-router")
    cmd = [sys.executable, "-m", "pagoda.runtime.cli", "router", "--kubernetes", "--namespace", ns,
           "--host", "127.0.0.1", "--port", str(port), "--hold-timeout", "300", "--log-level", "info",
           "--public-url", PUBLIC_URL]
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    with open(log, "wb") as handle:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**env, "KUBECONFIG": str(kubeconfig)})  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            def healthy():
                assert proc.poll() is None, f"the router exited:\n{log.read_text()[-3000:]}"
                with contextlib.suppress(httpx.HTTPError):
                    return httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200

            wait_for(healthy, "the router to answer")
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_scale_from_zero_through_the_router(kube, operator, tiny_model, tmp_path):
    ns = kube.namespace("zero")
    cidr = host_cidr()
    if cidr is None:
        pytest.skip("this machine has no non-loopback IPv4 address for the pod behind the EndpointSlice")
    node = make_node(kube, "serve-host", cidr)
    spec = {"replicas": 0, "scaling": {"minReplicas": 0, "maxReplicas": 2}, "routing": {"aliases": ["sleepy"]}}
    selector = SERVERS.format("late")
    with servers_for_pods(tiny_model, MODEL, pod_addresses(cidr, 1), tmp_path) as servers:
        kube.apply(modelserver("late", ns, node, **spec))
        wait_for(lambda: kube.get("deployment", "late", ns), "the Deployment, at zero")
        assert kube.get("deployment", "late", ns)["spec"]["replicas"] == 0
        with router_process(kube, ns, tmp_path / "router.log") as router, \
                httpx.Client(base_url=router, timeout=300, trust_env=False) as http:  # fmt: skip
            wait_for(lambda: "sleepy" in {m["id"] for m in http.get("/v1/models").json()["data"]},
                     "the router to list the ModelServer's alias")  # fmt: skip
            result: dict = {}
            request = {"model": "sleepy", "prompt": "import os\n", "max_tokens": 5, "temperature": 0}
            held = threading.Thread(target=lambda: result.update(reply=http.post("/v1/completions", json=request)))
            held.start()
            try:
                # The router raises /scale to the minimum active replicas, as its own ServiceAccount.
                wait_for(lambda: kube.get("modelserver", "late", ns)["spec"]["replicas"] == 1,
                         "spec.replicas raised to 1 by the router")  # fmt: skip
                # The operator scales the Deployment, kwok's pod comes up on the server's address, the
                # EndpointSlice controller publishes it, and the held request goes to it.
                held.join(240)
                assert not held.is_alive(), "the held request was never released"
            finally:
                held.join(300)
            reply = result["reply"]
            pods = ready_pod_ips(kube, ns, selector)
            assert reply.status_code == 200, f"{reply.text}; the pod's IP {pods}, the server's {list(servers)}"
            body = reply.json()
            assert body["model"] == MODEL and body["usage"]["completion_tokens"] == 5
            assert pods == list(servers)
            (server,) = servers.values()
            assert requests_served(server) == 1, "the request reached the pod's server"
            ms = wait_for(lambda: (m := kube.get("modelserver", "late", ns))["status"].get("router") and m,
                          "the router's endpoint in the status")  # fmt: skip
            assert ms["status"]["router"] == {"endpoint": f"{PUBLIC_URL}/v1", "model": MODEL, "aliases": ["sleepy"],
                                              "strategy": "LeastLoad"}
        kube.kubectl("delete", "modelserver", "late", "-n", ns, "--wait=true", "--timeout=120s")


KEDA_CRD = ROOT / "e2e" / "kube" / "crds" / "keda.sh_scaledobjects.yaml"


def test_hpa_and_keda_objects_on_the_real_api_server(kube, operator):
    """mode hpa: the real HPA controller resolves the ModelServer's /scale (selector included) and
    only lacks the pods metric (no metrics adapter runs here). mode keda: KEDA's own CRD takes the
    ScaledObject whole, the router's trigger included at minReplicas 0."""
    ns = kube.namespace("autoscalers")
    scaling = {"minReplicas": 1, "maxReplicas": 4, "targetWaitingRequests": 2.5, "scaleDownDelaySeconds": 60}
    kube.apply(modelserver("by-hpa", ns, scaling={"mode": "hpa", **scaling}))
    hpa = wait_for(lambda: kube.get("hpa", "by-hpa", ns), "the HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer",
                                             "name": "by-hpa"}  # fmt: skip
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "2500m"

    def hpa_conditions():
        live = kube.get("hpa", "by-hpa", ns)
        found = {c["type"]: c for c in (live.get("status") or {}).get("conditions") or []}
        return found if {"AbleToScale", "ScalingActive"} <= set(found) else None

    conditions = wait_for(hpa_conditions, "the HPA controller's conditions")
    assert conditions["AbleToScale"]["status"] == "True", conditions["AbleToScale"]
    assert conditions["ScalingActive"]["reason"] == "FailedGetPodsMetric", conditions["ScalingActive"]

    kube.kubectl("apply", "-f", str(KEDA_CRD))
    kube.kubectl("wait", "--for=condition=Established", "crd/scaledobjects.keda.sh", "--timeout=60s")
    kube.collect_garbage_of_new_kinds()  # so that the ScaledObject goes with its ModelServer below
    keda = {**scaling, "mode": "keda", "minReplicas": 0}
    kube.apply(modelserver("by-keda", ns, replicas=0, scaling=keda))
    scaled = wait_for(lambda: kube.get("scaledobject", "by-keda", ns), "the ScaledObject")
    ms = kube.get("modelserver", "by-keda", ns)
    built = build_scaled_object(ModelServer.from_body(ms))
    assert scaled["spec"] == built["spec"], "KEDA's schema kept every field the operator wrote"
    assert [t["metadata"]["threshold"] for t in scaled["spec"]["triggers"]] == ["2.5", "2.5"]
    assert scaled["metadata"]["ownerReferences"][0]["uid"] == ms["metadata"]["uid"]
    for name in ("by-hpa", "by-keda"):
        kube.kubectl("delete", "modelserver", name, "-n", ns, "--wait=true", "--timeout=120s")
    wait_for(lambda: not kube.items("hpa,scaledobject,deployment", ns), "the autoscalers to go with them")
