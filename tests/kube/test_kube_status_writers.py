"""Two writers of one ModelServer's status on the real API server: the reconcile writes only onto
the version it read, so a condition another writer (the autoscaler, another controller) added
meanwhile is never erased: the stale write is a 409, retried soon, and the retry carries the
condition over. The session's operator is stopped meanwhile, so the test alone writes."""

from __future__ import annotations

import copy
import json

import kopf
import pytest
from kube_cluster import service_account_kubeconfig, wait_for

from pagoda.operator import handlers
from pagoda.operator.config import OperatorConfig
from pagoda.operator.k8s import Cluster

OTHER = {"type": "Audited", "status": "True", "reason": "PolicyPassed", "message": "written meanwhile",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip


def test_a_stale_status_write_is_refused_and_the_retry_keeps_the_other_writers_condition(
        kube, operator, monkeypatch):  # fmt: skip
    ns = kube.namespace("writers")
    kube.apply({"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer", "metadata": {"name": "two", "namespace": ns},
                "spec": {"model": {"uri": "hf://org/two"}, "cache": {"enabled": False}}})  # fmt: skip
    read = wait_for(lambda: (m := kube.get("modelserver", "two", ns))["status"].get("phase") == "Ready" and m,
                    "Ready")  # fmt: skip
    operator.stop()
    try:
        check_two_writers(kube, ns, read, monkeypatch)
    finally:
        operator.start()
    kube.kubectl("delete", "modelserver", "two", "-n", ns, "--wait=true", "--timeout=120s")


def check_two_writers(kube, ns: str, read: dict, monkeypatch) -> None:
    # What an earlier pass read: the same version, but from before the replica was ready, so this
    # pass has conditions to write.
    stale = copy.deepcopy(read)
    available = next(c for c in stale["status"]["conditions"] if c["type"] == "Available")
    available.update(status="False", reason="ReplicasNotReady", message="0/1 replicas ready")
    # Meanwhile another writer adds its condition, as the autoscaler does (onto what it read).
    conditions = [*read["status"]["conditions"], OTHER]
    kube.kubectl("patch", "modelserver", "two", "-n", ns, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"conditions": conditions}}))  # fmt: skip

    memo = kopf.Memo(config=OperatorConfig(runtime_image="registry.local/pagoda-runtime:test"),
                     cluster=Cluster(kube.api(service_account_kubeconfig(kube))))  # fmt: skip
    posted: list = []
    monkeypatch.setattr(handlers, "_post", lambda body, events: posted.extend(events))  # no kopf loop here
    with pytest.raises(kopf.TemporaryError, match="409") as conflict:
        handlers._run(memo, stale)
    # Retried within seconds (jittered), not after kopf's default minute.
    assert handlers.RETRY_SECONDS[0] <= conflict.value.delay <= handlers.RETRY_SECONDS[1]
    live = kube.get("modelserver", "two", ns)
    assert OTHER["type"] in {c["type"] for c in live["status"]["conditions"]}, "the stale write erased it"

    # The retry reads the object afresh: it writes what it owns and keeps the other writer's condition.
    fresh = copy.deepcopy(live)
    next(c for c in fresh["status"]["conditions"] if c["type"] == "Available")["message"] = "0/1 replicas ready"
    handlers._run(memo, fresh)
    after = {c["type"]: c for c in kube.get("modelserver", "two", ns)["status"]["conditions"]}
    assert after["Audited"]["message"] == "written meanwhile"
    assert after["Available"]["message"] == "1/1 replicas ready"

