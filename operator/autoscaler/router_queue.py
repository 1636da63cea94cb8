"""The router's queue for each ModelServer, from its /metrics: what lets minReplicas 0 work.

`pagoda router` exports, per ModelServer (label model_server="namespace/name"), the requests it
holds because no replica is ready, and those in flight to a replica. The chart points the operator
at the router with $PAGODA_ROUTER_METRICS_URL (OperatorConfig.router_metrics_url); without it, or when the router does not answer,
the autoscaler knows nothing of the router (None) and never takes the last replica away.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pagoda.operator.autoscaler.policy import RouterLoad
from pagoda.router.metrics import IN_FLIGHT, QUEUE_DEPTH


def parse_router_queues(text: str) -> dict[str, RouterLoad]:
    """{"namespace/name": RouterLoad} for every ModelServer the page has figures for."""
    sums: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (QUEUE_DEPTH, IN_FLIGHT):
            for sample in family.samples:
                if sample.name == family.name and "model_server" in sample.labels:
                    figures = sums.setdefault(sample.labels["model_server"], {QUEUE_DEPTH: 0.0, IN_FLIGHT: 0.0})
                    figures[family.name] += sample.value
    return {key: RouterLoad(held=f[QUEUE_DEPTH], in_flight=f[IN_FLIGHT]) for key, f in sums.items()}


async def router_load(key: str, timeout: float, url: str | None) -> RouterLoad | None:
    """This ModelServer's RouterLoad; zero when the router answers without it (it never saw a
    request for it), None when no router is configured or it does not answer."""
    if not url:
        return None
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            response = await client.get(url)
            response.raise_for_status()
        return parse_router_queues(response.text).get(key, RouterLoad(0.0, 0.0))
    except (httpx.HTTPError, ValueError):
        return None
