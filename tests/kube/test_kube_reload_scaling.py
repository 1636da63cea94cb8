"""While the cache reloads a new revision, and after that reload failed, the old Deployment keeps
serving, untouched but for its replica count: `kubectl scale` (as an autoscaler's write) still
reaches it, on the real control plane. The new revision's loader pod is left unscheduled (its
nodeSelector comes with the new spec, which the serving Deployment does not take until the load
is done), so the reload runs as long as the test wants, and then fails (loader_kubelet.py)."""

from __future__ import annotations

import json

from kube_cluster import wait_for
from loader_kubelet import fail_loader
from pod_servers import NODE_LABEL

CACHE = {"accessMode": "ReadWriteMany", "storageClassName": "standard-rwx", "retainOnDelete": False}


def test_replicas_follow_the_scale_during_a_reload_and_after_it_failed(kube, operator):
    ns = kube.namespace("reload")
    kube.apply({"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer", "metadata": {"name": "rl", "namespace": ns},
                "spec": {"model": {"uri": "hf://org/rl@v1"}, "cache": CACHE}})  # fmt: skip
    status = lambda: kube.get("modelserver", "rl", ns)["status"]  # noqa: E731
    replicas = lambda: kube.get("deployment", "rl", ns)["spec"]["replicas"]  # noqa: E731
    wait_for(lambda: status().get("phase") == "Ready", "Ready on v1")
    served = kube.get("deployment", "rl", ns)["spec"]["template"]

    kube.kubectl("patch", "modelserver", "rl", "-n", ns, "--type=merge", "-p", json.dumps(
        {"spec": {"model": {"uri": "hf://org/rl@v2"}, "nodeSelector": {NODE_LABEL: "nowhere"}}}))  # fmt: skip
    wait_for(lambda: status().get("phase") == "Loading" and status()["cache"]["uri"] == "hf://org/rl@v1",
             "the reload under way, v1 still loaded")  # fmt: skip
    kube.kubectl("scale", "modelserver", "rl", "-n", ns, "--replicas=2")
    wait_for(lambda: (kube.get("deployment", "rl", ns)["status"].get("readyReplicas") or 0) == 2,
             "two ready replicas of v1 while v2 loads")  # fmt: skip
    assert kube.get("deployment", "rl", ns)["spec"]["template"] == served, "only the replica count moves"

    fail_loader(kube, ns, "rl", lambda pod: (1, "HfHubHTTPError: 503 Service Unavailable"), uri="hf://org/rl@v2")
    wait_for(lambda: "503 Service Unavailable" in ((status().get("loader") or {}).get("lastError") or ""),
             "the failed reload in the status")  # fmt: skip
    kube.kubectl("scale", "modelserver", "rl", "-n", ns, "--replicas=1")
    wait_for(lambda: replicas() == 1, "the Deployment at one replica after the failed reload")
    assert kube.get("deployment", "rl", ns)["spec"]["template"] == served
    assert status()["cache"]["uri"] == "hf://org/rl@v1", "v1 is still what is loaded and served"
    kube.kubectl("delete", "modelserver", "rl", "-n", ns, "--wait=true", "--timeout=120s")
