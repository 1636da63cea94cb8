"""The few Kubernetes calls the reconcile makes, on the official client, with plain dicts throughout.

`ensure` is the idempotent create-or-patch: deterministic names make a second create a no-op (a 409
is read back as "already there"), and the `pagoda.dev/spec-hash` annotation means an unchanged
manifest is never patched, so a reconcile that runs twice (after an operator restart, or from two
watch events) writes nothing the second time.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Literal

import kubernetes
from kubernetes.client.exceptions import ApiException

from pagoda.operator import spec as s
from pagoda.operator.builders.meta import ANNOTATION_LAST_APPLIED, ANNOTATION_SPEC_HASH

MERGE_PATCH = "application/merge-patch+json"

# kind -> (API class, snake-case resource name in the client's method names)
TYPED: dict[str, tuple[str, str]] = {
    "PersistentVolumeClaim": ("CoreV1Api", "persistent_volume_claim"),
    "Service": ("CoreV1Api", "service"),
    "Pod": ("CoreV1Api", "pod"),
    "Deployment": ("AppsV1Api", "deployment"),
    "Job": ("BatchV1Api", "job"),
    "HorizontalPodAutoscaler": ("AutoscalingV2Api", "horizontal_pod_autoscaler"),
}
# Custom resources go through CustomObjectsApi: kind -> (group, version, plural).
CUSTOM: dict[str, tuple[str, str, str]] = {
    s.KIND: (s.GROUP, s.VERSION, s.PLURAL),
    "ScaledObject": ("keda.sh", "v1alpha1", "scaledobjects"),
}

Action = Literal["created", "patched", "unchanged"]


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns `old` into `new`: keys that `new` dropped become null,
    so a field removed from the spec (a nodeSelector entry, say) is removed from the live object."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    patch = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value)
    return patch


def spec_hash(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass(slots=True)
class Cluster:
    api: Any  # kubernetes.client.ApiClient

    @classmethod
    def from_environment(cls) -> Cluster:
        """In-cluster service account first, then KUBECONFIG / ~/.kube/config."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            # KUBECONFIG is read now, not when the client library was imported.
            path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
            kubernetes.config.load_kube_config(config_file=path, client_configuration=configuration)
        return cls(kubernetes.client.ApiClient(configuration))

    # -- raw verbs -----------------------------------------------------------------------------

    def _call(
        self,
        verb: str,
        kind: str,
        namespace: str,
        name: str | None = None,
        body: Any = None,
        status: bool = False,
        **kwargs: Any,
    ) -> dict | None:
        """One API call; the client's typed models are skipped (`_preload_content=False`)."""
        kwargs["_preload_content"] = False
        rest = [a for a in (name, body) if a is not None]
        if kind in CUSTOM:
            group, version, plural = CUSTOM[kind]
            api = kubernetes.client.CustomObjectsApi(self.api)
            verb = "get" if verb == "read" else verb
            fn = getattr(api, f"{verb}_namespaced_custom_object{'_status' if status else ''}")
            response = fn(group, version, namespace, plural, *rest, **kwargs)
        else:
            api_name, resource = TYPED[kind]
            fn = getattr(getattr(kubernetes.client, api_name)(self.api), f"{verb}_namespaced_{resource}")
            # The typed methods take the name before the namespace and the body after it.
            args = ([name] if name is not None else []) + [namespace] + ([body] if body is not None else [])
            response = fn(*args, **kwargs)
        data = response.read() if hasattr(response, "read") else response.data
        return json.loads(data) if data else None

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return self._call("read", kind, namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict]:
        """Objects with all these labels (checked here too, for servers that ignore the selector)."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        result = self._call("list", kind, namespace, label_selector=selector) or {}
        items = result.get("items") or []
        return [i for i in items if labels.items() <= ((i.get("metadata") or {}).get("labels") or {}).items()]

    def create(self, obj: dict) -> dict:
        meta = obj["metadata"]
        return self._call("create", obj["kind"], meta["namespace"], body=obj)

    def patch(self, kind: str, namespace: str, name: str, patch: dict) -> dict:
        return self._call("patch", kind, namespace, name, patch, _content_type=MERGE_PATCH)

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete with background propagation (a Job's pods go too); False if it was already gone."""
        try:
            self._call("delete", kind, namespace, name, propagation_policy="Background")
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def patch_status(self, kind: str, namespace: str, name: str, status: dict) -> dict:
        return self._call(
            "patch", kind, namespace, name, {"status": status}, status=True, _content_type=MERGE_PATCH
        )

    # -- idempotent apply ----------------------------------------------------------------------

    def ensure(self, desired: dict, *, update: bool = True) -> tuple[dict, Action]:
        """Create the object, or patch it when the manifest changed since the operator last wrote it.

        update=False for objects whose spec is immutable once created (PVC, Job): create only.
        """
        desired = json.loads(json.dumps(desired))
        digest = spec_hash(desired)
        # What the operator applied, kept on the object (as kubectl's last-applied annotation), so
        # the next patch can also remove what the new manifest no longer has.
        applied = json.dumps(desired, sort_keys=True, separators=(",", ":"))
        annotations = desired["metadata"].setdefault("annotations", {})
        annotations[ANNOTATION_SPEC_HASH] = digest
        annotations[ANNOTATION_LAST_APPLIED] = applied
        kind, meta = desired["kind"], desired["metadata"]
        live = self.get(kind, meta["namespace"], meta["name"])
        if live is None:
            try:
                return self.create(desired), "created"
            except ApiException as exc:
                if exc.status != 409:  # someone (our previous life) created it meanwhile
                    raise
                live = self.get(kind, meta["namespace"], meta["name"]) or {}
        live_hash = ((live.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
        if not update or live_hash == digest:
            return live, "unchanged"
        live_annotations = (live.get("metadata") or {}).get("annotations") or {}
        previous = json.loads(live_annotations.get(ANNOTATION_LAST_APPLIED) or "{}")
        # Objects written before the annotation existed get the plain patch, which adds and updates.
        patch = merge_patch(previous, desired) if previous else desired
        return self.patch(kind, meta["namespace"], meta["name"], patch), "patched"
