"""ModelServer specs the CRD must refuse, and the field each refusal must name: checked with
cel-python against the generated CRD (tests/operator) and by the real API server (tests/kube)."""

from __future__ import annotations


def minimal() -> dict:
    return {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {"model": {"uri": "hf://Qwen/Qwen2.5-0.5B-Instruct"}},
    }


BROKEN = {
    "uri-scheme": (lambda s: s["model"].update(uri="s3://bucket/model"), "model.uri"),
    "uri-no-name": (lambda s: s["model"].update(uri="hf://justorg"), "model.uri"),
    "min-over-max": (lambda s: s.update(scaling={"minReplicas": 3, "maxReplicas": 2}), "scaling.minReplicas"),
    "tp-not-dividing": (
        lambda s: s.update(resources={"gpus": 4}, engine={"tensorParallelSize": 3}),
        "engine.tensorParallelSize",
    ),
    "tp-on-cpu": (
        lambda s: s.update(resources={"gpus": 0}, engine={"tensorParallelSize": 2}),
        "engine.tensorParallelSize",
    ),
    "gpu-type-without-gpus": (
        lambda s: s.update(resources={"gpus": 0, "gpuType": "NVIDIA-L4"}),
        "resources.gpuType",
    ),
    "existing-claim-with-pvc": (
        lambda s: s.update(model={"uri": "pvc://weights/llama"}, cache={"existingClaim": "other"}),
        "cache.existingClaim",
    ),
    "utilization-over-1": (
        lambda s: s.update(engine={"gpuMemoryUtilization": 1.5}),
        "engine.gpuMemoryUtilization",
    ),
    "bad-dtype": (lambda s: s.update(engine={"dtype": "int3"}), "engine.dtype"),
    "bad-quantization": (lambda s: s.update(engine={"quantization": "int4"}), "engine.quantization"),
    "bad-kv-cache-dtype": (lambda s: s.update(engine={"kvCacheDtype": "fp16"}), "engine.kvCacheDtype"),
    "bad-runner": (lambda s: s.update(engine={"runner": "embed"}), "engine.runner"),
    "negative-replicas": (lambda s: s.update(replicas=-1), "replicas"),
    "bad-memory": (lambda s: s.update(resources={"memory": "lots"}), "resources.memory"),
    "bad-port": (lambda s: s.update(service={"port": 70000}), "service.port"),
    "no-model": (lambda s: s.pop("model"), "model"),
}

# Bounds and combinations that cannot work (issue 21), each named by the field the message cites.
BROKEN.update({
    "replicas-over-int32": (lambda s: s.update(replicas=2**31), "replicas"),
    "max-replicas-over-int32": (lambda s: s.update(scaling={"maxReplicas": 2**31}), "scaling.maxReplicas"),
    "negative-memory": (lambda s: s.update(resources={"memory": "-1Gi"}), "resources.memory"),
    "negative-cache-size": (lambda s: s.update(cache={"size": "-5Gi"}), "cache.size"),
    "extra-arg-too-long": (lambda s: s.update(engine={"extraArgs": ["x" * 1025]}), "engine.extraArgs"),
    "too-many-extra-args": (lambda s: s.update(engine={"extraArgs": ["--x"] * 65}), "engine.extraArgs"),
    "uri-parent-in-revision": (lambda s: s["model"].update(uri="hf://org/name@../../etc"), "model.uri"),
    "uri-parent-as-name": (lambda s: s["model"].update(uri="hf://org/.."), "model.uri"),
    "uri-parent-in-pvc-path": (lambda s: s["model"].update(uri="pvc://claim/../other"), "model.uri"),
    "uri-pvc-path-with-tab": (lambda s: s["model"].update(uri="pvc://claim/a\tb"), "model.uri"),
    "cache-read-write-once-pod": (
        lambda s: s.update(cache={"accessMode": "ReadWriteOncePod"}), "cache.accessMode"
    ),
    "cache-read-write-once-with-replicas": (lambda s: s.update(replicas=2), "cache.accessMode"),
    "cache-read-write-once-autoscaled": (
        lambda s: s.update(scaling={"minReplicas": 1, "maxReplicas": 3}), "cache.accessMode"
    ),
})
