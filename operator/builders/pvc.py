"""The warm model cache: one PersistentVolumeClaim per ModelServer (unless the spec names one)."""

from __future__ import annotations

from pagoda.operator.builders import meta
from pagoda.operator.spec import ModelServer


def build_cache_pvc(ms: ModelServer) -> dict | None:
    """The claim to create, or None when the weights live on a claim the user owns (or nowhere)."""
    if not meta.owns_cache_claim(ms):
        return None
    cache = ms.spec.cache
    spec: dict = {"accessModes": [cache.access_mode], "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class_name is not None:
        spec["storageClassName"] = cache.storage_class_name
    # No owner reference: the finalizer decides the claim's fate by retainOnDelete, and the garbage
    # collector must not take a cache that took an hour to fill.
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta.object_meta(ms, meta.cache_claim_name(ms), meta.CACHE_COMPONENT, owned=False),
        "spec": spec,
    }
