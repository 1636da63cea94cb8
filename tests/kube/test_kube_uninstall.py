"""`helm uninstall` and the finalizer, on the real control plane, as operator/README.md documents:
ModelServers deleted first (while the operator runs) leave nothing behind; one deleted after the
operator is gone waits for its finalizer until released by hand, and then garbage collection takes
its children. A second release of the chart, watching one namespace, so the session's is untouched."""

from __future__ import annotations

import json

from kube_cluster import Operator, install_chart, service_account_kubeconfig, uninstall_chart, wait_for

RELEASE = "uninst"
FULLNAME = "uninst-pagoda"  # the chart's fullname for this release
CHILDREN = "pvc,job,deployment,service,pdb"


def modelserver(name: str, ns: str) -> dict:
    return {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer", "metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"uri": f"hf://org/{name}"}, "cache": {"retainOnDelete": False}}}  # fmt: skip


def installed(kube, ns: str, tmp_path, operator_ns: str) -> Operator:
    """This release installed (CRD kept from the session's), its operator running as its ServiceAccount."""
    values = {"runtimeImage": "registry.local/pagoda-runtime:test", "watchNamespaces": [ns],
              "crds": {"install": False}, "router": {"enabled": False}}  # fmt: skip
    assert install_chart(kube, values, release=RELEASE, namespace=operator_ns)["status"] == "deployed"
    kubeconfig = service_account_kubeconfig(kube, name=FULLNAME, namespace=operator_ns)
    return Operator(kubeconfig=kubeconfig, log=tmp_path / "operator.log", scope=("--namespace", ns),
                    args=("--peering", FULLNAME)).start()  # fmt: skip


def ready(kube, name: str, ns: str):
    return lambda: (kube.get("modelserver", name, ns) or {}).get("status", {}).get("phase") == "Ready"


def test_uninstall_after_the_modelservers_and_the_escape_hatch_before(kube, operator, tmp_path):
    ns = kube.namespace("uninst")
    operator_ns = kube.namespace("pagoda-uninst", restricted=False)
    operator.stop()  # the session's operator watches every namespace: out of the way meanwhile
    try:
        # The documented order: ModelServers first, then the release.
        op = installed(kube, ns, tmp_path, operator_ns)
        try:
            kube.apply(modelserver("first", ns))
            wait_for(ready(kube, "first", ns), "first Ready")
            kube.kubectl("delete", "modelservers", "--all", "-n", ns, "--wait=true", "--timeout=120s")
            wait_for(lambda: not kube.items(CHILDREN, ns), "first's children and cache claim to go")
        finally:
            op.stop()
        uninstall_chart(kube, RELEASE, operator_ns)
        assert kube.get("role", FULLNAME, ns) is None and kube.get("kopfpeering", FULLNAME, ns) is None

        # The wrong order: the release goes first, the ModelServer's delete then waits for its finalizer.
        op = installed(kube, ns, tmp_path, operator_ns)
        try:
            kube.apply(modelserver("stuck", ns))
            wait_for(ready(kube, "stuck", ns), "stuck Ready")
        finally:
            op.stop()
        uninstall_chart(kube, RELEASE, operator_ns)
        kube.kubectl("delete", "modelserver", "stuck", "-n", ns, "--wait=false")
        stuck = kube.get("modelserver", "stuck", ns)
        assert stuck["metadata"]["deletionTimestamp"] and stuck["metadata"]["finalizers"] == ["pagoda.dev/finalizer"]
        assert kube.items("deployment", ns), "nothing is collected while the finalizer holds the ModelServer"
        kube.kubectl("patch", "modelserver", "stuck", "-n", ns, "--type=merge",
                     "-p", json.dumps({"metadata": {"finalizers": None}}))  # fmt: skip
        wait_for(lambda: kube.get("modelserver", "stuck", ns) is None, "the released ModelServer to go")
        # The owned children (the claim too: retainOnDelete false) go by garbage collection.
        wait_for(lambda: not kube.items(CHILDREN, ns), "stuck's children to be garbage-collected")
    finally:
        operator.start()
