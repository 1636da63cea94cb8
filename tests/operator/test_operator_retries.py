"""A transient API failure is retried within seconds (a short jittered TemporaryError), not after
kopf's default minute. The 409 case is on the real API server: tests/kube/test_kube_status_writers.py."""

from __future__ import annotations

import kopf
import kubernetes
import pytest

from pagoda.operator import handlers
from pagoda.operator.config import OperatorConfig
from pagoda.operator.k8s import Cluster


def test_an_unreachable_api_server_is_retried_within_seconds():
    configuration = kubernetes.client.Configuration()
    configuration.host, configuration.retries = "http://127.0.0.1:9", 0  # the discard port: refused at once
    memo = kopf.Memo(config=OperatorConfig(runtime_image="registry.local/pagoda-runtime:test"),
                     cluster=Cluster(kubernetes.client.ApiClient(configuration), timeout=5))  # fmt: skip
    body = {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer",
            "metadata": {"name": "away", "namespace": "default", "uid": "u", "generation": 1, "resourceVersion": "1"},
            "spec": {"model": {"uri": "hf://org/away"}}}  # fmt: skip
    with pytest.raises(kopf.TemporaryError, match="unreachable") as unreachable:
        handlers._run(memo, body)
    assert handlers.RETRY_SECONDS[0] <= unreachable.value.delay <= handlers.RETRY_SECONDS[1]
