"""The control plane answers, its kwok GPU nodes are Ready, the chart installs, and an example
ModelServer gets its children from the operator running as the chart's ServiceAccount."""

from __future__ import annotations

import yaml
from kube_cluster import EXAMPLES, wait_for


def test_api_server_answers_and_gpu_nodes_are_ready(kube):
    assert kube.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    nodes = {n["metadata"]["name"]: n for n in kube.kubectl_json("get", "nodes")["items"]}
    assert {"gpu-h100-0", "gpu-h100-1", "gpu-l4-0", "cpu-0"} <= set(nodes)
    for node in nodes.values():
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["metadata"]["name"]
    h100 = nodes["gpu-h100-0"]
    assert h100["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert h100["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in h100["spec"]["taints"]


def test_restricted_namespace_refuses_an_unrestricted_pod(kube):
    ns = kube.namespace("psa")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root", "namespace": ns},
        # No securityContext at all: may run as root, keeps its capabilities and privilege escalation.
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    result = kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod), check=False)
    assert result.returncode != 0 and 'violates PodSecurity "restricted' in result.stderr


def test_claims_bind_to_the_premade_volumes(kube):
    ns = kube.namespace("pvc")
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "c", "namespace": ns},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
    }
    kube.apply(claim)
    bound = wait_for(lambda: kube.get("pvc", "c", ns)["status"].get("phase") == "Bound", "the claim to bind")
    assert bound


def test_chart_installs_the_crd_and_the_operator_rbac(kube, chart):
    assert chart["status"] == "deployed"
    crd = kube.kubectl_json("get", "crd", "modelservers.pagoda.dev")
    assert crd["spec"]["names"]["kind"] == "ModelServer"
    can = kube.kubectl(
        "auth", "can-i", "create", "deployments", "-n", "default",
        "--as", "system:serviceaccount:pagoda-system:pagoda",
    )
    assert can.stdout.strip() == "yes"


def test_minimal_example_gets_its_children_and_becomes_ready(kube, operator):
    ns = kube.namespace("smoke")
    kube.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "modelserver-minimal.yaml"))
    name = "qwen-small"

    def ready():
        ms = kube.get("modelserver", name, ns)
        return ms if (ms.get("status") or {}).get("phase") == "Ready" else None

    try:
        ms = wait_for(ready, "the ModelServer to be Ready")
    except AssertionError:
        print(operator.tail())
        raise
    claim = kube.get("pvc", f"{name}-cache", ns)
    assert claim["status"]["phase"] == "Bound"
    jobs = kube.items("jobs", ns, f"pagoda.dev/modelserver={name}")
    assert len(jobs) == 1 and any(c["type"] == "Complete" for c in jobs[0]["status"]["conditions"])
    deployment = kube.get("deployment", name, ns)
    assert deployment["status"]["readyReplicas"] == 1
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == ms["metadata"]["uid"]
    service = kube.get("service", name, ns)
    assert service["spec"]["ports"][0]["name"] == "http"
    conditions = {c["type"]: c["status"] for c in ms["status"]["conditions"]}
    assert conditions["Available"] == "True" and conditions["CacheReady"] == "True"
    pods = kube.items("pods", ns, f"pagoda.dev/modelserver={name},app.kubernetes.io/component=server")
    assert pods and pods[0]["spec"]["nodeName"].startswith("gpu-")
