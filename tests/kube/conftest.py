"""The real control plane (e2e/kube/up.sh), the chart installed into it, and the operator running
on this machine as the chart's ServiceAccount: one of each for the session; and the tiny model the
pods' real servers serve and the stand-in Hub offers, built once (about 8 s on 2 cores)."""

from __future__ import annotations

import pytest
from kube_cluster import Kube, Operator, install_chart, service_account_kubeconfig, start, stop

from pagoda.runtime.tools.tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def kube(tmp_path_factory) -> Kube:
    # Short: unix socket paths and kubeconfigs stay readable in failure messages.
    dir = tmp_path_factory.mktemp("kube")
    cluster = start(dir)
    try:
        yield cluster
    finally:
        stop(dir)


@pytest.fixture(scope="session")
def chart(kube: Kube) -> dict:
    release = install_chart(kube, {"runtimeImage": "registry.local/pagoda-runtime:test"})
    kube.collect_garbage_of_new_kinds()  # the ModelServer CRD
    return release


@pytest.fixture(scope="session")
def operator(kube: Kube, chart: dict, tmp_path_factory) -> Operator:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = Operator(kubeconfig=service_account_kubeconfig(kube), log=log).start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Read only: every reader shares it."""
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", "llama")
