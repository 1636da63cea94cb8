"""HPA and KEDA modes: the objects that hand a ModelServer's scaling to an autoscaler the cluster runs.

Pure functions from the ModelServer body to manifests; the handlers apply what they return. Both
objects target the ModelServer itself through its scale subresource (spec.replicas, with
status.selector for the pods), never the Deployment: spec.replicas stays the one number that the
operator copies into the Deployment, whoever sets it (the HPA, KEDA, the operator's own autoscaler
or `kubectl scale`), so no two writers fight over Deployment.spec.replicas.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.operator.autoscaler.metrics import HPA_WAITING, WAITING
from pagoda.operator.autoscaler.policy import ScalingParams
from pagoda.operator.builders import meta
from pagoda.operator.config import OperatorConfig, current_config
from pagoda.operator.spec import ModelServer
from pagoda.router.metrics import IN_FLIGHT as ROUTER_IN_FLIGHT
from pagoda.router.metrics import QUEUE_DEPTH as ROUTER_QUEUE_DEPTH

# The pods metric that the prometheus-adapter rule in docs/autoscaling.md exposes, and the series
# KEDA's query sums (metrics.py names both).
HPA_METRIC = HPA_WAITING
PROMETHEUS_METRIC = WAITING
AUTOSCALER_COMPONENT = "autoscaler"

# Kubernetes' own limits on HPA behavior fields.
MAX_STABILIZATION_SECONDS = 3600
MAX_PERIOD_SECONDS = 1800


def build_autoscaler(
    modelserver_body: ModelServer | Mapping[str, Any], config: OperatorConfig | None = None
) -> list[dict[str, Any]]:
    """The objects the scaling mode needs: [] (operator), [HorizontalPodAutoscaler] or [ScaledObject].

    Takes the ModelServer as the reconcile holds it, or as a raw body (dict or kopf Body).
    """
    config = config or current_config()
    ms = (
        modelserver_body
        if isinstance(modelserver_body, ModelServer)
        else ModelServer.from_body(modelserver_body)
    )
    mode = ms.spec.scaling.mode
    if mode == "operator":
        return []
    if mode == "hpa":
        return [build_hpa(ms)]
    if mode == "keda":
        return [build_scaled_object(ms, config)]
    raise ValueError(f"unknown scaling mode {mode!r}; expected operator, hpa or keda")


def build_hpa(ms: ModelServer) -> dict[str, Any]:
    params = ScalingParams.from_model(ms)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta.object_meta(ms, ms.name, AUTOSCALER_COMPONENT),
        "spec": {
            "scaleTargetRef": _target_ref(ms),
            # The HPA cannot go below 1 (without the HPAScaleToZero gate); KEDA can.
            "minReplicas": max(1, params.min_replicas),
            "maxReplicas": params.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": HPA_METRIC},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": _quantity(params.target_waiting_requests),
                        },
                    },
                }
            ],
            "behavior": _behavior(params),
        },
    }


def build_scaled_object(ms: ModelServer, config: OperatorConfig | None = None) -> dict[str, Any]:
    params = ScalingParams.from_model(ms)
    address = prometheus_address(ms, config or current_config())
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": meta.object_meta(ms, ms.name, AUTOSCALER_COMPONENT),
        "spec": {
            "scaleTargetRef": _target_ref(ms),
            "pollingInterval": _seconds(params.scrape_interval_seconds, minimum=1),
            # KEDA applies cooldownPeriod only between 1 and 0 replicas; the HPA behavior below is
            # what delays the steps between minReplicaCount and maxReplicaCount.
            "cooldownPeriod": _seconds(params.scale_down_delay_seconds),
            "minReplicaCount": params.min_replicas,
            "maxReplicaCount": params.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(params)}},
            "triggers": [
                {
                    "type": "prometheus",
                    # AverageValue: KEDA's HPA divides the summed queue by the replica count.
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": address,
                        "query": keda_query(ms),
                        # KEDA parses its trigger metadata as plain numbers: "2.5", never "2500m".
                        "threshold": _decimal(params.target_waiting_requests),
                    },
                },
                *([router_trigger(ms, address, params)] if params.min_replicas == 0 else []),
            ],
        },
    }


def router_trigger(ms: ModelServer, address: str, params: ScalingParams) -> dict[str, Any]:
    """At zero replicas there are no pods to measure: `pagoda router` holds the requests and exports
    them, so KEDA activates on the router's queue and keeps a replica while the router has requests
    in flight to it. (`or vector(0)`: a ModelServer the router has not seen has no series yet.)"""
    selector = f'{{model_server="{ms.namespace}/{ms.name}"}}'
    return {
        "type": "prometheus",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": address,
            "query": f"(sum({ROUTER_QUEUE_DEPTH}{selector}) or vector(0))"
            f" + (sum({ROUTER_IN_FLIGHT}{selector}) or vector(0))",
            "threshold": _decimal(params.target_waiting_requests),
            "activationThreshold": "0",
        },
    }


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal (Go's escapes: backslash and quote, and newlines)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def keda_query(ms: ModelServer) -> str:
    """The ModelServer's queue: its namespace's pods only (another namespace may serve a model of
    the same name), with the name escaped as PromQL wants."""
    labels = f"namespace={promql_string(ms.namespace)},model_name={promql_string(meta.served_name(ms))}"
    return f"sum({PROMETHEUS_METRIC}{{{labels}}})"


def prometheus_address(ms: ModelServer, config: OperatorConfig) -> str:
    """Where KEDA finds Prometheus: spec.scaling.prometheusAddress once the CRD has such a field,
    else the operator's (OperatorConfig.prometheus_address)."""
    return getattr(ms.spec.scaling, "prometheus_address", None) or config.prometheus_address


def _behavior(params: ScalingParams) -> dict[str, Any]:
    """Up fast and in proportion (double per interval, or +4 pods), down one pod per delay."""
    interval = _seconds(params.scrape_interval_seconds, minimum=1, maximum=MAX_PERIOD_SECONDS)
    delay = _seconds(params.scale_down_delay_seconds, maximum=MAX_STABILIZATION_SECONDS)
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": _seconds(
                params.scale_up_stabilization_seconds, maximum=MAX_STABILIZATION_SECONDS
            ),
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": interval},
                {"type": "Pods", "value": 4, "periodSeconds": interval},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": delay,
            "selectPolicy": "Min",
            "policies": [
                {"type": "Pods", "value": 1, "periodSeconds": max(1, min(delay, MAX_PERIOD_SECONDS))}
            ],
        },
    }


def _target_ref(ms: ModelServer) -> dict[str, str]:
    return {"apiVersion": ms.api_version, "kind": ms.kind, "name": ms.name}


def _quantity(value: float) -> str:
    """A Kubernetes quantity: "4" for whole numbers, milli-units ("2500m") otherwise."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def _decimal(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _seconds(value: float, minimum: int = 0, maximum: int | None = None) -> int:
    seconds = max(minimum, round(value))
    return min(seconds, maximum) if maximum is not None else seconds
