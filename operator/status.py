"""ModelServer status from what the reconcile observed: phase, conditions, counts, endpoint.

Pure functions. Conditions this module does not own (the autoscaler's `ScalingActive`) are carried
over untouched, and a condition's lastTransitionTime moves only when its status flips.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pagoda.operator.builders import meta
from pagoda.operator.spec import ModelServer
from pagoda.operator.status_schema import CacheStatus, LoaderStatus, PlanStatus

CacheState = Literal["ready", "loading", "failed", "reloading", "reload-failed"]
OWNED_CONDITIONS = ("CacheReady", "CacheSizeSufficient", "Available", "Progressing")


@dataclass(slots=True)
class Observation:
    cache: CacheStatus
    loader: LoaderStatus
    plan: PlanStatus | None
    cache_state: CacheState
    cache_message: str
    deployment: dict | None  # the live Deployment, when there is one
    endpoint: str | None
    rejected: str | None = None  # the API server's word on a serving object it refused
    cache_size: tuple[str, str, str, str] | None = None  # cache_size.check's condition, when known
    inference_pool: tuple[str, str, str, str] | None = None  # inference_pool's condition, when asked for


@dataclass(slots=True)
class Rollout:
    desired: int
    replicas: int
    ready: int
    updated: int
    current: bool  # the Deployment controller has seen its latest spec
    deadline_exceeded: bool

    @property
    def complete(self) -> bool:
        return self.current and self.updated >= self.desired and self.ready >= self.desired


def rollout(ms: ModelServer, deployment: dict | None) -> Rollout | None:
    if deployment is None:
        return None
    st = deployment.get("status") or {}
    generation = (deployment.get("metadata") or {}).get("generation")
    current = generation is None or (st.get("observedGeneration") or 0) >= generation
    deadline = any(
        c.get("type") == "Progressing"
        and c.get("status") == "False"
        and c.get("reason") == "ProgressDeadlineExceeded"
        for c in st.get("conditions") or []
    )
    return Rollout(
        desired=ms.spec.replicas,
        replicas=st.get("replicas") or 0,
        ready=st.get("readyReplicas") or 0,
        updated=st.get("updatedReplicas") or 0,
        current=current,
        deadline_exceeded=deadline,
    )


def _phase(obs: Observation, ro: Rollout | None) -> tuple[str, str]:
    if obs.rejected:
        return "Failed", obs.rejected
    if obs.cache_state in ("failed", "reload-failed"):
        return "Failed", obs.cache_message
    if obs.cache_state in ("loading", "reloading"):
        return "Loading", obs.cache_message
    if ro is None:
        return "Starting", "creating the Deployment"
    if ro.deadline_exceeded:
        return "Failed", "the Deployment exceeded its progress deadline"
    if ro.complete:
        return "Ready", f"{ro.ready}/{ro.desired} replicas ready"
    return "Starting", f"{ro.ready}/{ro.desired} replicas ready"


def _conditions(obs: Observation, ro: Rollout | None, phase: str) -> list[tuple[str, str, str, str]]:
    cache_reason = {
        "ready": "Loaded",
        "loading": "Loading",
        "reloading": "Reloading",
        "failed": "LoaderFailed",
        "reload-failed": "LoaderFailed",
    }[obs.cache_state]
    cache = ("CacheReady", "True" if obs.cache_state == "ready" else "False", cache_reason, obs.cache_message)
    if ro is None:
        available = ("Available", "False", "NoDeployment", "the Deployment is not created yet")
    elif ro.ready >= ro.desired:
        reason = "ScaledToZero" if ro.desired == 0 else "MinimumReplicasAvailable"
        available = ("Available", "True", reason, f"{ro.ready}/{ro.desired} replicas ready")
    else:
        available = ("Available", "False", "ReplicasNotReady", f"{ro.ready}/{ro.desired} replicas ready")
    if obs.rejected:
        progressing = ("Progressing", "False", "Rejected", obs.rejected)
    elif phase == "Failed":
        progressing = (
            "Progressing",
            "False",
            "Failed",
            obs.cache_message if ro is None or not ro.deadline_exceeded else "ProgressDeadlineExceeded",
        )
    elif phase == "Ready":
        progressing = ("Progressing", "False", "Complete", "the rollout is complete")
    else:
        progressing = (
            "Progressing",
            "True",
            "Loading" if phase == "Loading" else "RollingOut",
            obs.cache_message if phase == "Loading" else "waiting for replicas to become ready",
        )
    optional = [c for c in (obs.inference_pool,) if c]
    return [cache, *([obs.cache_size] if obs.cache_size else []), available, progressing, *optional]


def merge_conditions(
    existing: list[dict], updates: list[tuple[str, str, str, str]], now: str, generation: int | None
) -> list[dict]:
    by_type = {c["type"]: dict(c) for c in existing}
    for type_, status, reason, message in updates:
        old = by_type.get(type_)
        changed = old is None or old.get("status") != status
        by_type[type_] = {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),
            **({"observedGeneration": generation} if generation is not None else {}),
        }
    order = [*OWNED_CONDITIONS, *(t for t in by_type if t not in OWNED_CONDITIONS)]
    return [by_type[t] for t in order if t in by_type]


def compute_status(ms: ModelServer, obs: Observation, now: str) -> dict:
    """The status to write, as a merge patch (camelCase, None values left out)."""
    ro = rollout(ms, obs.deployment)
    phase, message = _phase(obs, ro)
    existing = [c.model_dump(by_alias=True, exclude_none=True) for c in ms.status.conditions or []]
    status = {
        "phase": phase,
        "message": message,
        "conditions": merge_conditions(existing, _conditions(obs, ro, phase), now, ms.generation),
        "replicas": ro.replicas if ro else 0,
        "readyReplicas": ro.ready if ro else 0,
        "endpoint": obs.endpoint,
        "observedGeneration": ms.generation,
        "selector": meta.selector_string(ms),
        # None values stay: in a merge patch they delete what an earlier pass wrote.
        "cache": obs.cache.model_dump(by_alias=True),
        "loader": obs.loader.model_dump(by_alias=True),
    }
    if obs.plan is not None:
        status["plan"] = obs.plan.model_dump(by_alias=True)
    return {k: v for k, v in status.items() if v is not None}


def _pruned(value):
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    return value


def changed(current: dict, desired: dict) -> dict:
    """The part of desired that differs from current (so an unchanged status is never written).
    A None in desired means "absent", as it does in the merge patch."""
    return {k: v for k, v in desired.items() if _pruned(current.get(k)) != _pruned(v)}
