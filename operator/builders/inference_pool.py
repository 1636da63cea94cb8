"""The Gateway API Inference Extension's InferencePool (inference.networking.k8s.io/v1) for a
ModelServer with `routing.inferencePool: true`: the serving pods, their port, and the endpoint
picker that scores them.

The endpoint picker (EPP) scrapes each pod's /metrics for the model server protocol's gauges
(vLLM's names, which the runtime exports: vllm:num_requests_waiting, vllm:num_requests_running,
vllm:kv_cache_usage_perc and vllm:cache_config_info's block_size and num_gpu_blocks); see
docs/router.md.
"""

from __future__ import annotations

from pagoda.operator.builders import meta
from pagoda.operator.builders.deployment import CONTAINER_PORT
from pagoda.operator.spec import ModelServer

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
KIND = "InferencePool"
PLURAL = "inferencepools"
COMPONENT = "inference-pool"


def build_inference_pool(ms: ModelServer) -> dict | None:
    """None unless asked for. Named like the ModelServer; it selects exactly the serving pods (the
    Deployment's selector) on the port the runtime listens on."""
    routing = ms.spec.routing
    if not routing.inference_pool:
        return None
    spec: dict = {
        "selector": {"matchLabels": meta.selector_labels(ms)},
        "targetPorts": [{"number": CONTAINER_PORT}],
    }
    picker = routing.endpoint_picker_ref
    if picker is not None:
        spec["endpointPickerRef"] = {
            "name": picker.name,
            "port": {"number": picker.port},
            "failureMode": picker.failure_mode,
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": meta.object_meta(ms, ms.name, COMPONENT),
        "spec": spec,
    }
