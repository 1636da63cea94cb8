"""Apply (or skip, or remove) a ModelServer's InferencePool, and say which in its condition.

The InferencePool CRD belongs to the Gateway API Inference Extension, which many clusters lack:
there the operator writes nothing, and the condition and a Warning say why, so that asking for a
pool is never silently ignored. It tries again on every pass, so installing the CRD later is
enough.
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from pagoda.operator.builders import meta
from pagoda.operator.builders.inference_pool import COMPONENT, GROUP, KIND, VERSION, build_inference_pool
from pagoda.operator.k8s import Cluster
from pagoda.operator.spec import ModelServer

CONDITION = "InferencePoolReady"
Condition = tuple[str, str, str, str]


def _had_condition(ms: ModelServer, reason: str | None = None) -> bool:
    return any(c.type == CONDITION and reason in (None, c.reason) for c in ms.status.conditions or [])


def apply_inference_pool(cluster: Cluster, ms: ModelServer, events: list) -> Condition | None:
    """The InferencePoolReady condition, or None when no pool is asked for nor ever was."""
    desired = build_inference_pool(ms)
    if desired is None:
        if not _had_condition(ms):
            return None
        _remove(cluster, ms)
        return (CONDITION, "False", "Disabled", "routing.inferencePool is false")
    try:
        _, action = cluster.ensure(desired)
    except ApiException as exc:
        if exc.status != 404:
            raise
        # The namespace exists (the ModelServer lives in it): a 404 here is the missing resource type.
        message = (f"the cluster has no {KIND} CRD ({GROUP}/{VERSION}); install the Gateway API Inference "
                   "Extension's CRDs for routing.inferencePool to take effect")  # fmt: skip
        # Warned when it is news (the first pass to find it missing, or a new spec), not per resync.
        if not _had_condition(ms, "CRDNotInstalled") or ms.status.observed_generation != ms.generation:
            events.append(("Warning", "InferencePoolCRDMissing", message))
        return (CONDITION, "False", "CRDNotInstalled", message)
    if action != "unchanged":
        events.append(("Normal", f"InferencePool{action.title()}", f"{KIND} {ms.name} {action}"))
    picker = ms.spec.routing.endpoint_picker_ref
    if picker is None:
        return (CONDITION, "True", "NoEndpointPicker",
                f"{KIND} {ms.name} selects the serving pods; it names no endpoint picker "
                "(routing.endpointPickerRef), which Gateway implementations need to route to it")  # fmt: skip
    return (CONDITION, "True", "Applied", f"{KIND} {ms.name} selects the serving pods; endpoint picker {picker.name}")


def _remove(cluster: Cluster, ms: ModelServer) -> None:
    try:
        for pool in cluster.list(KIND, ms.namespace, meta.labels(ms, COMPONENT)):
            cluster.delete(KIND, ms.namespace, pool["metadata"]["name"])
    except ApiException as exc:
        if exc.status != 404:  # no CRD: nothing of that kind to remove
            raise
