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
    metadata = meta.object_meta(ms, meta.cache_claim_name(ms), meta.CACHE_COMPONENT, owned=False)
    # A retained cache has no owner: the garbage collector must not take weights that took an
    # hour to fetch. One that goes with the ModelServer is owned, so that a claim created after the
    # ModelServer went (a pass still in flight during the deletion) is collected, not orphaned.
    if not cache.retain_on_delete and ms.uid:
        metadata["ownerReferences"] = [cache_owner_reference(ms)]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def cache_owner_reference(ms: ModelServer) -> dict:
    # Not blocking: foreground deletion of the ModelServer need not wait for the volume to go.
    import kopf

    return dict(kopf.build_owner_reference(meta.owner_body(ms), controller=False, block_owner_deletion=False))
