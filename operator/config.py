"""Operator-wide settings: what the chart passes as flags or environment, read once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_RUNTIME_IMAGE = "ghcr.io/pagoda-dev/pagoda-runtime:0.1.0"


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

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        return cls(
            runtime_image=env.get("PAGODA_RUNTIME_IMAGE", DEFAULT_RUNTIME_IMAGE),
            resync_seconds=float(env.get("PAGODA_RESYNC_SECONDS", 30)),
            retry_base_seconds=float(env.get("PAGODA_RETRY_BASE_SECONDS", 30)),
            retry_max_seconds=float(env.get("PAGODA_RETRY_MAX_SECONDS", 1800)),
            cluster_domain=env.get("PAGODA_CLUSTER_DOMAIN", "svc"),
            api_timeout_seconds=float(env.get("PAGODA_API_TIMEOUT_SECONDS", 30)),
        )
