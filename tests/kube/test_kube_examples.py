"""Each example goes through `kubectl apply` into a restricted namespace; the operator (as the
chart's ServiceAccount) makes its children; `kubectl get`, `kubectl scale` and `kubectl delete`
behave; garbage collection and the finalizer clean up."""

from __future__ import annotations

import yaml
from kube_cluster import EXAMPLES, wait_for


def apply_example(kube, path, namespace: str, **spec) -> dict:
    """The example as written, but in the test's namespace (and with `spec` merged in)."""
    obj = yaml.safe_load(path.read_text())
    obj["metadata"]["namespace"] = namespace
    obj["spec"].update(spec)
    kube.apply(obj)
    return obj


def phase_is(kube, name: str, ns: str, phase: str):
    """The phase, from a pass that saw the latest spec, with the Deployment's rollout settled."""

    def check():
        ms = kube.get("modelserver", name, ns)
        st = ms.get("status") or {}
        current = st.get("observedGeneration") == ms["metadata"]["generation"]
        conditions = {c["type"]: c["status"] for c in st.get("conditions") or []}
        settled = phase != "Ready" or conditions.get("Available") == "True"
        return ms if current and settled and st.get("phase") == phase else None

    return check


def pods(kube, ns: str, name: str, component: str, count: int):
    """Exactly `count` running, not terminating pods of this component (a rollout may overlap)."""

    def check():
        found = [p for p in kube.items("pods", ns, f"pagoda.dev/modelserver={name},app.kubernetes.io/component={component}")
                 if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
        return found if len(found) == count else None

    return check


def reasons(kube, ns: str, name: str) -> set[str]:
    return {e["reason"] for e in kube.events(ns, name)}


def test_full_example_children_columns_scale_and_delete(kube, operator):
    ns = kube.namespace("full")
    # What the example refers to and a real cluster would have.
    kube.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "inference-high"}, "value": 1000})  # fmt: skip
    kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pagoda-extra-env"}}, ns)
    obj = apply_example(kube, EXAMPLES / "modelserver-full.yaml", ns)
    name = obj["metadata"]["name"]
    try:
        ms = wait_for(phase_is(kube, name, ns, "Ready"), "the full example to be Ready")
    except AssertionError:
        print(operator.tail())
        raise

    # The cache claim, as asked: ReadWriteMany on standard-rwx, bound.
    claim = kube.get("pvc", f"{name}-cache", ns)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "standard-rwx"
    assert claim["status"]["phase"] == "Bound" and "ownerReferences" not in claim["metadata"]  # retained
    # The loader ran where the servers run: an H100 node of the gpu pool, under the nvidia runtime.
    (loader,) = wait_for(pods(kube, ns, name, "loader", 1), "one loader pod")
    assert loader["spec"]["nodeName"].startswith("gpu-h100-") and loader["spec"]["runtimeClassName"] == "nvidia"
    servers = wait_for(pods(kube, ns, name, "server", 2), "two server pods")
    assert all(p["spec"]["nodeName"].startswith("gpu-h100-") for p in servers)
    assert all(p["spec"]["priorityClassName"] == "inference-high" for p in servers)
    # The key comes from the Secret through env only, never argv.
    container = servers[0]["spec"]["containers"][0]
    assert not any("api-key" in a for a in container["args"])
    assert any(e["name"] == "PAGODA_API_KEY" for e in container["env"])
    pdb = kube.get("pdb", name, ns)
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["metadata"]["ownerReferences"][0]["uid"] == ms["metadata"]["uid"]
    conditions = {c["type"]: c for c in ms["status"]["conditions"]}
    assert conditions["CacheReady"]["status"] == "True" and conditions["Available"]["status"] == "True"
    assert conditions["Progressing"]["reason"] == "Complete"
    assert ms["status"]["endpoint"] == f"http://{name}.{ns}.svc:8000/v1"
    # LoaderStarted included: a pass whose status write meets a conflict still posts what it did.
    wait_for(lambda: {"CacheClaimCreated", "LoaderStarted", "CacheReady", "DeploymentCreated", "PhaseReady"}
             <= reasons(kube, ns, name), "the operator's events")  # fmt: skip

    # The printer columns, as kubectl shows them.
    table = kube.kubectl("get", "modelservers", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "MODEL", "READY", "DESIRED", "WAITING", "PHASE", "AGE"]
    row = table[1].split()
    assert row[:4] == [name, obj["spec"]["model"]["uri"], "2", "2"] and row[-2] == "Ready"

    # kubectl scale goes through the scale subresource; the Deployment follows.
    kube.kubectl("scale", "modelserver", name, "-n", ns, "--replicas=3")
    wait_for(lambda: (kube.get("deployment", name, ns)["status"].get("readyReplicas") or 0) == 3,
             "three ready replicas")  # fmt: skip
    wait_for(lambda: phase_is(kube, name, ns, "Ready")()["status"].get("readyReplicas") == 3, "status to follow")

    # Delete: the finalizer runs (the cache is retained), the garbage collector takes the rest.
    kube.kubectl("delete", "modelserver", name, "-n", ns, "--wait=true", "--timeout=300s")
    for kind in ("deployment", "service", "pdb", "job"):
        wait_for(lambda kind=kind: not kube.items(kind, ns, f"pagoda.dev/modelserver={name}"),
                 f"the {kind} to be collected")  # fmt: skip
    assert kube.get("pvc", f"{name}-cache", ns) is not None
    wait_for(lambda: "CacheRetained" in reasons(kube, ns, name), "the CacheRetained event")


def test_minimal_example_without_retained_cache_leaves_nothing(kube, operator):
    ns = kube.namespace("minimal")
    obj = apply_example(kube, EXAMPLES / "modelserver-minimal.yaml", ns, cache={"retainOnDelete": False})
    name = obj["metadata"]["name"]
    ms = wait_for(phase_is(kube, name, ns, "Ready"), "the minimal example to be Ready")
    claim = kube.get("pvc", f"{name}-cache", ns)
    (owner,) = claim["metadata"]["ownerReferences"]  # a claim that goes with the ModelServer is owned
    assert owner["uid"] == ms["metadata"]["uid"] and owner["blockOwnerDeletion"] is False
    kube.kubectl("delete", "modelserver", name, "-n", ns, "--wait=true", "--timeout=300s")
    wait_for(lambda: not kube.items("pvc,deployment,service,job,pdb", ns), "every child to go")
