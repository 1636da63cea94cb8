"""The PodDisruptionBudget of the serving pods: a node drain takes them one at a time."""

from __future__ import annotations

from pagoda.operator.builders import meta
from pagoda.operator.spec import ModelServer


def build_pdb(ms: ModelServer) -> dict:
    # maxUnavailable, not minAvailable: a lone replica can still be drained (a budget of
    # minAvailable 1 would block every drain of its node), and several go down one by one.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta.object_meta(ms, ms.name, meta.SERVER_COMPONENT),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": meta.selector_labels(ms)},
            # A pod that never became ready protects nothing: evict it rather than block the drain.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
