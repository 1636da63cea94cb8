"""An in-process Kubernetes API (kmock) that behaves like a real server where kopf and the
reconcile rely on it, and a way to run the operator against it."""

from __future__ import annotations

import contextvars
import datetime
import itertools
import uuid

import attrs
import kmock
import kubernetes
import pytest
import yaml

# The resync interval (0.5 s) is set suite-wide in tests/conftest.py: the handlers read it at import.

RESOURCES = {
    "pagoda.dev/v1alpha1/modelservers": kmock.ResourceInfo(
        kind="ModelServer",
        namespaced=True,
        subresources={"status", "scale"},
        verbs={"get", "list", "watch", "create", "patch", "delete"},
    ),
    "batch/v1/jobs": kmock.ResourceInfo(
        kind="Job",
        namespaced=True,
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "patch", "delete"},
    ),
    "apps/v1/deployments": kmock.ResourceInfo(
        kind="Deployment",
        namespaced=True,
        subresources={"status", "scale"},
        verbs={"get", "list", "watch", "create", "patch", "delete"},
    ),
    "v1/pods": kmock.ResourceInfo(kind="Pod", namespaced=True, verbs={"get", "list", "create"}),
    "v1/services": kmock.ResourceInfo(kind="Service", namespaced=True, verbs={"get", "create", "patch"}),
    "v1/persistentvolumeclaims": kmock.ResourceInfo(
        kind="PersistentVolumeClaim", namespaced=True, verbs={"get", "create", "patch", "delete"}
    ),
    "policy/v1/poddisruptionbudgets": kmock.ResourceInfo(
        kind="PodDisruptionBudget", namespaced=True, verbs={"get", "create", "patch"}
    ),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True, verbs={"create"}),
    "autoscaling/v2/horizontalpodautoscalers": kmock.ResourceInfo(
        kind="HorizontalPodAutoscaler", namespaced=True, verbs={"get", "list", "create", "patch", "delete"}
    ),
    # kopf's observers wait for namespaces and CRDs to be discoverable before anything else.
    "v1/namespaces": kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs={"list", "watch"}),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch"}
    ),
}


# The request kmock is choosing a reaction for, in the task that serves it (see ApiServer.__iter__).
_matching: contextvars.ContextVar = contextvars.ContextVar("matching", default=None)


class ApiServer(kmock.KubernetesEmulator):
    """kmock 0.8 stores objects as sent. A real API server also assigns uid, resourceVersion,
    creationTimestamp, a name from generateName, and bumps metadata.generation on spec changes;
    kopf and the reconcile both read those. It also keeps a log of creations, for the
    no-duplicates checks."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.versions = itertools.count(1)
        self.created: list[tuple[str, str, str]] = []
        self.calls: set[tuple[str, str, str, str]] = set()  # (user agent, group, resource, verb)

    def __iter__(self):
        # kmock picks the reaction for a request by testing `request in view` for each reaction,
        # and that walks every request recorded so far through the view's filters: quadratic over
        # a test (test_lifecycle's 600 requests took 20 s, nearly all of it here). No reaction here
        # slices or counts requests, so a filter's verdict on one request needs no other: while a
        # request is matched, the views see it alone. Everyone else (the tests' assertions, in
        # threads of their own context) sees every request.
        current = _matching.get()
        if current is not None:
            yield current
        else:
            yield from super().__iter__()

    def _record(self, request) -> None:
        if request.resource is None or not request.resource.plural:
            return  # API discovery, which needs no RBAC
        method = str(request.method.value if hasattr(request.method, "value") else request.method).upper()
        if method == "GET":
            verb = "watch" if request.params.get("watch") == "true" else "get" if request.name else "list"
        else:
            verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}[method]
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        self.calls.add((request.headers.get("User-Agent", ""), request.resource.group, resource, verb))

    async def _handle(self, request):
        self._record(request)
        if request.action == kmock.action.UPDATE and "apply-patch" in request.headers.get("Content-Type", ""):
            # Server-side apply creates a missing object; kmock knows only merge patches of live ones.
            key = (request.resource, request.namespace, request.name)
            if key not in self.objects or self.objects[key].deleted:
                created = attrs.evolve(request, action=kmock.action.CREATE, method=kmock.method.POST, name=None)
                # kmock matches its reactions to requests it recorded, by identity.
                index = next(i for i, r in enumerate(self._requests) if r is request)
                self._requests[index] = request = created
        if request.action == kmock.action.UPDATE and isinstance(request.data, list):
            # A JSON patch's "test" op that fails is a 422 (kopf's optimistic concurrency relies on it).
            key = (request.resource, request.namespace, request.name)
            live = self.objects[key] if key in self.objects else None
            for op in request.data:
                if (
                    op.get("op") == "test"
                    and op.get("path") == "/metadata/resourceVersion"
                    and live is not None
                    and not live.deleted
                    and live["metadata"].get("resourceVersion") != op.get("value")
                ):
                    raise kmock.KubernetesError(
                        status=422, reason="Invalid", message="resourceVersion test failed"
                    )
        if request.action == kmock.action.UPDATE and isinstance(request.data, list):
            request.data.append(
                {"op": "add", "path": "/metadata/resourceVersion", "value": str(next(self.versions))}
            )
        if request.resource is not None and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if request.action == kmock.action.CREATE:
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.setdefault("namespace", request.namespace)
                meta.update(
                    uid=str(uuid.uuid4()),
                    generation=1,
                    resourceVersion=str(next(self.versions)),
                    creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                )
                key = (request.resource, request.namespace or meta.get("namespace"), meta["name"])
                if key not in self.objects or self.objects[key].deleted:
                    self.created.append((request.resource.plural, key[1], meta["name"]))
            elif request.action == kmock.action.UPDATE:
                key = (request.resource, request.namespace, request.name)
                meta["resourceVersion"] = str(next(self.versions))
                if request.subresource is None and "spec" in request.data and key in self.objects:
                    live = self.objects[key]
                    if not live.deleted and live.get("spec") != request.data["spec"]:
                        meta["generation"] = (live["metadata"].get("generation") or 1) + 1
        token = _matching.set(request)
        try:
            return await super()._handle(request)
        finally:
            _matching.reset(token)

    def creations(self, plural: str) -> list[str]:
        return [name for p, _, name in self.created if p == plural]


@pytest.fixture()
async def apiserver(tmp_path, monkeypatch):
    async with ApiServer() as server, kmock.Server(server):
        for key, info in RESOURCES.items():
            server.resources[key] = info
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": str(server.url).rstrip("/")}}],
            "users": [{"name": "test", "user": {"token": "test"}}],
            "contexts": [
                {"name": "kmock", "context": {"cluster": "kmock", "user": "test", "namespace": "default"}}
            ],
            "current-context": "kmock",
        }
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        monkeypatch.setenv("KUBECONFIG", str(path))
        # kopf's login goes through the client library, which read KUBECONFIG when it was imported.
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        yield server
