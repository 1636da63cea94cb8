"""The chart's router: rendered by Helm's own code, valid Kubernetes, least-privilege RBAC, and
arguments the real `pagoda router` parser accepts."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from pagoda.runtime.cli import build_parser

CHART = Path(__file__).resolve().parents[2] / "charts" / "pagoda"
K8S_VERSION = "1.37"


def render(values: dict) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        manifests = chart.render(values, name="pagoda", namespace="pagoda-system")
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def router_objects(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["metadata"]["name"] == "pagoda-router"]


def container(docs: list[dict], name: str) -> dict:
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("values", [{}, {"watchNamespaces": ["models", "staging"]},
                                    {"serviceAccount": {"create": False, "name": "existing"}}])
def test_router_objects_are_valid_kubernetes(values):
    objects = router_objects(render(values))
    for doc in objects:
        if doc["kind"] != "ServiceMonitor":  # the Prometheus Operator's CRD: no upstream schema
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kinds = sorted(d["kind"] for d in objects)
    assert {"Deployment", "Service"} <= set(kinds)
    assert ("ServiceAccount" in kinds) == values.get("serviceAccount", {}).get("create", True)


def test_router_runs_the_real_cli_with_its_settings():
    docs = render({"watchNamespaces": ["models"], "router": {"holdTimeoutSeconds": 90, "maxHeldPerModel": 5}})
    router = container(docs, "pagoda-router")
    assert router["command"] == ["pagoda", "router"]
    args = build_parser("router").parse_args(["router", *router["args"]])
    assert args.kubernetes and args.namespaces == ["models"]
    assert (args.hold_timeout, args.max_held, args.port) == (90, 5, 8080)
    env = {e["name"]: e["value"] for e in router["env"]}
    assert env["PAGODA_ROUTER_URL"] == "http://pagoda-router.pagoda-system.svc:8080"
    assert router["image"] == "ghcr.io/pagoda-dev/pagoda-runtime:0.1.0"  # the runtime image
    # The operator's autoscaler reads the router's queue there.
    operator_env = {e["name"]: e.get("value") for e in container(docs, "pagoda")["env"]}
    assert operator_env["PAGODA_ROUTER_METRICS_URL"] == "http://pagoda-router.pagoda-system.svc:8080/metrics"


def test_router_rbac_is_exactly_what_it_uses():
    (role,) = [d for d in router_objects(render({})) if d["kind"] == "ClusterRole"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {
        ("pagoda.dev", "modelservers", "get"), ("pagoda.dev", "modelservers", "list"),
        ("pagoda.dev", "modelservers", "watch"), ("pagoda.dev", "modelservers/scale", "patch"),
        ("pagoda.dev", "modelservers/status", "patch"), ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
    }


def test_router_is_scraped_with_the_modelservers():
    docs = render({"serviceMonitor": {"enabled": True}})
    (monitor,) = [d for d in router_objects(docs) if d["kind"] == "ServiceMonitor"]
    (service,) = [d for d in router_objects(docs) if d["kind"] == "Service"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_router_can_be_left_out():
    docs = render({"router": {"enabled": False}})
    assert router_objects(docs) == []
    assert "PAGODA_ROUTER_METRICS_URL" not in {e["name"] for e in container(docs, "pagoda")["env"]}


@pytest.mark.parametrize("bad", [{"router": {"port": 0}}, {"router": {"holdTimeoutSeconds": 0}},
                                 {"router": {"strategy": "PrefixHash"}}])
def test_values_schema_rejects_bad_router_values(bad):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema(bad)
