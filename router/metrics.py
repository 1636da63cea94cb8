"""The router's Prometheus metrics, per model group (`model_server` is namespace/name).

`pagoda_router_queue_depth` is what the autoscaler and KEDA read to scale from zero: requests held
at the router because their ModelServer has no ready replica. `pagoda_router_in_flight_requests`
are the ones sent to a replica and not finished; with both at zero the router needs nothing from
that ModelServer, which is what lets it go to zero.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

LABELS = ("model_server", "model")
QUEUE_DEPTH = "pagoda_router_queue_depth"
IN_FLIGHT = "pagoda_router_in_flight_requests"


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry or CollectorRegistry()
        self.queue_depth = Gauge(QUEUE_DEPTH, "Requests held until a replica is ready.", LABELS, registry=r)
        self.in_flight = Gauge(IN_FLIGHT, "Requests sent to a replica and not yet finished.", LABELS,
                               registry=r)
        self.ready_endpoints = Gauge("pagoda_router_ready_endpoints", "Ready replicas the router sees.",
                                     LABELS, registry=r)
        self.requests = Counter("pagoda_router_requests", "Requests answered, by HTTP status.",
                                (*LABELS, "code"), registry=r)
        self.upstream_requests = Counter("pagoda_router_upstream_requests", "Requests sent, by replica.",
                                         (*LABELS, "endpoint"), registry=r)
        self.scale_from_zero = Counter("pagoda_router_scale_from_zero", "Scale-ups asked for at zero.",
                                       LABELS, registry=r)
        self.hold_timeouts = Counter("pagoda_router_hold_timeouts", "Held requests that timed out.",
                                     LABELS, registry=r)
