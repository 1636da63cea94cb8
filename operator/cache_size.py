"""Is `spec.cache.size` big enough for the model? The plan's weight bytes against the claim's request.

The loader's `pagoda plan` reports the weights' size; the claim was made before anyone knew it (at
the 100Gi default, or what the user wrote). A claim below the model may still have loaded, on a
volume larger than its request (many provisioners round up), and then fail on another cluster, on
a reload (old and new revisions side by side until the old one is pruned), or on a volume that is
exactly its request. So it is flagged, not refused: the pods keep serving, the condition says so,
and a Warning event names the field. KServe's LocalModelCache asks for `modelSize` and KubeAI's
cache profiles size volumes per profile; neither derives the size from the model, nor does this.
"""

from __future__ import annotations

from pagoda.operator.builders import meta
from pagoda.operator.gpus import quantity_gib
from pagoda.operator.spec import ModelServer
from pagoda.operator.status_schema import PlanStatus

CONDITION = "CacheSizeSufficient"
# Tokenizer, configs and the hub client's partial files ride beside the safetensors shards.
HEADROOM = 1.1
GIB = 2**30


def required_gib(weight_bytes: int) -> float:
    return weight_bytes * HEADROOM / GIB


def check(ms: ModelServer, plan: PlanStatus | None) -> tuple[str, str, str, str] | None:
    """The CacheSizeSufficient condition (type, status, reason, message), or None when unknown:
    no plan figures yet, or a claim whose size this ModelServer does not set (existingClaim, pvc://)."""
    if plan is None or not plan.weight_bytes or not meta.owns_cache_claim(ms):
        return None
    size = ms.spec.cache.size
    weights, needed = plan.weight_bytes / GIB, required_gib(plan.weight_bytes)
    if quantity_gib(size) >= needed:
        return (CONDITION, "True", "Sufficient",
                f"spec.cache.size {size} holds the model's {weights:.2f} GiB of weights (+{HEADROOM - 1:.0%})")  # fmt: skip
    return (
        CONDITION,
        "False",
        "CacheTooSmall",
        f"spec.cache.size {size} is below the model's {weights:.2f} GiB of weights plus {HEADROOM - 1:.0%} "
        f"headroom ({needed:.1f} GiB): raise spec.cache.size (the claim expands where its StorageClass "
        "allows); a volume of exactly that size cannot hold the model, nor a reload beside it",
    )
