"""The Helm chart, rendered and linted with helm-python-sdk (Helm's own Go code), its output
validated against the Kubernetes schemas, and its CRD kept equal to the generated one."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from pagoda.operator.crdgen import build_crd

CHART = Path(__file__).resolve().parents[2] / "charts" / "pagoda"
K8S_VERSION = "1.37"
VARIANTS = {
    "defaults": {},
    "namespaced": {
        "watchNamespaces": ["models", "staging"],
        "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
        "extraArgs": ["--verbose"],
        "image": {"repository": "registry.local/pagoda-operator", "tag": "dev"},
    },
    "no-crd": {"crds": {"install": False}, "serviceAccount": {"create": False, "name": "existing"}},
}


def render(values: dict) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        manifests = chart.render(values, name="pagoda", namespace="pagoda-system")
    return [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def chart_crds() -> dict[str, dict]:
    """The CRDs of the chart's crds/ folder (Helm installs them before the templates), by kind."""
    docs = [d for path in sorted((CHART / "crds").glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    return {d["spec"]["names"]["kind"]: d for d in docs}


def rules(docs: list[dict]) -> list[dict]:
    return [r for d in docs if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]


@pytest.mark.parametrize("name", VARIANTS)
def test_chart_lints_clean(name):
    report = helm.lint(CHART, VARIANTS[name], strict=True, kube_version="v1.33.0")
    assert report["errors"] == [] and all(m["severity"] < 2 for m in report["messages"]), report


@pytest.mark.parametrize("name", VARIANTS)
def test_rendered_objects_are_valid_kubernetes(name):
    docs = render(VARIANTS[name])
    kinds = sorted(d["kind"] for d in docs)
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a CRD of the Prometheus Operator: no upstream schema
            assert doc["spec"]["endpoints"][0]["port"] == "http"
            continue
        if doc["apiVersion"] == "kopf.dev/v1":  # kopf's peering: a CRD of the chart's crds/ folder
            crd = chart_crds()[doc["kind"]]
            assert ("namespace" in doc["metadata"]) == (crd["spec"]["scope"] == "Namespaced"), doc
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert "Deployment" in kinds
    assert ("CustomResourceDefinition" in kinds) == (name != "no-crd")
    assert ("ServiceAccount" in kinds) == (name != "no-crd")


def test_crd_in_chart_is_the_generated_one():
    (crd,) = [d for d in render({}) if d["kind"] == "CustomResourceDefinition"]
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert crd == build_crd()


def test_scope_follows_watch_namespaces():
    cluster = render({})
    assert {d["kind"] for d in cluster} >= {"ClusterRole", "ClusterRoleBinding"}
    deployment = next(d for d in cluster if d["kind"] == "Deployment")
    assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    namespaced = render(VARIANTS["namespaced"])
    roles = [d for d in namespaced if d["kind"] == "Role" and d["metadata"]["name"] == "pagoda"]  # not the router's
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["models", "staging"]
    assert not any(
        d["kind"].startswith("Cluster") for d in namespaced if d["kind"] != "CustomResourceDefinition"
    )
    args = next(d for d in namespaced if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    assert args[:2] == ["--namespace=models", "--namespace=staging"] and args[-1] == "--verbose"


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_replicas_share_the_peering_object_the_chart_makes(name):
    """Two replicas by default; each runs `pagoda operator --peering` on the object the chart makes
    (cluster-wide, or one per watched namespace), and the role lets them keep it alive."""
    docs = render(VARIANTS[name])
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "pagoda")
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    peerings = [d for d in docs if d["apiVersion"] == "kopf.dev/v1"]
    assert {d["metadata"]["name"] for d in peerings} == {env["PAGODA_PEERING"]}
    watched = VARIANTS[name].get("watchNamespaces")
    if watched:
        assert sorted(d["metadata"]["namespace"] for d in peerings) == watched
        assert {d["kind"] for d in peerings} == {"KopfPeering"}
    else:
        assert [d["kind"] for d in peerings] == ["ClusterKopfPeering"]
    plural = "kopfpeerings" if watched else "clusterkopfpeerings"
    granted = [r for r in rules(docs) if "kopf.dev" in r["apiGroups"] and plural in r["resources"]]
    assert granted and {"list", "watch", "patch"} <= set(granted[0]["verbs"])


def test_operator_pod_is_restricted():
    deployment = next(d for d in render({}) if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_rbac_grants_no_wildcards_and_no_secrets():
    for rule in rules(render({})):
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "secrets" not in rule["resources"]  # pods read Secrets themselves via secretKeyRef


@pytest.mark.parametrize(
    "bad",
    [
        {"watchNamespaces": ["Not_A_Namespace"]},
        {"resyncSeconds": 0},
        {"image": {"pullPolicy": "Sometimes"}},
        {"unknownKey": 1},
    ],
)
def test_values_schema_rejects_bad_values(bad):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema(bad)
