"""The operator's own autoscaler: a kopf daemon per ModelServer that scales it on its queue.

Each scrape interval it lists the ModelServer's ready pods by the Deployment's selector, scrapes
their /metrics over the pod IPs (scrape.py), asks the policy (policy.py) for desired replicas and,
when that differs, writes it through the ModelServer's scale subresource (spec.replicas). That
is the number the reconcile copies into the Deployment, and the one an HPA, KEDA or `kubectl scale`
would write too, so the modes share one source of truth and one writer of the Deployment's
replicas (the reconcile, which the change of spec wakes at once).

Status gets desiredReplicas, waitingRequests, lastScaleTime, the figures behind the decision under
`autoscaling`, and a ScalingActive condition with the policy's reason. Each change posts an Event.

handlers.py imports this module, and the import registers the daemon. A daemon, unlike a timer,
reads its period from the object: it sleeps the ModelServer's own spec.scaling.scrapeIntervalSeconds
(read afresh from kopf's live body each time), keeps the policy's memory in a local variable (lost
on restart: the scale-down delay then counts afresh, which errs on the side of keeping replicas),
and kopf stops it when the ModelServer goes.

The policy's clock is time.monotonic unless the memo carries another (`memo.clock`, a callable
returning seconds): a test then holds and moves time itself instead of sleeping through the delays.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import kopf
import urllib3
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


def _iso_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def policy_clock(memo: kopf.Memo) -> Callable[[], float]:
    """The clock the policy's windows and delays are measured on (see the module docstring)."""
    return getattr(memo, "clock", None) or time.monotonic


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


async def autoscale(body: kopf.Body, memo: kopf.Memo, logger: Any, state: ScalingState) -> ScalingState:
    """One scrape-and-decide for one ModelServer; returns the policy's memory for the next one."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return state
    try:
        ms = s.ModelServer.from_body(body)
    except ValueError:
        return state  # a spec the models reject: the reconcile reports it (InvalidSpec), once
    params = ScalingParams.from_model(ms)
    clock = policy_clock(memo)()

    cluster: Cluster = memo.cluster
    current = dict(body.get("status") or {})
    now = _iso_now()
    if ms.spec.scaling.mode != "operator":
        await _patch_status(cluster, ms, current, delegated_patch(ms, current, now))
        return state
    if ms.spec.scaling.min_replicas >= ms.spec.scaling.max_replicas:
        await _patch_status(cluster, ms, current, fixed_patch(ms, current, now))
        return state

    pods = await asyncio.to_thread(cluster.list, "Pod", ms.namespace, meta.selector_labels(ms))
    config: OperatorConfig = getattr(memo, "config", None) or current_config()
    timeout = min(config.scrape_timeout_seconds, params.scrape_interval_seconds)
    loads = await scrape_pods(ready_targets(pods), timeout=timeout)
    # Only minReplicas 0 needs the router's queue: it is what wakes a ModelServer at zero.
    key = f"{ms.namespace}/{ms.name}"
    router = await router_load(key, timeout, config.router_metrics_url) if params.min_replicas == 0 else None
    decision = decide(loads, ms.spec.replicas, params, state, clock, router=router)

    scaled = decision.desired_replicas != ms.spec.replicas
    if scaled:
        await asyncio.to_thread(write_replicas, cluster, ms, decision.desired_replicas)
        direction = "Up" if decision.desired_replicas > ms.spec.replicas else "Down"
        logger.info(f"autoscaler: {decision.reason}: {decision.message}")
        kopf.event(body, type="Normal", reason=f"Scaled{direction}", message=decision.message)
    await _patch_status(cluster, ms, current, status_patch(ms, current, decision, now, scaled))
    return decision.state


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


def scrape_interval(body: kopf.Body) -> float:
    """The ModelServer's own period, from the live body (the CRD defaults and bounds it)."""
    scaling = (body.get("spec") or {}).get("scaling") or {}
    return float(scaling.get("scrapeIntervalSeconds") or s.ScalingSpec().scrape_interval_seconds)


async def run(body: kopf.Body, memo: kopf.Memo, logger: Any, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """The daemon: scrape and decide once per scrape interval, until kopf stops it."""
    state = ScalingState()
    while not stopped:
        started = time.monotonic()
        try:
            state = await autoscale(body, memo, logger, state)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            # The API server unreachable or refusing for a moment: the next interval tries again,
            # and the policy's memory (the scale-down delay) survives.
            logger.warning(f"autoscaler: {exc}; retrying in {scrape_interval(body):g}s")
        # One scrape per interval, start to start (a scrape takes at most the interval itself).
        await stopped.wait(max(scrape_interval(body) - (time.monotonic() - started), 0.05))


def register(registry: kopf.OperatorRegistry | None = None) -> None:
    """Register the daemon (kopf's default registry unless given: tests bring their own)."""
    kopf.daemon(
        s.GROUP, s.VERSION, s.PLURAL,
        id=HANDLER_ID,
        # Anything else that escapes is a bug: kopf restarts the daemon soon, not after its minute.
        backoff=1.0,
        # run() leaves at the next stopped.wait(); a scrape in flight takes at most its timeout.
        cancellation_timeout=5.0,
        registry=registry,
    )(run)  # fmt: skip


register()
