"""The operator's autoscaler with the router's queue: minReplicas 0 wakes on a held request and
goes to zero only when the router has nothing for the ModelServer."""

from __future__ import annotations

from prometheus_client import generate_latest

from pagoda.operator.autoscaler.policy import PodLoad, RouterLoad, ScalingParams, ScalingState, decide
from pagoda.operator.autoscaler.router_queue import parse_router_queues, router_load
from pagoda.router.metrics import RouterMetrics

PARAMS = ScalingParams(min_replicas=0, max_replicas=4, target_waiting_requests=4, scrape_interval_seconds=5,
                       scale_up_stabilization_seconds=0, scale_down_delay_seconds=60)
IDLE_POD = [PodLoad("pod-0", 0.0, 0.0)]


def run(pods, n, router, ticks, params=PARAMS):
    """decide() once per scrape interval for `ticks` ticks at fixed figures; the last decision."""
    state = ScalingState()
    for t in range(ticks):
        decision = decide(pods, n, params, state, now=t * params.scrape_interval_seconds, router=router)
        state = decision.state
    return decision


def test_a_held_request_wakes_a_modelserver_at_zero():
    decision = run([], 0, RouterLoad(held=3, in_flight=0), 1)
    assert (decision.desired_replicas, decision.reason) == (1, "RouterHolding")


def test_zero_stays_zero_without_requests_and_without_a_router():
    assert run([], 0, RouterLoad(0, 0), 1).desired_replicas == 0
    assert run([], 0, None, 1).desired_replicas == 0


def test_the_last_replica_goes_after_a_calm_delay_with_the_router_idle():
    assert run(IDLE_POD, 1, RouterLoad(0, 0), 12).desired_replicas == 1  # 55 s of calm: not yet
    decision = run(IDLE_POD, 1, RouterLoad(0, 0), 14)
    assert (decision.desired_replicas, decision.reason) == (0, "QueueEmpty")


def test_the_last_replica_stays_while_the_router_has_requests_or_is_unknown():
    assert run(IDLE_POD, 1, RouterLoad(held=0, in_flight=1), 30).desired_replicas == 1
    assert run(IDLE_POD, 1, None, 30).desired_replicas == 1  # no router: nothing would wake it
    busy = [PodLoad("pod-0", 0.0, 2.0)]
    assert run(busy, 1, RouterLoad(0, 0), 30).desired_replicas == 1


def test_min_replicas_above_zero_is_never_crossed():
    params = ScalingParams(min_replicas=2, max_replicas=4, target_waiting_requests=4, scrape_interval_seconds=5,
                           scale_up_stabilization_seconds=0, scale_down_delay_seconds=0)
    assert run([], 0, RouterLoad(held=1, in_flight=0), 1, params).desired_replicas == 2
    assert run(IDLE_POD * 2, 2, RouterLoad(0, 0), 30, params).desired_replicas == 2


def test_the_router_page_is_read_per_modelserver():
    metrics = RouterMetrics()
    metrics.queue_depth.labels("team-a/demo", "coder").set(2)
    metrics.in_flight.labels("team-a/demo", "coder").set(5)
    metrics.in_flight.labels("team-b/other", "other").set(1)
    queues = parse_router_queues(generate_latest(metrics.registry).decode())
    assert queues == {"team-a/demo": RouterLoad(2, 5), "team-b/other": RouterLoad(0, 1)}


async def test_an_unreachable_router_is_unknown():
    assert await router_load("team-a/demo", 1.0, url="http://127.0.0.1:9/metrics") is None
    assert await router_load("team-a/demo", 1.0, url=None) is None


def _keda_modelserver(min_replicas: int) -> dict:
    return {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer",
            "metadata": {"name": "coder", "namespace": "team-a", "uid": "u-1"},
            "spec": {"model": {"uri": "hf://acme/coder-1b"}, "replicas": 0,
                     "scaling": {"mode": "keda", "minReplicas": min_replicas, "maxReplicas": 4,
                                 "targetWaitingRequests": 2}}}


def test_keda_at_min_zero_activates_on_the_routers_queue():
    import json
    from pathlib import Path

    import jsonschema

    from pagoda.operator.autoscaler.manifests import build_autoscaler

    schema = json.loads((Path(__file__).parents[1] / "operator" / "data" / "keda-scaledobject.schema.json")
                        .read_text())
    (scaled,) = build_autoscaler(_keda_modelserver(0))
    jsonschema.validate(scaled, schema, cls=jsonschema.Draft7Validator)
    assert scaled["spec"]["minReplicaCount"] == 0
    pods, router = scaled["spec"]["triggers"]
    assert pods["metadata"]["query"].startswith("sum(vllm:num_requests_waiting")
    assert router["metadata"] == {
        "serverAddress": pods["metadata"]["serverAddress"],
        "query": '(sum(pagoda_router_queue_depth{model_server="team-a/coder"}) or vector(0))'
                 ' + (sum(pagoda_router_in_flight_requests{model_server="team-a/coder"}) or vector(0))',
        "threshold": "2",
        "activationThreshold": "0",
    }
    # The query names the series the router really exports.
    metrics = RouterMetrics()
    metrics.queue_depth.labels("team-a/coder", "acme/coder-1b").set(1)
    page = generate_latest(metrics.registry).decode()
    assert 'pagoda_router_queue_depth{model="acme/coder-1b",model_server="team-a/coder"} 1.0' in page
    (with_floor,) = build_autoscaler(_keda_modelserver(1))
    assert len(with_floor["spec"]["triggers"]) == 1
