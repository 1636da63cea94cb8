"""The InferencePool builder: what routing.inferencePool emits, against the Gateway API Inference
Extension's own CRD schema (e2e/kube/crds, v1.6.0). The real API server, with the CRD's CEL rules,
takes it in tests/kube/test_kube_inference_pool.py."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml
from crd_check import admit

from pagoda.operator.builders.deployment import build_deployment
from pagoda.operator.builders.inference_pool import build_inference_pool
from pagoda.operator.config import OperatorConfig
from pagoda.operator.spec import ModelServer

CRD = Path(__file__).resolve().parents[2] / "e2e" / "kube" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"


def modelserver(**routing) -> ModelServer:
    obj = {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer",
           "metadata": {"name": "llama", "namespace": "ml", "uid": "u-1", "generation": 1},
           "spec": {"model": {"uri": "hf://org/llama"}, "routing": routing}}  # fmt: skip
    defaulted, errors = admit(obj)
    assert errors == []
    return ModelServer.from_body(defaulted)


def pool_schema() -> dict:
    crd = next(d for d in yaml.safe_load_all(CRD.read_text()) if d)
    (version,) = crd["spec"]["versions"]
    assert (crd["spec"]["group"], version["name"]) == ("inference.networking.k8s.io", "v1")
    return version["schema"]["openAPIV3Schema"]


def test_off_by_default():
    assert build_inference_pool(modelserver()) is None


def test_the_pool_selects_the_serving_pods_on_their_port_and_names_the_picker():
    ms = modelserver(inferencePool=True, endpointPickerRef={"name": "llama-epp"})
    pool = build_inference_pool(ms)
    jsonschema.validate(pool, pool_schema())
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    deployment = build_deployment(ms, OperatorConfig())
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert pool["spec"]["targetPorts"] == [{"number": container["ports"][0]["containerPort"]}]
    assert pool["spec"]["endpointPickerRef"] == {"name": "llama-epp", "port": {"number": 9002}, "failureMode": "FailClose"}
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_without_a_picker_the_pool_is_still_valid():
    pool = build_inference_pool(modelserver(inferencePool=True))
    jsonschema.validate(pool, pool_schema())
    assert "endpointPickerRef" not in pool["spec"]
