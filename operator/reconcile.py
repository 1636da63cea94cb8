"""One reconcile pass of a ModelServer: cache PVC -> loader Job -> Deployment + Service -> status.

Every kopf handler (create, update, resume, the resync timer, and events of the owned Jobs and
Deployments) runs this same pass. It reads the world, converges one step and returns the status to
write plus the events to post, so that running it twice in a row changes nothing the second time.
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import kopf
from kubernetes.client.exceptions import ApiException

from pagoda.operator import cache_size
from pagoda.operator.builders import meta
from pagoda.operator.builders.deployment import build_deployment
from pagoda.operator.builders.loader_job import build_loader_job
from pagoda.operator.builders.pdb import build_pdb
from pagoda.operator.builders.pvc import build_cache_pvc
from pagoda.operator.builders.service import build_service, endpoint
from pagoda.operator.config import OperatorConfig
from pagoda.operator.gpus import quantity_gib
from pagoda.operator.inference_pool import apply_inference_pool
from pagoda.operator.k8s import Cluster
from pagoda.operator.loader_pods import failure_cause, read_plan
from pagoda.operator.spec import ModelServer
from pagoda.operator.status import Observation, compute_status
from pagoda.operator.status_schema import CacheStatus, LoaderStatus

log = logging.getLogger(__name__)

AUTOSCALER_HOOK = "pagoda.operator.autoscaler.manifests"
AUTOSCALER_KINDS = ("HorizontalPodAutoscaler", "ScaledObject")


@dataclass(slots=True)
class Outcome:
    status: dict
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(ts: str) -> datetime:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def job_state(job: dict) -> tuple[str, str]:
    """("succeeded" | "failed" | "running", why) from the Job's status."""
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "succeeded", "the loader Job completed"
        if cond.get("type") == "Failed":
            return (
                "failed",
                f"loader Job failed: {cond.get('reason', 'Failed')}: {cond.get('message', '')}".rstrip(": "),
            )
    if status.get("succeeded"):
        return "succeeded", "the loader Job completed"
    return "running", "downloading the model into the cache"


def with_cause(message: str, loader: LoaderStatus) -> str:
    return f"{message}; the last attempt failed: {loader.last_error}" if loader.last_error else message


def backoff_seconds(config: OperatorConfig, failures: int) -> float:
    return min(config.retry_base_seconds * 2 ** max(failures - 1, 0), config.retry_max_seconds)


def _load_cache(
    cluster: Cluster, config: OperatorConfig, ms: ModelServer, now: datetime, events: list
) -> tuple:
    """Advance the loader for spec.model.uri. Returns (cache, loader, plan, state, message)."""
    uri = ms.spec.model.uri
    cache = ms.status.cache or CacheStatus()
    loader = ms.status.loader or LoaderStatus()
    plan = ms.status.plan
    claim = meta.cache_claim_name(ms)
    if cache.ready and cache.uri == uri:
        return cache, loader, plan, "ready", f"{uri} is loaded"
    if claim is None:  # cache disabled: each pod downloads for itself
        cache = CacheStatus(uri=uri, path=meta.model_uri(ms).mount_path, ready=True)
        return cache, LoaderStatus(), plan, "ready", "cache disabled; pods download at start"

    reloading = cache.ready  # an older model is loaded and still served meanwhile
    desired = build_loader_job(ms, config)
    name = desired["metadata"]["name"]
    job = cluster.get("Job", ms.namespace, name)
    if job is None:
        if loader.retry_after and now < _parse(loader.retry_after):
            msg = with_cause(f"loader failed {loader.failures}x; retrying after {loader.retry_after}", loader)
            return cache, loader, plan, "reload-failed" if reloading else "failed", msg
        job, action = cluster.ensure(desired, update=False)
        if action == "created":
            events.append(("Normal", "LoaderStarted", f"Job {name} loads {uri} into claim {claim}"))
    state, why = job_state(job)
    if state == "running":  # a retry says why the last attempt failed until it succeeds
        return cache, loader, plan, "reloading" if reloading else "loading", with_cause(why, loader)
    if state == "failed":
        uid = job["metadata"].get("uid") or name
        if loader.failed_job_uid != uid:
            # The Job says only that it gave up; its pods say why. Kept in the status, since the
            # failed Job (and its pods) go when the retry comes.
            cause = failure_cause(cluster, ms, job)
            failures = loader.failures + 1
            retry = now + timedelta(seconds=backoff_seconds(config, failures))
            loader = LoaderStatus(failures=failures, failed_job_uid=uid, retry_after=_iso(retry), last_error=cause)
            message = f"{why}: {cause or 'no cause reported'}; retry {failures} after {_iso(retry)}"
            events.append(("Warning", "LoaderFailed", message[:1000]))
        elif loader.retry_after and now >= _parse(loader.retry_after):
            cluster.delete("Job", ms.namespace, name)  # the next pass creates it afresh
            events.append(("Normal", "LoaderRetry", f"deleted failed Job {name} to retry"))
        return cache, loader, plan, "reload-failed" if reloading else "failed", with_cause(why, loader)
    plan = read_plan(cluster, ms, job)
    cache = CacheStatus(
        claim_name=claim, uri=uri, path=meta.model_uri(ms).mount_path, ready=True, job_name=name
    )
    fits = "" if plan.fits is None else (" (fits)" if plan.fits else " (does NOT fit the requested GPU)")
    events.append(("Normal" if plan.fits is not False else "Warning", "CacheReady", f"{uri} is loaded{fits}"))
    for old in cluster.list("Job", ms.namespace, meta.labels(ms, meta.LOADER_COMPONENT)):
        if old["metadata"]["name"] != name:
            cluster.delete("Job", ms.namespace, old["metadata"]["name"])
    return cache, LoaderStatus(), plan, "ready", f"{uri} is loaded"


def autoscaler_objects(ms: ModelServer, config: OperatorConfig) -> list[dict] | None:
    """The autoscaler's HPA / ScaledObject manifests, or None while that module does not exist."""
    try:
        module = importlib.import_module(AUTOSCALER_HOOK)
    except ModuleNotFoundError as exc:
        if exc.name and AUTOSCALER_HOOK.startswith(exc.name):
            return None
        raise
    objects = list(module.build_autoscaler(ms, config) or [])
    # kopf.adopt's parts, less its copying of the ModelServer's own labels onto the children.
    kopf.append_owner_reference(objects, owner=meta.owner_body(ms))
    kopf.adjust_namespace(objects, namespace=ms.namespace)
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(meta.labels(ms, "autoscaler"))
    return objects


def _apply_autoscaler(cluster: Cluster, config: OperatorConfig, ms: ModelServer, events: list) -> None:
    objects = autoscaler_objects(ms, config)
    if objects is None:
        return
    wanted = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for obj in objects:
        _, action = cluster.ensure(obj)
        if action != "unchanged":
            events.append(
                ("Normal", f"Autoscaler{action.title()}", f"{obj['kind']} {obj['metadata']['name']} {action}")
            )
    if ms.status.observed_generation == ms.generation:
        return  # the scaling mode can only have changed with the spec: nothing stale to prune
    for kind in AUTOSCALER_KINDS:
        try:
            live = cluster.list(kind, ms.namespace, {meta.LABEL_MODELSERVER: ms.name})
        except Exception:  # noqa: BLE001 - e.g. KEDA not installed: nothing of that kind to prune
            continue
        for obj in live:
            if (kind, obj["metadata"]["name"]) not in wanted:
                cluster.delete(kind, ms.namespace, obj["metadata"]["name"])


# The API server refuses these for good (a bad manifest, a forbidden field): retrying changes
# nothing until the spec does, so they become the status rather than an endless retry.
REJECTED = (400, 403, 422)


def api_message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body or "{}").get("message") or str(exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def _ensure_cache_claim(cluster: Cluster, ms: ModelServer, events: list) -> None:
    """Create the cache claim; later, grow it when cache.size grows, and keep its owner reference
    in step with retainOnDelete. Its other fields are immutable (the API server says so)."""
    pvc = build_cache_pvc(ms)
    if pvc is None:
        return
    name = pvc["metadata"]["name"]
    live, action = cluster.ensure(pvc, update=False)
    if action == "created":
        events.append(("Normal", "CacheClaimCreated", f"PersistentVolumeClaim {name}"))
        return
    patch: dict = {}
    owners = pvc["metadata"].get("ownerReferences") or []
    live_owners = [o for o in (live.get("metadata") or {}).get("ownerReferences") or [] if o.get("uid") == ms.uid]
    if owners != live_owners:
        patch["metadata"] = {"ownerReferences": owners or None}
    want = pvc["spec"]["resources"]["requests"]["storage"]
    have = ((live.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage", want)
    if quantity_gib(want) > quantity_gib(have):
        patch["spec"] = {"resources": {"requests": {"storage": want}}}
        events.append(("Normal", "CacheClaimExpanding", f"PersistentVolumeClaim {name}: {have} -> {want}"))
    elif quantity_gib(want) < quantity_gib(have):
        events.append(
            ("Warning", "CacheClaimNotShrunk", f"PersistentVolumeClaim {name} stays {have}: claims only grow")
        )
    if patch:
        cluster.patch("PersistentVolumeClaim", ms.namespace, name, patch)


def _follow_replicas(cluster: Cluster, ms: ModelServer, deployment: dict | None) -> dict | None:
    """While a reload runs (or after it failed) the old Deployment keeps serving, untouched but for
    its replica count: an autoscaler's or `kubectl scale`'s spec.replicas must not freeze."""
    if deployment is None or (deployment.get("spec") or {}).get("replicas") == ms.spec.replicas:
        return deployment
    cluster.scale("Deployment", ms.namespace, ms.name, ms.spec.replicas)
    return cluster.get("Deployment", ms.namespace, ms.name)


def _apply_serving(cluster: Cluster, config: OperatorConfig, ms: ModelServer, path: str, events: list):
    """The Deployment, Service and PodDisruptionBudget. Returns (live Deployment, rejection)."""
    deployment = None
    for desired in (build_deployment(ms, config, path), build_service(ms), build_pdb(ms)):
        kind = desired["kind"]
        try:
            live, action = cluster.ensure(desired)
        except ApiException as exc:
            if exc.status not in REJECTED:
                raise
            message = f"the API server rejected the {kind}: {api_message(exc)}"
            events.append(("Warning", f"{kind}Rejected", message[:1000]))
            return cluster.get("Deployment", ms.namespace, ms.name), message
        if action != "unchanged":
            events.append(("Normal", f"{kind}{action.title()}", f"{kind} {ms.name} {action}"))
        if kind == "Deployment":
            deployment = live
    return deployment, None


def reconcile(cluster: Cluster, config: OperatorConfig, body, now: datetime | None = None) -> Outcome:
    now = now or datetime.now(timezone.utc)
    ms = ModelServer.from_body(body)
    events: list[tuple[str, str, str]] = []

    _ensure_cache_claim(cluster, ms, events)
    cache, loader, plan, state, message = _load_cache(cluster, config, ms, now, events)
    deployment, rejected, pool = None, None, None
    if state == "ready":
        deployment, rejected = _apply_serving(cluster, config, ms, cache.path, events)
        if rejected is None:
            _apply_autoscaler(cluster, config, ms, events)
            pool = apply_inference_pool(cluster, ms, events)
    elif cache.ready:  # a reload is under way: the old Deployment keeps serving
        deployment = _follow_replicas(cluster, ms, cluster.get("Deployment", ms.namespace, ms.name))

    size = cache_size.check(ms, plan)
    # Warned once per finding: when the plan arrives (the pass that loads it) or the spec changes,
    # not on every resync.
    if size and size[1] == "False" and (plan is not ms.status.plan or ms.status.observed_generation != ms.generation):
        events.append(("Warning", size[2], size[3]))
    obs = Observation(
        cache=cache,
        loader=loader,
        plan=plan,
        cache_state=state,
        cache_message=message,
        deployment=deployment,
        endpoint=endpoint(ms, config.cluster_domain) if deployment is not None else None,
        rejected=rejected,
        cache_size=size,
        inference_pool=pool,
    )
    status = compute_status(ms, obs, _iso(now))
    old_phase = ms.status.phase
    if status["phase"] != old_phase:
        kind = "Warning" if status["phase"] == "Failed" else "Normal"
        events.append((kind, f"Phase{status['phase']}", status.get("message", "")))
    return Outcome(status=status, events=events)


def cleanup(cluster: Cluster, body) -> list[tuple[str, str, str]]:
    """On deletion: the owned objects go by owner reference; the cache PVC by retainOnDelete."""
    ms = ModelServer.from_body(body)
    if not meta.owns_cache_claim(ms):
        return []
    claim = meta.cache_claim_name(ms)
    if ms.spec.cache.retain_on_delete:
        return [("Normal", "CacheRetained", f"PersistentVolumeClaim {claim} kept (retainOnDelete)")]
    deleted = cluster.delete("PersistentVolumeClaim", ms.namespace, claim)
    return [("Normal", "CacheDeleted", f"PersistentVolumeClaim {claim} deleted")] if deleted else []
