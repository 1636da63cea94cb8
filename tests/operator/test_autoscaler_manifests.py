"""HPA and KEDA modes: the rendered objects pass the real schemas and say what the spec asks."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import promql_parser
import pytest

from pagoda.operator.autoscaler.manifests import build_autoscaler
from pagoda.operator.spec import ModelServer

KEDA_SCHEMA = json.loads((Path(__file__).parent / "data" / "keda-scaledobject.schema.json").read_text())
K8S_VERSION = "1.30.0"


def modelserver(mode: str, **scaling) -> dict:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "llama", "namespace": "serving", "uid": "0b6f6c9e-1111-4a5b-9c3d-2e2e2e2e2e2e"},
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "name": "llama-8b"},
            "replicas": 2,
            "scaling": {
                "mode": mode,
                "minReplicas": 1,
                "maxReplicas": 6,
                "targetWaitingRequests": 3,
                "scrapeIntervalSeconds": 10,
                "scaleUpStabilizationSeconds": 10,
                "scaleDownDelaySeconds": 300,
                **scaling,
            },
        },
    }


def owner_is_the_modelserver(obj: dict, body: dict) -> None:
    (owner,) = obj["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "name": body["metadata"]["name"],
        "uid": body["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert obj["metadata"]["namespace"] == body["metadata"]["namespace"]


def test_operator_mode_renders_nothing():
    assert build_autoscaler(modelserver("operator")) == []
    body = modelserver("operator")
    del body["spec"]["scaling"]["mode"]  # the default mode is the operator's own autoscaler
    assert build_autoscaler(body) == []


def test_takes_the_parsed_modelserver_as_the_reconcile_passes_it():
    body = modelserver("hpa")
    assert build_autoscaler(ModelServer.from_body(body)) == build_autoscaler(body)


@pytest.mark.parametrize("target, quantity", [(3, "3"), (2.5, "2500m")])
def test_hpa_is_valid_autoscaling_v2(target, quantity):
    body = modelserver("hpa", targetWaitingRequests=target)
    (hpa,) = build_autoscaler(body)
    # strict: an unknown or misspelt field anywhere fails, as the API server would drop it.
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)

    assert (hpa["apiVersion"], hpa["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
    owner_is_the_modelserver(hpa, body)
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "name": "llama",
    }
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 6)
    assert spec["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_num_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": quantity},
            },
        }
    ]
    up, down = spec["behavior"]["scaleUp"], spec["behavior"]["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 10
    assert down["stabilizationWindowSeconds"] == 300
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


def test_hpa_schema_check_is_real():
    """The strict validation above would catch a misspelt field: it is not a rubber stamp."""
    (hpa,) = build_autoscaler(modelserver("hpa"))
    hpa["spec"]["metrics"][0]["pods"]["target"]["averageValues"] = "3"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)


def test_hpa_behaviour_stays_within_kubernetes_limits():
    body = modelserver(
        "hpa", scaleDownDelaySeconds=7200, scaleUpStabilizationSeconds=0, scrapeIntervalSeconds=3600
    )
    (hpa,) = build_autoscaler(body)
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 3600
    assert all(1 <= p["periodSeconds"] <= 1800 for rules in behavior.values() for p in rules["policies"])


def test_keda_scaled_object_matches_keda_crd_schema(monkeypatch):
    monkeypatch.setenv("PAGODA_PROMETHEUS_ADDRESS", "http://prometheus.monitoring:9090")
    body = modelserver("keda")
    (scaled,) = build_autoscaler(body)
    jsonschema.validate(scaled, KEDA_SCHEMA, cls=jsonschema.Draft7Validator)

    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    owner_is_the_modelserver(scaled, body)
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "name": "llama",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (1, 6, 10)
    assert spec["triggers"] == [
        {
            "type": "prometheus",
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": "http://prometheus.monitoring:9090",
                "query": 'sum(vllm:num_requests_waiting{namespace="serving",model_name="llama-8b"})',
                "threshold": "3",
            },
        }
    ]
    # KEDA hands the behaviour to the HPA it creates; that part must also be valid autoscaling/v2.
    hpa_like = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "x"},
        "spec": {
            "scaleTargetRef": spec["scaleTargetRef"],
            "maxReplicas": 6,
            "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
        },
    }
    kubernetes_validate.validate(hpa_like, K8S_VERSION, strict=True)


def test_keda_schema_check_is_real():
    (scaled,) = build_autoscaler(modelserver("keda"))
    for breakage in (
        lambda s: s["spec"]["triggers"][0].update(metricType="Average"),
        lambda s: s["spec"]["triggers"][0]["metadata"].update(threshold=3),  # metadata values are strings
        lambda s: s["spec"].update(minReplicas=1),  # HPA's name, not KEDA's
        lambda s: s["spec"]["scaleTargetRef"].pop("name"),
    ):
        broken = json.loads(json.dumps(scaled))
        breakage(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, KEDA_SCHEMA, cls=jsonschema.Draft7Validator)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode"):
        build_autoscaler(modelserver("vpa"))


def test_hpa_floor_is_one_replica_keda_may_reach_zero():
    body = modelserver("hpa", minReplicas=0)
    (hpa,) = build_autoscaler(body)
    assert hpa["spec"]["minReplicas"] == 1
    (scaled,) = build_autoscaler(modelserver("keda", minReplicas=0))
    assert scaled["spec"]["minReplicaCount"] == 0


@pytest.mark.parametrize("target", [2.5, 0.25, 7])
def test_keda_threshold_is_a_plain_number(target):
    """KEDA parses trigger metadata with strconv.ParseFloat: a quantity such as "2500m" fails."""
    (scaled,) = build_autoscaler(modelserver("keda", targetWaitingRequests=target))
    threshold = scaled["spec"]["triggers"][0]["metadata"]["threshold"]
    assert float(threshold) == target and "m" not in threshold


@pytest.mark.parametrize("name", ['llama-8b', 'org/model "quoted"', "back\\slash", "new\nline"])
def test_keda_query_parses_and_selects_this_namespace_and_model(name):
    """Prometheus' grammar (promql-parser) reads back exactly the namespace and the served name."""
    body = modelserver("keda")
    body["spec"]["model"]["name"] = name
    (scaled,) = build_autoscaler(body)
    expr = promql_parser.parse(scaled["spec"]["triggers"][0]["metadata"]["query"])
    assert isinstance(expr, promql_parser.AggregateExpr) and expr.expr.name == "vllm:num_requests_waiting"
    matchers = {m.name: m.value for m in expr.expr.matchers.matchers}
    assert matchers == {"namespace": "serving", "model_name": name}
