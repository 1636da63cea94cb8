"""Operator-wide settings: what the chart passes as flags or environment, read in one place.

Every setting is a field of OperatorConfig, and ENV names the variable each is read from (the
chart's interface). `pagoda operator` builds one from the environment and its flags and installs it
before the handlers are imported, since kopf fixes a timer's interval when it is registered; every
other reader takes it from kopf's memo.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_RUNTIME_IMAGE = "ghcr.io/pagoda-dev/pagoda-runtime:0.1.0"
# Where KEDA finds Prometheus unless the operator is told: prometheus-operator's in-cluster default.
DEFAULT_PROMETHEUS_ADDRESS = "http://prometheus-operated.monitoring.svc:9090"


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    # How often every ModelServer is re-read even without events (Job retries are timed by it too).
    resync_seconds: float = 30.0
    # A failed loader Job is retried after base * 2**(failures-1) seconds, capped at max.
    retry_base_seconds: float = 30.0
    retry_max_seconds: float = 1800.0
    cluster_domain: str = "svc"
    # Every API call gives up after this long: the official client waits forever by default, and
    # a half-open connection would hold a handler thread (and its ModelServer) for good.
    api_timeout_seconds: float = 30.0
    # Longest wait for one pod's /metrics (and the router's), capped by the scrape interval.
    scrape_timeout_seconds: float = 2.0
    # The router's /metrics, whose queue wakes a ModelServer at minReplicas 0 (None: no router).
    router_metrics_url: str | None = None
    # Prometheus for KEDA's ScaledObjects.
    prometheus_address: str = DEFAULT_PROMETHEUS_ADDRESS
    # With --peering: a replica that stops renewing its keep-alive (every 5 to 10 s at this
    # lifetime) is given up for dead after this long and a standby takes over (kopf's default: 60).
    peering_lifetime_seconds: float = 15.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        values = {}
        for f in dataclasses.fields(cls):
            text = env.get(ENV[f.name])
            if text:
                values[f.name] = float(text) if f.type == "float" else text
        return cls(**values)

    def with_overrides(self, **values) -> OperatorConfig:
        """This config with the given fields replaced, those given as None left alone (unset flags)."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})


# The environment variable of each field (the chart's interface).
ENV = {
    "runtime_image": "PAGODA_RUNTIME_IMAGE",
    "resync_seconds": "PAGODA_RESYNC_SECONDS",
    "retry_base_seconds": "PAGODA_RETRY_BASE_SECONDS",
    "retry_max_seconds": "PAGODA_RETRY_MAX_SECONDS",
    "cluster_domain": "PAGODA_CLUSTER_DOMAIN",
    "api_timeout_seconds": "PAGODA_API_TIMEOUT_SECONDS",
    "scrape_timeout_seconds": "PAGODA_AUTOSCALER_SCRAPE_TIMEOUT_SECONDS",
    "router_metrics_url": "PAGODA_ROUTER_METRICS_URL",
    "prometheus_address": "PAGODA_PROMETHEUS_ADDRESS",
    "peering_lifetime_seconds": "PAGODA_PEERING_LIFETIME_SECONDS",
}

_installed: OperatorConfig | None = None


def install(config: OperatorConfig) -> None:
    """Make `config` what current_config() returns (main.py does, before importing the handlers)."""
    global _installed
    _installed = config


def current_config() -> OperatorConfig:
    """The installed config, else one read from the environment (`kopf run -m`, tests)."""
    return _installed if _installed is not None else OperatorConfig.from_env()
