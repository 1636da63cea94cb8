"""Kubernetes discovery: ModelServers and the ready endpoints of their Services' EndpointSlices.

Two list-then-watch loops (the kubernetes client's Watch, each in a thread, since the client is
synchronous) hand every event to the event loop, which keeps the raw objects and recomputes the
affected group. Parsing is pure (`group_from_modelserver`, `endpoints_from_slices`) so tests feed
it real-shaped objects. A watch that ends or fails lists again: a 410 Gone means our
resourceVersion is too old, and anything else is retried after a pause.

The ModelServer's spec is parsed with the operator's own pydantic model (pure pydantic, no kopf), so
the router reads served names, aliases and defaults exactly as the operator and the CRD do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from pagoda.operator import spec as s
from pagoda.operator.builders.meta import served_name
from pagoda.router.discovery import Discovery
from pagoda.router.fleet import Endpoint, Fleet, GroupSpec

logger = logging.getLogger("pagoda.router")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MERGE_PATCH = "application/merge-patch+json"
WATCH_SECONDS = 300
RETRY_SECONDS = 2.0


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta['name']}"


def group_from_modelserver(obj: Mapping[str, Any]) -> GroupSpec:
    """The routing view of one ModelServer (ValueError if its spec does not parse)."""
    ms = s.ModelServer.from_body(obj)
    routing = ms.spec.routing
    return GroupSpec(
        key=key_of(obj),
        served_name=served_name(ms),
        aliases=tuple(routing.aliases),
        strategy=routing.load_balancing.strategy,
        prefix_char_length=routing.load_balancing.prefix_char_length,
        scale_from_zero_replicas=max(1, ms.spec.scaling.min_replicas),
        replicas=ms.spec.replicas,
    )


def endpoints_from_slices(slices: Iterable[Mapping[str, Any]], port_name: str = "http") -> tuple[Endpoint, ...]:
    """The ready, not terminating endpoints of a Service's EndpointSlices, as URLs on its `http` port.

    EndpointSlice's `ready` may be unset, which the API defines as ready; a terminating endpoint is
    left out even while it still serves, so no new request goes to a pod on its way out.
    """
    out = []
    for slc in slices:
        if slc.get("addressType") not in (None, "IPv4", "IPv6"):
            continue  # FQDN slices name hosts, not pods
        ports = slc.get("ports") or []
        port = next((p for p in ports if p.get("name") == port_name), ports[0] if ports else None)
        if not port or not port.get("port"):
            continue
        for ep in slc.get("endpoints") or []:
            conditions = ep.get("conditions") or {}
            if conditions.get("ready") is False or conditions.get("terminating") is True:
                continue
            for address in (ep.get("addresses") or [])[:1]:  # all addresses of an endpoint are one pod
                host = f"[{address}]" if ":" in address else address
                name = (ep.get("targetRef") or {}).get("name") or address
                out.append(Endpoint(f"http://{host}:{port['port']}", name))
    return tuple(out)


class KubernetesDiscovery(Discovery):
    def __init__(self, namespaces: list[str] | None = None, public_url: str | None = None,
                 api_client: kubernetes.client.ApiClient | None = None):
        # None watches every namespace with one watch per kind; else one watch per kind and namespace.
        self.namespaces: list[str | None] = list(namespaces) if namespaces else [None]
        self.public_url = public_url.rstrip("/") if public_url else None
        if api_client is None:
            try:
                kubernetes.config.load_incluster_config()
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config()
            api_client = kubernetes.client.ApiClient()
        self.api = api_client
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.discovery_api = kubernetes.client.DiscoveryV1Api(api_client)
        self.modelservers: dict[str, dict] = {}
        self.slices: dict[str, dict[str, dict]] = {}  # "ns/service" -> slice name -> slice
        self._synced = {(kind, ns): asyncio.Event() for kind in ("ModelServer", "EndpointSlice")
                        for ns in self.namespaces}
        self._stop = threading.Event()
        self._watches: dict[tuple[str, str | None], kubernetes.watch.Watch] = {}
        self._published: dict[str, dict] = {}

    # ---- the watches, in threads ----------------------------------------------------------------

    def _lister(self, kind: str, namespace: str | None) -> Callable:
        # Plain functions without docstrings: Watch then hands out raw dicts, as the listing is read.
        if kind == "ModelServer":
            if namespace:
                return lambda **kw: self.custom.list_namespaced_custom_object(s.GROUP, s.VERSION, namespace,
                                                                              s.PLURAL, **kw)
            return lambda **kw: self.custom.list_cluster_custom_object(s.GROUP, s.VERSION, s.PLURAL, **kw)
        if namespace:
            return lambda **kw: self.discovery_api.list_namespaced_endpoint_slice(
                namespace, label_selector=SERVICE_NAME_LABEL, **kw)
        return lambda **kw: self.discovery_api.list_endpoint_slice_for_all_namespaces(
            label_selector=SERVICE_NAME_LABEL, **kw)

    def _list_watch(self, kind: str, namespace: str | None, deliver: Callable) -> None:
        """List, hand over the whole listing, then watch from its resourceVersion; again on any end."""
        list_fn = self._lister(kind, namespace)
        while not self._stop.is_set():
            try:
                listing = json.loads(list_fn(_preload_content=False).data)
                deliver(kind, namespace, "LIST", listing.get("items") or [])
                version = (listing.get("metadata") or {}).get("resourceVersion")
                watch = kubernetes.watch.Watch()
                self._watches[kind, namespace] = watch
                for event in watch.stream(list_fn, resource_version=version, timeout_seconds=WATCH_SECONDS,
                                          allow_watch_bookmarks=True):
                    if self._stop.is_set():
                        watch.stop()
                        return
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        deliver(kind, namespace, event["type"], event["raw_object"])
            except ApiException as exc:
                if exc.status != 410:
                    logger.warning("router: watching %ss failed (%s); listing again", kind, exc.reason)
                    self._stop.wait(RETRY_SECONDS)
            except Exception as exc:  # a dropped connection, an API server restart
                logger.warning("router: watching %ss failed (%r); listing again", kind, exc)
                self._stop.wait(RETRY_SECONDS)

    # ---- on the event loop -----------------------------------------------------------------------

    def apply(self, fleet: Fleet, kind: str, event: str, obj: Any, namespace: str | None = None) -> None:
        """One watch event (or a whole LIST of `namespace`, None for all) into our copies and the fleet."""

        def listed(key: str) -> bool:
            return namespace is None or key.startswith(f"{namespace}/")

        if kind == "ModelServer":
            objects = obj if event == "LIST" else [obj]
            if event == "LIST":
                for key in {k for k in self.modelservers if listed(k)} - {key_of(o) for o in objects}:
                    self.modelservers.pop(key)
                    fleet.remove(key)
            for o in objects:
                key = key_of(o)
                if event == "DELETED":
                    self.modelservers.pop(key, None)
                    fleet.remove(key)
                    continue
                self.modelservers[key] = o
                try:
                    fleet.upsert(group_from_modelserver(o))
                except ValueError as exc:
                    logger.warning("router: ModelServer %s: spec not routable: %s", key, exc)
                    fleet.remove(key)
                    continue
                self._refresh(fleet, key)
        else:
            if event == "LIST":
                self.slices = {k: v for k, v in self.slices.items() if not listed(k)}
                for o in obj:
                    self._keep_slice(o)
                for key in {k for k in set(self.slices) | set(fleet.groups) if listed(k)}:
                    self._refresh(fleet, key)
            else:
                service = self._keep_slice(obj, deleted=event == "DELETED")
                if service:
                    self._refresh(fleet, service)
        self._synced[kind, namespace].set()

    def _keep_slice(self, obj: Mapping[str, Any], deleted: bool = False) -> str | None:
        meta = obj.get("metadata") or {}
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if not service:
            return None
        key = f"{meta.get('namespace') or 'default'}/{service}"
        slices = self.slices.setdefault(key, {})
        if deleted:
            slices.pop(meta["name"], None)
        else:
            slices[meta["name"]] = dict(obj)
        return key

    def _refresh(self, fleet: Fleet, key: str) -> None:
        # The operator names each ModelServer's Service after it, so the keys coincide.
        fleet.set_endpoints(key, endpoints_from_slices(self.slices.get(key, {}).values()))

    async def run(self, fleet: Fleet) -> None:
        loop = asyncio.get_running_loop()

        def deliver(kind, namespace, event, obj):
            loop.call_soon_threadsafe(self._deliver, fleet, kind, namespace, event, obj)

        threads = [threading.Thread(target=self._list_watch, args=(kind, ns, deliver), daemon=True,
                                    name=f"watch-{kind}-{ns or 'all'}")
                   for kind, ns in self._synced]
        for thread in threads:
            thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            self._stop.set()
            for watch in self._watches.values():
                # Closing the open response ends the thread's blocking read now, not at the next event.
                watch.stop()
                response = getattr(watch, "_resp", None)
                if response is not None:
                    response.close()
            for thread in threads:
                await asyncio.to_thread(thread.join, 5)

    def _deliver(self, fleet: Fleet, kind: str, namespace: str | None, event: str, obj: Any) -> None:
        self.apply(fleet, kind, event, obj, namespace)
        if self.public_url and kind == "ModelServer" and event != "DELETED":
            for o in obj if event == "LIST" else [obj]:
                key = key_of(o)
                if key in fleet.groups:
                    asyncio.get_running_loop().create_task(self._publish(o, fleet.groups[key].spec))

    async def wait_synced(self) -> None:
        for event in self._synced.values():
            await event.wait()

    # ---- writes ----------------------------------------------------------------------------------

    async def scale_from_zero(self, spec: GroupSpec) -> None:
        """spec.replicas through the ModelServer's /scale, unless it already asks for enough."""
        namespace, name = spec.key.split("/", 1)
        if spec.replicas is not None and spec.replicas >= spec.scale_from_zero_replicas:
            return  # replicas are asked for and starting; the hold waits for their endpoints
        body = {"spec": {"replicas": spec.scale_from_zero_replicas}}
        try:
            await asyncio.to_thread(self.custom.patch_namespaced_custom_object_scale, s.GROUP, s.VERSION,
                                    namespace, s.PLURAL, name, body, _content_type=MERGE_PATCH)
            logger.info("router: %s scaled from zero to %d", spec.key, spec.scale_from_zero_replicas)
        except ApiException as exc:
            logger.warning("router: scaling %s from zero failed: %s %s", spec.key, exc.status, exc.reason)

    def router_status(self, spec: GroupSpec) -> dict:
        return {"endpoint": f"{self.public_url}/v1", "model": spec.served_name, "aliases": list(spec.aliases),
                "strategy": spec.strategy}

    async def _publish(self, obj: Mapping[str, Any], spec: GroupSpec) -> None:
        """status.router: where to reach this ModelServer through the router, written when it changes."""
        want = self.router_status(spec)
        if (obj.get("status") or {}).get("router") == want or self._published.get(spec.key) == want:
            return
        self._published[spec.key] = want
        namespace, name = spec.key.split("/", 1)
        try:
            await asyncio.to_thread(self.custom.patch_namespaced_custom_object_status, s.GROUP, s.VERSION,
                                    namespace, s.PLURAL, name, {"status": {"router": want}},
                                    _content_type=MERGE_PATCH)
        except ApiException as exc:
            self._published.pop(spec.key, None)
            logger.warning("router: writing %s status.router failed: %s %s", spec.key, exc.status, exc.reason)
