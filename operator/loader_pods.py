"""What the loader Job's pods report through their container statuses: the plan's figures (the
plan container's termination message) and, when the Job failed, the cause (the download's or
the plan's termination message). Read from the pods' status, so no log access and no extra RBAC."""

from __future__ import annotations

import json

from pagoda.operator.builders.loader_job import DOWNLOAD_CONTAINER, PLAN_CONTAINER, plan_memory_gib
from pagoda.operator.k8s import Cluster
from pagoda.operator.spec import ModelServer
from pagoda.operator.status_schema import PlanStatus

# Enough for the cause in a condition and an event (the download writes at most 1000 characters).
CAUSE_CHARS = 1000


def _pods_newest_first(cluster: Cluster, ms: ModelServer, job: dict) -> list[dict]:
    pods = cluster.list("Pod", ms.namespace, {"job-name": job["metadata"]["name"]})
    return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True)


def read_plan(cluster: Cluster, ms: ModelServer, job: dict) -> PlanStatus:
    """`pagoda plan --json` output, from the plan container's termination message."""
    gib, assumed = plan_memory_gib(ms)
    plan = PlanStatus(gpu_memory_gib=gib, message=f"assumed {gib:g} GiB per replica" if assumed else None)
    for pod in _pods_newest_first(cluster, ms, job):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") != PLAN_CONTAINER or terminated.get("exitCode") != 0:
                continue
            try:
                figures = json.loads(terminated.get("message") or "")
            except json.JSONDecodeError:
                continue
            keys = ("fits", "weight_bytes", "kv_bytes_per_token", "kv_capacity_tokens", "max_concurrent_seqs")
            return plan.model_copy(update={k: figures[k] for k in keys if k in figures})
    return plan.model_copy(update={"message": "no plan output found on the loader pod"})


def failure_cause(cluster: Cluster, ms: ModelServer, job: dict) -> str | None:
    """`container: message` of the newest loader pod whose download or plan container failed with
    a termination message (the Hub's refusal, a full volume, a folder with no model), or None."""
    for pod in _pods_newest_first(cluster, ms, job):
        status = pod.get("status") or {}
        for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            terminated = (cs.get("state") or {}).get("terminated") or {}
            message = " ".join((terminated.get("message") or "").split())
            if cs.get("name") in (DOWNLOAD_CONTAINER, PLAN_CONTAINER) and terminated.get("exitCode") and message:
                return f"{cs['name']}: {message}"[:CAUSE_CHARS]
    return None
