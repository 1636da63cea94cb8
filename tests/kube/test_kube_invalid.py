"""Specs that cannot work are refused by the real API server (the CRD's schema and CEL rules, as
the cluster evaluates them), with a message naming the field; the same table is checked with
cel-python in tests/operator/test_operator_crd.py."""

from __future__ import annotations

import json

import pytest
from broken_specs import BROKEN, minimal


@pytest.fixture(scope="module")
def namespace(kube, chart):  # chart: the CRD comes with it
    return kube.namespace("invalid")


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_api_server_refuses_naming_the_field(kube, namespace, case):
    mutate, field = BROKEN[case]
    obj = minimal()
    obj["metadata"]["namespace"] = namespace
    mutate(obj["spec"])
    result = kube.kubectl("create", "-f", "-", input=json.dumps(obj), check=False)
    assert result.returncode != 0, f"{case} was admitted"
    assert f"spec.{field}" in result.stderr, result.stderr


def test_valid_minimal_spec_is_admitted(kube, namespace):
    obj = minimal()
    obj["metadata"].update(namespace=namespace, name="fine")
    kube.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(obj))


def test_cache_fields_are_immutable_once_loaded(kube, namespace):
    obj = minimal()
    obj["metadata"].update(namespace=namespace, name="loaded")
    kube.kubectl("create", "-f", "-", input=json.dumps(obj))
    status = {"status": {"cache": {"ready": True, "uri": obj["spec"]["model"]["uri"]}}}
    kube.kubectl("patch", "modelserver", "loaded", "-n", namespace, "--subresource=status",
                 "--type=merge", "-p", json.dumps(status))  # fmt: skip
    result = kube.kubectl("patch", "modelserver", "loaded", "-n", namespace, "--type=merge",
                          "-p", json.dumps({"spec": {"cache": {"storageClassName": "fast"}}}), check=False)  # fmt: skip
    assert result.returncode != 0 and "immutable once the cache is loaded" in result.stderr
    kube.kubectl("delete", "modelserver", "loaded", "-n", namespace, "--wait=false")
