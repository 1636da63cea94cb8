"""The Service in front of the serving pods: one named `http` port."""

from __future__ import annotations

from pagoda.operator.builders import meta
from pagoda.operator.spec import ModelServer


def build_service(ms: ModelServer) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta.object_meta(ms, ms.name, meta.SERVER_COMPONENT),
        "spec": {
            "type": ms.spec.service.type,
            "selector": meta.selector_labels(ms),
            "ports": [
                {"name": "http", "port": ms.spec.service.port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def endpoint(ms: ModelServer, cluster_domain: str = "svc") -> str:
    """The OpenAI base URL inside the cluster."""
    return f"http://{ms.name}.{ms.namespace}.{cluster_domain}:{ms.spec.service.port}/v1"
