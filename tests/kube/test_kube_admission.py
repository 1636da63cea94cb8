"""The API server enforces OwnerReferencesPermissionEnforcement (as OpenShift does): a child with
`blockOwnerDeletion: true` needs `update` on the owner's finalizers. A ServiceAccount without that
is refused; the chart's ServiceAccount, which the operator runs as, is let through."""

from __future__ import annotations

import json

from kube_cluster import service_account_kubeconfig


def service(ns: str, owner: dict, block: bool) -> str:
    ref = {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer", "name": owner["metadata"]["name"],
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": block}  # fmt: skip
    return json.dumps({"apiVersion": "v1", "kind": "Service",
                       "metadata": {"generateName": "child-", "namespace": ns, "ownerReferences": [ref]},
                       "spec": {"ports": [{"port": 80}]}})  # fmt: skip


def test_block_owner_deletion_needs_the_finalizers_permission_the_chart_grants(kube, chart):
    ns = kube.namespace("owners")
    kube.apply({"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer", "metadata": {"name": "owner", "namespace": ns},
                "spec": {"model": {"uri": "hf://org/owner"}, "cache": {"enabled": False}}})  # fmt: skip
    owner = kube.get("modelserver", "owner", ns)
    # May create Services, and nothing on ModelServers.
    kube.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "plain", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "plain", "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["create", "get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "plain", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "plain"},
         "subjects": [{"kind": "ServiceAccount", "name": "plain", "namespace": ns}]},
    ])  # fmt: skip
    plain = service_account_kubeconfig(kube, name="plain", namespace=ns)
    refused = kube.kubectl("create", "-f", "-", input=service(ns, owner, block=True), kubeconfig=plain, check=False)
    assert refused.returncode != 0 and "cannot set blockOwnerDeletion" in refused.stderr, refused.stderr
    # The same child without the flag passes: the refusal is the plugin's, not RBAC's on Services.
    kube.kubectl("create", "-f", "-", input=service(ns, owner, block=False), kubeconfig=plain)

    operator = service_account_kubeconfig(kube)  # the chart's ServiceAccount
    kube.kubectl("create", "-f", "-", input=service(ns, owner, block=True), kubeconfig=operator)
    kube.kubectl("delete", "modelserver", "owner", "-n", ns, "--wait=false")
