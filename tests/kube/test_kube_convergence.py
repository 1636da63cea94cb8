"""What a real cluster does to the operator: live edits of its objects, a Deployment the API server
refuses, a ModelServer deleted while a pass is in flight, restarts mid-reconcile, and API errors
from a proxy in front of the API server. Each converges, with no duplicates and no leaks."""

from __future__ import annotations

import contextlib
import json

from fault_proxy import FaultProxy
from kube_cluster import Operator, service_account_kubeconfig, wait_for

from pagoda.operator.config import OperatorConfig
from pagoda.operator.k8s import Cluster
from pagoda.operator.reconcile import reconcile

SELECT = "pagoda.dev/modelserver={}"


def modelserver(name: str, ns: str, **spec) -> dict:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"model": {"uri": f"hf://org/{name}"}, **spec},
    }


def ready(kube, name: str, ns: str):
    def check():
        ms = kube.get("modelserver", name, ns)
        return ms if (ms or {}).get("status", {}).get("phase") == "Ready" else None

    return check


def children(kube, ns: str, name: str) -> dict[str, list[str]]:
    out = {}
    for kind in ("pvc", "job", "deployment", "service", "pdb"):
        out[kind] = sorted(o["metadata"]["name"] for o in kube.items(kind, ns, SELECT.format(name)))
    return out


def expected_children(name: str) -> dict[str, list[str]]:
    return {"pvc": [f"{name}-cache"], "deployment": [name], "service": [name], "pdb": [name]}


def converged(kube, ns: str, name: str) -> bool:
    found = children(kube, ns, name)
    jobs = found.pop("job")
    return found == expected_children(name) and len(jobs) == 1


def test_live_edits_are_reverted_and_dropped_fields_removed(kube, operator):
    ns = kube.namespace("edit")
    kube.apply(modelserver("edited", ns, podLabels={"team": "a", "extra": "b"}))
    wait_for(ready(kube, "edited", ns), "Ready")
    # Someone edits a field the operator owns: the next pass puts it back.
    kube.kubectl("set", "image", "deployment/edited", "-n", ns, "runtime=registry.local/evil:1")
    wait_for(lambda: kube.get("deployment", "edited", ns)["spec"]["template"]["spec"]["containers"][0]["image"]
             == "registry.local/pagoda-runtime:test", "the image to be reverted")  # fmt: skip
    # A field dropped from the spec goes from the Deployment too.
    kube.kubectl("patch", "modelserver", "edited", "-n", ns, "--type=json",
                 "-p", json.dumps([{"op": "remove", "path": "/spec/podLabels/extra"}]))  # fmt: skip
    labels = lambda: kube.get("deployment", "edited", ns)["spec"]["template"]["metadata"]["labels"]  # noqa: E731
    wait_for(lambda: "extra" not in labels(), "the dropped label to go")
    assert labels()["team"] == "a"
    live = kube.kubectl_json("get", "deployment", "edited", "-n", ns, "--show-managed-fields")
    assert ("pagoda-operator", "Apply") in {(m["manager"], m["operation"]) for m in live["metadata"]["managedFields"]}


def test_a_deployment_the_api_server_refuses_fails_the_modelserver_with_a_warning(kube, operator):
    ns = kube.namespace("refused")
    kube.apply(modelserver("refused", ns, podLabels={"not a label!": "x"}))
    ms = wait_for(lambda: (m := kube.get("modelserver", "refused", ns))["status"].get("phase") == "Failed" and m,
                  "phase Failed")  # fmt: skip
    assert "rejected the Deployment" in ms["status"]["message"]
    progressing = next(c for c in ms["status"]["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "Rejected"
    warnings = wait_for(lambda: [e for e in kube.events(ns, "refused") if e["reason"] == "DeploymentRejected"],
                        "the Warning event")  # fmt: skip
    assert warnings[0]["type"] == "Warning" and "not a label!" in warnings[0]["message"]
    # Fixing the spec recovers.
    kube.kubectl("patch", "modelserver", "refused", "-n", ns, "--type=merge", "-p",
                 json.dumps({"spec": {"podLabels": None}}))  # fmt: skip
    wait_for(ready(kube, "refused", ns), "Ready after the fix")


def test_a_pass_in_flight_during_deletion_leaves_no_orphaned_claim(kube, operator):
    """The pass reads the ModelServer, the ModelServer is deleted (its finalizer deletes the claim),
    then the pass creates the claim: owned, so the garbage collector takes it."""
    ns = kube.namespace("orphan")
    kube.apply(modelserver("gone", ns, cache={"retainOnDelete": False}))
    stale = wait_for(ready(kube, "gone", ns), "Ready")
    kube.kubectl("delete", "modelserver", "gone", "-n", ns, "--wait=true", "--timeout=120s")
    wait_for(lambda: not kube.items("pvc", ns), "the claim to go with the ModelServer")
    cluster = Cluster(kube.api(service_account_kubeconfig(kube)))
    late = reconcile(cluster, OperatorConfig(runtime_image="registry.local/pagoda-runtime:test"), stale)
    assert "CacheClaimCreated" in {reason for _, reason, _ in late.events}, "the late pass made the claim"
    wait_for(lambda: not kube.items("pvc,job", ns), "the garbage collector to take what the late pass made")


def test_operator_killed_mid_reconcile_converges_without_duplicates(kube, operator):
    ns = kube.namespace("restart")
    stages = {"claim": "pvc", "loader": "job", "server": "deployment"}
    for stage, kind in stages.items():
        name = f"kill-at-{stage}"
        kube.apply(modelserver(name, ns))
        wait_for(lambda kind=kind, name=name: kube.items(kind, ns, SELECT.format(name)), f"a {kind}", interval=0.05)
        operator.stop(kill=True)  # SIGKILL: no cleanup, mid-pass
        operator.start()
        wait_for(ready(kube, name, ns), f"{name} Ready after the restart")
        wait_for(lambda name=name: converged(kube, ns, name), f"{name}'s children, once each")
    for stage in stages:
        kube.kubectl("delete", "modelserver", f"kill-at-{stage}", "-n", ns, "--wait=true", "--timeout=120s")
    wait_for(lambda: not kube.items("job,deployment,service,pdb", ns), "no leaks")


def test_api_errors_from_a_proxy_converge(kube, operator, tmp_path):
    """Refused calls, conflicts, writes whose answer is lost and calls that hang past the operator's
    API time-out: each ModelServer still ends Ready with its children once each and a status that
    says so, and deletion leaves nothing behind."""
    ns = kube.namespace("faults")
    operator.stop()  # one operator at a time: this one talks through the proxy
    proxy = FaultProxy(upstream=kube.server, ca_file=str(kube.dir / "pki" / "ca.crt")).start()
    flaky = Operator(kubeconfig=service_account_kubeconfig(kube, server=proxy.url), log=tmp_path / "flaky.log",
                     env={"PAGODA_API_TIMEOUT_SECONDS": "2"})  # fmt: skip
    try:
        flaky.start()
        names = [f"flaky-{i}" for i in range(3)]
        for name in names:
            kube.apply(modelserver(name, ns, cache={"retainOnDelete": False}))
        for name in names:
            try:
                ms = wait_for(ready(kube, name, ns), f"{name} Ready through the faults")
                wait_for(lambda name=name: converged(kube, ns, name), f"{name}'s children, once each")
            except AssertionError:
                print(flaky.tail(), proxy.summary())
                raise
            types = [c["type"] for c in ms["status"]["conditions"]]
            assert len(types) == len(set(types)), types
            conditions = {c["type"]: (c["status"], c["reason"]) for c in ms["status"]["conditions"]}
            assert conditions["Available"][0] == "True" and conditions["Progressing"] == ("False", "Complete")
            assert ms["status"]["observedGeneration"] == ms["metadata"]["generation"]
        assert proxy.kinds() == {"refused", "conflict", "lost", "hung"}, proxy.summary()
        for name in names:
            kube.kubectl("delete", "modelserver", name, "-n", ns, "--wait=true", "--timeout=120s")
        wait_for(lambda: not kube.items("pvc,job,deployment,service,pdb", ns), "no leaks")
    finally:
        flaky.stop()
        with contextlib.suppress(Exception):
            proxy.stop()
        operator.start()


def test_a_loaded_cache_claim_grows_with_the_spec_and_never_shrinks(kube, operator):
    ns = kube.namespace("grow")
    kube.apply(modelserver("grown", ns, cache={"size": "10Gi", "retainOnDelete": False}))
    wait_for(ready(kube, "grown", ns), "Ready")
    claim = lambda: kube.get("pvc", "grown-cache", ns)["spec"]["resources"]["requests"]["storage"]  # noqa: E731
    assert claim() == "10Gi"
    # The real API server takes the expansion: the StorageClass allows it and the claim is bound.
    kube.kubectl("patch", "modelserver", "grown", "-n", ns, "--type=merge", "-p",
                 json.dumps({"spec": {"cache": {"size": "20Gi"}}}))  # fmt: skip
    wait_for(lambda: claim() == "20Gi", "the claim to grow to 20Gi")
    wait_for(lambda: "CacheClaimExpanding" in {e["reason"] for e in kube.events(ns, "grown")}, "the event")
    kube.kubectl("patch", "modelserver", "grown", "-n", ns, "--type=merge", "-p",
                 json.dumps({"spec": {"cache": {"size": "5Gi"}}}))  # fmt: skip
    warning = wait_for(lambda: [e for e in kube.events(ns, "grown") if e["reason"] == "CacheClaimNotShrunk"],
                       "the warning that claims only grow")  # fmt: skip
    assert warning[0]["type"] == "Warning" and claim() == "20Gi"
    assert kube.get("modelserver", "grown", ns)["status"]["phase"] == "Ready"
    kube.kubectl("delete", "modelserver", "grown", "-n", ns, "--wait=true", "--timeout=120s")


def test_a_cache_below_the_plans_weights_is_flagged_naming_spec_cache_size(kube, operator):
    ns = kube.namespace("small")
    kube.apply(modelserver("small", ns, cache={"size": "10Gi", "retainOnDelete": False}))
    wait_for(ready(kube, "small", ns), "Ready")
    # kwok's loader pod prints no plan: write the figures its plan container reports for a model
    # of 20 GiB of weights, as the reconcile would have read them back.
    kube.kubectl("patch", "modelserver", "small", "-n", ns, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {"plan": {"weightBytes": 20 * 2**30}}}))  # fmt: skip
    kube.kubectl("patch", "modelserver", "small", "-n", ns, "--type=merge", "-p",
                 json.dumps({"spec": {"cache": {"size": "12Gi"}}}))  # fmt: skip

    def condition():
        ms = kube.get("modelserver", "small", ns)
        found = {c["type"]: c for c in ms["status"]["conditions"]}.get("CacheSizeSufficient")
        return found if ms["status"].get("observedGeneration") == ms["metadata"]["generation"] else None

    flagged = wait_for(condition, "the CacheSizeSufficient condition")
    assert (flagged["status"], flagged["reason"]) == ("False", "CacheTooSmall")
    assert "spec.cache.size 12Gi" in flagged["message"] and "22.0 GiB" in flagged["message"]
    warning = wait_for(lambda: [e for e in kube.events(ns, "small") if e["reason"] == "CacheTooSmall"],
                       "the Warning event")  # fmt: skip
    assert warning[0]["type"] == "Warning" and "spec.cache.size" in warning[0]["message"]
    assert kube.get("modelserver", "small", ns)["status"]["phase"] == "Ready"  # flagged, still serving

    kube.kubectl("patch", "modelserver", "small", "-n", ns, "--type=merge", "-p",
                 json.dumps({"spec": {"cache": {"size": "30Gi"}}}))  # fmt: skip
    wait_for(lambda: (condition() or {}).get("status") == "True", "the condition to clear")
    assert kube.get("pvc", "small-cache", ns)["spec"]["resources"]["requests"]["storage"] == "30Gi"
    kube.kubectl("delete", "modelserver", "small", "-n", ns, "--wait=true", "--timeout=120s")


def test_a_new_revision_reloads_with_a_loader_that_prunes_the_old_one(kube, operator):
    """The new revision's loader Job runs (placed and admitted under the restricted standard) with
    `--prune-root`, the Deployment moves to the new folder, the stale Job goes. kwok runs no
    containers: the prune itself is tested on a real folder in tests/operator/test_operator_download.py."""
    ns = kube.namespace("rev")
    kube.apply(modelserver("rev", ns, cache={"retainOnDelete": False}))
    wait_for(ready(kube, "rev", ns), "Ready")
    (first,) = kube.items("job", ns, SELECT.format("rev"))
    kube.kubectl("patch", "modelserver", "rev", "-n", ns, "--type=merge", "-p",
                 json.dumps({"spec": {"model": {"uri": "hf://org/rev@v2"}}}))  # fmt: skip

    def reloaded():
        ms = kube.get("modelserver", "rev", ns)
        deployment = kube.get("deployment", "rev", ns)
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        st = ms["status"]
        return (st.get("observedGeneration") == ms["metadata"]["generation"] and st.get("phase") == "Ready"
                and args[0] == "/models/hf/org/rev/v2")  # fmt: skip

    wait_for(reloaded, "the Deployment on the new revision")
    def only_the_new_job():
        jobs = kube.items("job", ns, SELECT.format("rev"))
        return jobs if [j["metadata"]["name"] for j in jobs] != [first["metadata"]["name"]] and len(jobs) == 1 else None

    (job,) = wait_for(only_the_new_job, "the stale Job to go")
    (download,) = job["spec"]["template"]["spec"]["initContainers"]
    assert download["command"] == ["pagoda", "download", "hf://org/rev@v2", "/models/hf/org/rev/v2",
                                   "--error-file", "/dev/termination-log", "--prune-root", "/models/hf"]  # fmt: skip
    assert job["status"].get("succeeded") == 1
    kube.kubectl("delete", "modelserver", "rev", "-n", ns, "--wait=true", "--timeout=120s")
