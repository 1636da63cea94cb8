"""routing.inferencePool on the real control plane: skipped with a condition and a Warning while
the cluster lacks the Gateway API Inference Extension's CRD; once the CRD (v1.6.0, vendored in
e2e/kube/crds) is installed, the operator's InferencePool passes the real API server's schema and
CEL rules as the chart's ServiceAccount, and it goes when the spec stops asking for it."""

from __future__ import annotations

import json

from kube_cluster import ROOT, wait_for

from pagoda.operator.builders.inference_pool import build_inference_pool
from pagoda.operator.spec import ModelServer

CRD = ROOT / "e2e" / "kube" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"


def condition(kube, name: str, ns: str, reason: str):
    def check():
        ms = kube.get("modelserver", name, ns)
        st = ms.get("status") or {}
        found = {c["type"]: c for c in st.get("conditions") or []}.get("InferencePoolReady") or {}
        current = st.get("observedGeneration") == ms["metadata"]["generation"]
        return (ms, found) if current and found.get("reason") == reason else None

    return check


def test_inference_pool_waits_for_its_crd_then_passes_the_real_schema(kube, operator):
    ns = kube.namespace("pool")
    routing = {"inferencePool": True, "endpointPickerRef": {"name": "pooled-epp"}}
    kube.apply({"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer", "metadata": {"name": "pooled", "namespace": ns},
                "spec": {"model": {"uri": "hf://org/pooled"}, "routing": routing}})  # fmt: skip

    # No CRD yet: nothing written, and the condition and a Warning say why; serving goes on.
    ms, missing = wait_for(condition(kube, "pooled", ns, "CRDNotInstalled"), "the CRDNotInstalled condition")
    assert missing["status"] == "False" and "inference.networking.k8s.io/v1" in missing["message"]
    wait_for(lambda: any(e["reason"] == "InferencePoolCRDMissing" and e["type"] == "Warning"
                         for e in kube.events(ns, "pooled")), "the Warning event")  # fmt: skip
    wait_for(lambda: kube.get("modelserver", "pooled", ns)["status"].get("phase") == "Ready", "Ready without it")

    kube.kubectl("apply", "-f", str(CRD))
    kube.kubectl("wait", "--for=condition=Established", "crd/inferencepools.inference.networking.k8s.io",
                 "--timeout=120s")  # fmt: skip
    ms, applied = wait_for(condition(kube, "pooled", ns, "Applied"), "the pool applied on a resync")
    assert applied["status"] == "True"
    pool = kube.get("inferencepool", "pooled", ns)
    built = build_inference_pool(ModelServer.from_body(ms))
    # The API server kept every field the operator wrote, and added only the CRD's defaults.
    defaulted = {**built["spec"], "appProtocol": "http",
                 "endpointPickerRef": {**built["spec"]["endpointPickerRef"], "group": "", "kind": "Service"}}  # fmt: skip
    assert pool["spec"] == defaulted
    assert pool["metadata"]["ownerReferences"][0]["uid"] == ms["metadata"]["uid"]
    # The pool's selector picks exactly the serving pods, as the endpoint picker will.
    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    pods = kube.items("pods", ns, selector)
    assert pods and all(p["metadata"]["labels"]["app.kubernetes.io/component"] == "server" for p in pods)
    assert {c["containerPort"] for p in pods for c in p["spec"]["containers"][0]["ports"]} == {8000}

    # The picker's port is bounded in the ModelServer's schema as in the pool's: a bad one is refused
    # at the ModelServer, naming the field, and never reaches the pool.
    bad = kube.kubectl("patch", "modelserver", "pooled", "-n", ns, "--type=merge", "-p",
                       json.dumps({"spec": {"routing": {"endpointPickerRef": {"name": "x", "port": 0}}}}), check=False)  # fmt: skip
    assert bad.returncode != 0 and "spec.routing.endpointPickerRef.port" in bad.stderr

    kube.kubectl("patch", "modelserver", "pooled", "-n", ns, "--type=merge", "-p",
                 json.dumps({"spec": {"routing": {"inferencePool": False}}}))  # fmt: skip
    wait_for(condition(kube, "pooled", ns, "Disabled"), "the Disabled condition")
    wait_for(lambda: kube.get("inferencepool", "pooled", ns) is None, "the pool to go")
    kube.kubectl("delete", "modelserver", "pooled", "-n", ns, "--wait=true", "--timeout=300s")
