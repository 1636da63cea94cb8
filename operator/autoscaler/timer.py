"""The operator's own autoscaler: a kopf timer per ModelServer that scales it on its queue.

Each scrape interval it lists the ModelServer's ready pods by the Deployment's selector, scrapes
their /metrics over the pod IPs (scrape.py), asks the policy (policy.py) for desired replicas and,
when that differs, writes it through the ModelServer's scale subresource (spec.replicas). That
is the number the reconcile copies into the Deployment, and the one an HPA, KEDA or `kubectl scale`
would write too, so the modes share one source of truth and one writer of the Deployment's
replicas (the reconcile, which the change of spec wakes at once).

Status gets desiredReplicas, waitingRequests, lastScaleTime, the figures behind the decision under
`autoscaling`, and a ScalingActive condition with the policy's reason. Each change posts an Event.

handlers.py imports this module, and the import registers the timer. kopf fixes a timer's interval
at registration, so the timer ticks every OperatorConfig.autoscaler_tick_seconds (default 1, from
$PAGODA_AUTOSCALER_TICK_SECONDS) and each ModelServer acts only once its own
spec.scaling.scrapeIntervalSeconds has passed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from pagoda.operator import spec as s
from pagoda.operator.autoscaler.policy import Decision, ScalingParams, ScalingState, decide
from pagoda.operator.autoscaler.router_queue import router_load
from pagoda.operator.autoscaler.scrape import ready_targets, scrape_pods
from pagoda.operator.builders import meta
from pagoda.operator.config import OperatorConfig, current_config
from pagoda.operator.k8s import Cluster
from pagoda.operator.status import changed, merge_conditions

HANDLER_ID = "autoscaler"
CONDITION = "ScalingActive"
DELEGATED = {
    "hpa": ("DelegatedToHPA", "HorizontalPodAutoscaler"),
    "keda": ("DelegatedToKEDA", "ScaledObject"),
}


@dataclass(slots=True)
class Memory:
    """Per-ModelServer autoscaler memory, kept in kopf's per-object memo (lost on restart: the
    scale-down delay then counts afresh, which errs on the side of keeping replicas)."""

    state: ScalingState = field(default_factory=ScalingState)
    last_tick: float | None = None


def _iso_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_replicas(cluster: Cluster, ms: s.ModelServer, replicas: int) -> None:
    """spec.replicas through the ModelServer's /scale. The reconcile, woken by that change of the
    spec, is the one writer of the Deployment's replicas."""
    cluster.scale(s.KIND, ms.namespace, ms.name, replicas)


def status_patch(ms: s.ModelServer, current: dict, decision: Decision, now: str, scaled: bool) -> dict:
    """The status fields the autoscaler owns, merged with the conditions others own."""
    f = decision.figures
    condition = (CONDITION, "True" if decision.active else "False", decision.reason, decision.message)
    status: dict[str, Any] = {
        "desiredReplicas": decision.desired_replicas,
        "autoscaling": {"mode": "operator", "reason": decision.reason, **f.as_status()},
        "conditions": merge_conditions(current.get("conditions") or [], [condition], now, ms.generation),
    }
    if f.known_replicas:
        status["waitingRequests"] = f.waiting_requests
    if scaled:
        status["lastScaleTime"] = now
    return status


def delegated_patch(ms: s.ModelServer, current: dict, now: str) -> dict:
    """In hpa/keda mode the operator only says who scales; that object's status has the figures."""
    reason, kind = DELEGATED[ms.spec.scaling.mode]
    condition = (CONDITION, "Unknown", reason, f"scaled by {kind} {ms.name}; see its status")
    return {
        "autoscaling": {"mode": ms.spec.scaling.mode},
        "conditions": merge_conditions(current.get("conditions") or [], [condition], now, ms.generation),
    }


def fixed_patch(ms: s.ModelServer, current: dict, now: str) -> dict:
    """minReplicas == maxReplicas (the default) means "not autoscaled": spec.replicas stands."""
    message = f"fixed at spec.replicas={ms.spec.replicas}; set scaling.maxReplicas above minReplicas to autoscale"
    condition = (CONDITION, "False", "FixedReplicas", message)
    return {
        "autoscaling": {"mode": "fixed"},
        "conditions": merge_conditions(current.get("conditions") or [], [condition], now, ms.generation),
    }


async def autoscale(body: kopf.Body, memo: kopf.Memo, logger: Any, tick: float) -> None:
    """One tick for one ModelServer; it acts once per scrape interval (to within half a tick)."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return
    try:
        ms = s.ModelServer.from_body(body)
    except ValueError:
        return  # a spec the models reject: the reconcile reports it (InvalidSpec), once
    params = ScalingParams.from_model(ms)
    memory: Memory = getattr(memo, "autoscaler", None) or Memory()
    memo.autoscaler = memory
    clock = time.monotonic()
    if memory.last_tick is not None and clock - memory.last_tick < params.scrape_interval_seconds - tick / 2:
        return
    memory.last_tick = clock

    cluster: Cluster = memo.cluster
    current = dict(body.get("status") or {})
    now = _iso_now()
    if ms.spec.scaling.mode != "operator":
        await _patch_status(cluster, ms, current, delegated_patch(ms, current, now))
        return
    if ms.spec.scaling.min_replicas >= ms.spec.scaling.max_replicas:
        await _patch_status(cluster, ms, current, fixed_patch(ms, current, now))
        return

    pods = await asyncio.to_thread(cluster.list, "Pod", ms.namespace, meta.selector_labels(ms))
    config: OperatorConfig = getattr(memo, "config", None) or current_config()
    timeout = min(config.scrape_timeout_seconds, params.scrape_interval_seconds)
    loads = await scrape_pods(ready_targets(pods), timeout=timeout)
    # Only minReplicas 0 needs the router's queue: it is what wakes a ModelServer at zero.
    key = f"{ms.namespace}/{ms.name}"
    router = await router_load(key, timeout, config.router_metrics_url) if params.min_replicas == 0 else None
    decision = decide(loads, ms.spec.replicas, params, memory.state, clock, router=router)
    memory.state = decision.state

    scaled = decision.desired_replicas != ms.spec.replicas
    if scaled:
        await asyncio.to_thread(write_replicas, cluster, ms, decision.desired_replicas)
        direction = "Up" if decision.desired_replicas > ms.spec.replicas else "Down"
        logger.info(f"autoscaler: {decision.reason}: {decision.message}")
        kopf.event(body, type="Normal", reason=f"Scaled{direction}", message=decision.message)
    await _patch_status(cluster, ms, current, status_patch(ms, current, decision, now, scaled))


async def _patch_status(cluster: Cluster, ms: s.ModelServer, current: dict, status: dict) -> None:
    """Onto the version read (a 409 otherwise): conditions the reconcile wrote meanwhile are kept,
    as the next tick merges into them."""
    delta = changed(current, status)
    if delta:
        version = ms.metadata.get("resourceVersion")
        try:
            await asyncio.to_thread(
                cluster.patch_status, s.KIND, ms.namespace, ms.name, delta, resource_version=version
            )
        except ApiException as exc:
            if exc.status != 409:
                raise


def register(registry: kopf.OperatorRegistry | None = None, interval: float | None = None) -> None:
    """Register the timer (kopf's default registry unless given: tests bring their own), ticking
    every `interval` seconds (default: the installed OperatorConfig's)."""
    interval = interval or current_config().autoscaler_tick_seconds

    async def autoscaler_tick(body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
        await autoscale(body, memo, logger, tick=interval)

    kopf.timer(
        s.GROUP, s.VERSION, s.PLURAL,
        id=HANDLER_ID,
        interval=interval,
        # A failed tick (the API server unreachable, say) is retried on the next tick, not after
        # kopf's default minute of backoff: the queue does not wait.
        backoff=max(interval, 1.0),
        registry=registry,
    )(autoscaler_tick)  # fmt: skip


register()
