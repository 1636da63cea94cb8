"""kopf handlers: thin wrappers that run the reconcile pass and post what it reports.

The handlers are sync on purpose: the official client blocks, and kopf runs sync handlers in its
thread pool, so the event loop stays free for watches.

Run with `pagoda operator` (see main.py) or `kopf run -m pagoda.operator.handlers`. The memo carries
the OperatorConfig and the Cluster; the startup handler fills in whatever the caller did not pass.
"""

from __future__ import annotations

import importlib
import logging
import random
from typing import Any

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from pagoda.operator import spec as s
from pagoda.operator.builders.meta import LABEL_MODELSERVER, MANAGED_BY
from pagoda.operator.config import current_config
from pagoda.operator.k8s import Cluster
from pagoda.operator.reconcile import cleanup, reconcile
from pagoda.operator.status import changed

# Read at import, because a kopf timer's interval is fixed when it is registered.
RESYNC_SECONDS = current_config().resync_seconds
CHILD_LABELS = {LABEL_MODELSERVER: kopf.PRESENT, "app.kubernetes.io/managed-by": MANAGED_BY}
AUTOSCALER_TIMER = "pagoda.operator.autoscaler.timer"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    if getattr(memo, "config", None) is None:
        memo.config = current_config()
    settings.persistence.finalizer = f"{s.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=s.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=s.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    # A deletion waits for the object's timers to exit; a sync timer mid-pass needs a moment, not
    # kopf's default minute between checks.
    settings.background.instant_exit_timeout = 0.5
    settings.background.cancellation_polling = 1
    # With --peering: a replica that dies without leaving is given up for dead after this long and a
    # standby takes over (OperatorConfig.peering_lifetime_seconds; kopf's default is a minute).
    settings.peering.lifetime = memo.config.peering_lifetime_seconds
    if getattr(memo, "cluster", None) is None:
        memo.cluster = Cluster.from_environment(timeout=memo.config.api_timeout_seconds)


# API errors worth retrying soon: a conflict (someone wrote first; re-read and go again), throttling,
# the API server's own trouble. One of them must not stall a ModelServer for kopf's default minute.
TRANSIENT = (409, 429, 500, 502, 503, 504)
RETRY_SECONDS = (0.5, 2.0)  # jittered, so that many objects failing together do not retry together


def retry_delay() -> float:
    return random.uniform(*RETRY_SECONDS)


def _run(memo: kopf.Memo, body: Any) -> None:
    """Reconcile, write the status if it changed, post the events."""
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return  # the deletion handler owns this object now
    try:
        outcome = reconcile(memo.cluster, memo.config, body)
        delta = changed(dict(body.get("status") or {}), outcome.status)
        if delta:
            # Only onto the version this pass read: a status written meanwhile (the autoscaler's
            # condition, another pass) makes this a 409 and the retry merges it, never erases it.
            try:
                memo.cluster.patch_status(
                    s.KIND, meta["namespace"], meta["name"], delta, resource_version=meta.get("resourceVersion")
                )
            except ApiException:
                # What the pass did (a Job created, a Deployment patched) happened all the same, and the
                # retry finds it done: say so now. A phase change is said by the pass that writes it.
                _post(body, [e for e in outcome.events if not e[1].startswith("Phase")])
                raise
    except ValueError as exc:  # a spec the CRD let through but the models reject
        kopf.warn(body, reason="InvalidSpec", message=str(exc)[:1000])
        raise kopf.PermanentError(str(exc)) from exc
    except ApiException as exc:
        if exc.status in TRANSIENT:
            raise kopf.TemporaryError(f"API {exc.status} {exc.reason}; retrying", delay=retry_delay()) from exc
        if exc.status == 404 and memo.cluster.get(s.KIND, meta["namespace"], meta["name"]) is None:
            return  # the ModelServer itself went meanwhile: nothing left to converge
        raise
    except (urllib3.exceptions.HTTPError, OSError) as exc:  # the API server unreachable for a moment
        raise kopf.TemporaryError(f"API unreachable ({exc}); retrying", delay=retry_delay()) from exc
    _post(body, outcome.events)


def _post(body: Any, events: list[tuple[str, str, str]]) -> None:
    for type_, reason, message in events:
        kopf.event(body, type=type_, reason=reason, message=message)


@kopf.on.resume(s.GROUP, s.VERSION, s.PLURAL, backoff=RETRY_SECONDS[1])
@kopf.on.create(s.GROUP, s.VERSION, s.PLURAL, backoff=RETRY_SECONDS[1])
@kopf.on.update(s.GROUP, s.VERSION, s.PLURAL, field="spec", backoff=RETRY_SECONDS[1])
def modelserver_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _run(memo, body)


@kopf.timer(s.GROUP, s.VERSION, s.PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A safety net for missed events, and the clock for the loader's retry backoff."""
    _run(memo, body)


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
def child_changed(body: kopf.Body, memo: kopf.Memo, type: str | None, **_: Any) -> None:
    """A loader Job finished or a Deployment's replicas moved: reconcile the owning ModelServer."""
    if type is None:  # the initial listing; resume handles those
        return
    meta = body.get("metadata") or {}
    parent = memo.cluster.get(s.KIND, meta.get("namespace"), (meta.get("labels") or {})[LABEL_MODELSERVER])
    if parent is not None:
        _run(memo, parent)


@kopf.on.delete(s.GROUP, s.VERSION, s.PLURAL, backoff=RETRY_SECONDS[1])
def modelserver_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    for type_, reason, message in cleanup(memo.cluster, body):
        kopf.event(body, type=type_, reason=reason, message=message)


def _register_autoscaler() -> None:
    """The autoscaler (a separate module) registers its own timer on import, if it is installed."""
    try:
        importlib.import_module(AUTOSCALER_TIMER)
    except ModuleNotFoundError as exc:
        if not (exc.name and AUTOSCALER_TIMER.startswith(exc.name)):
            raise


_register_autoscaler()
