"""The few Kubernetes calls the reconcile makes, on the official client, with plain dicts throughout.

`ensure` is server-side apply with the operator's field manager, forced: the API server keeps the
fields the operator owns equal to its manifest (a live edit of one of them is reverted on the next
pass, a field dropped from the manifest is removed), leaves fields others own alone, and writes
nothing when nothing changed, so a pass that runs twice (after a restart, or from two watch events)
changes nothing the second time.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Literal

import kubernetes
from kubernetes.client.exceptions import ApiException

from pagoda.operator import spec as s

MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "pagoda-operator"

# kind -> (API class, snake-case resource name in the client's method names)
TYPED: dict[str, tuple[str, str]] = {
    "PersistentVolumeClaim": ("CoreV1Api", "persistent_volume_claim"),
    "Service": ("CoreV1Api", "service"),
    "Pod": ("CoreV1Api", "pod"),
    "Deployment": ("AppsV1Api", "deployment"),
    "Job": ("BatchV1Api", "job"),
    "HorizontalPodAutoscaler": ("AutoscalingV2Api", "horizontal_pod_autoscaler"),
    "PodDisruptionBudget": ("PolicyV1Api", "pod_disruption_budget"),
}
# Custom resources go through CustomObjectsApi: kind -> (group, version, plural).
CUSTOM: dict[str, tuple[str, str, str]] = {
    s.KIND: (s.GROUP, s.VERSION, s.PLURAL),
    "ScaledObject": ("keda.sh", "v1alpha1", "scaledobjects"),
    "InferencePool": ("inference.networking.k8s.io", "v1", "inferencepools"),
}

Action = Literal["created", "patched", "unchanged"]


@dataclass(slots=True)
class Cluster:
    api: Any  # kubernetes.client.ApiClient
    timeout: float | None = 30.0  # seconds per API call (see OperatorConfig.api_timeout_seconds)

    @classmethod
    def from_environment(cls, timeout: float | None = 30.0) -> Cluster:
        """In-cluster service account first, then KUBECONFIG / ~/.kube/config."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            # KUBECONFIG is read now, not when the client library was imported.
            path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
            kubernetes.config.load_kube_config(config_file=path, client_configuration=configuration)
        return cls(kubernetes.client.ApiClient(configuration), timeout)

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
        kwargs.setdefault("_request_timeout", self.timeout)
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

    def scale(self, kind: str, namespace: str, name: str, replicas: int) -> dict:
        """spec.replicas through the scale subresource (a Deployment's, or a ModelServer's)."""
        body = {"spec": {"replicas": replicas}}
        if kind in CUSTOM:
            group, version, plural = CUSTOM[kind]
            api = kubernetes.client.CustomObjectsApi(self.api)
            response = api.patch_namespaced_custom_object_scale(
                group, version, namespace, plural, name, body, _content_type=MERGE_PATCH, _preload_content=False,
                _request_timeout=self.timeout,
            )
        else:
            api = kubernetes.client.AppsV1Api(self.api)
            response = api.patch_namespaced_deployment_scale(
                name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False,
                _request_timeout=self.timeout,
            )
        return json.loads(response.read() or b"{}")

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete with background propagation (a Job's pods go too); False if it was already gone."""
        try:
            self._call("delete", kind, namespace, name, propagation_policy="Background")
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def patch_status(
        self, kind: str, namespace: str, name: str, status: dict, resource_version: str | None = None
    ) -> dict:
        """A merge patch of the status; with resource_version, only onto that version of the object
        (409 Conflict otherwise), so two writers never overwrite each other's conditions unseen."""
        body: dict = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self._call("patch", kind, namespace, name, body, status=True, _content_type=MERGE_PATCH)

    # -- idempotent apply ----------------------------------------------------------------------

    def apply(self, desired: dict) -> dict:
        """Server-side apply of the whole manifest as FIELD_MANAGER (created if missing)."""
        meta = desired["metadata"]
        return self._call(
            "patch", desired["kind"], meta["namespace"], meta["name"], desired,
            _content_type=APPLY_PATCH, field_manager=FIELD_MANAGER, force=True,
        )  # fmt: skip

    def ensure(self, desired: dict, *, update: bool = True) -> tuple[dict, Action]:
        """Apply the manifest (see the module's docstring), creating the object if missing.

        update=False for objects whose spec is immutable once created (PVC, Job): create only.
        """
        desired = json.loads(json.dumps(desired))
        kind, meta = desired["kind"], desired["metadata"]
        live = self.get(kind, meta["namespace"], meta["name"])
        if not update:
            if live is not None:
                return live, "unchanged"
            try:
                return self.create(desired), "created"
            except ApiException as exc:
                if exc.status != 409:  # someone (our previous life) created it meanwhile
                    raise
                return self.get(kind, meta["namespace"], meta["name"]) or {}, "unchanged"
        applied = self.apply(desired)
        if live is None:
            return applied, "created"
        # The API server writes nothing (and keeps the resourceVersion) when the apply changes nothing.
        version = (live.get("metadata") or {}).get("resourceVersion")
        same = version is not None and (applied.get("metadata") or {}).get("resourceVersion") == version
        return applied, "unchanged" if same else "patched"
