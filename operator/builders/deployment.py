"""The serving Deployment: `pagoda serve` on the cached weights, one GPU set per pod."""

from __future__ import annotations

import math

from pagoda.operator.builders import meta
from pagoda.operator.config import OperatorConfig
from pagoda.operator.spec import ModelServer
from pagoda.runtime.engine_args import to_cli_flags
from pagoda.runtime.model_uri import CACHE_MOUNT

CONTAINER_PORT = 8000
HEALTH_PATH = "/health"
STARTUP_PERIOD_SECONDS = 10


def engine_knobs(ms: ModelServer) -> dict:
    """The spec's engine settings under their EngineArgs names (None: the runtime's default)."""
    engine = ms.spec.engine
    return {
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "dtype": engine.dtype,
        "max_model_len": engine.max_model_len,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "enable_prefix_caching": None if engine.enable_prefix_caching else False,
        "quantization": engine.quantization,
        "kv_cache_dtype": None if engine.kv_cache_dtype == "auto" else engine.kv_cache_dtype,
        "runner": None if engine.runner == "auto" else engine.runner,
        "tensor_parallel_size": ms.spec.tensor_parallel_size if ms.spec.tensor_parallel_size > 1 else None,
        "device": "cpu" if ms.spec.resources.gpus == 0 else None,
    }


def serve_args(ms: ModelServer, model_path: str) -> list[str]:
    """`pagoda serve` flags from the spec (the runtime's CLI is the whole contract); the engine's
    flags are spelled by the runtime's EngineArgs, which the CLI itself is built from."""
    args = [
        model_path,
        "--host", "0.0.0.0",
        "--port", str(CONTAINER_PORT),
        "--served-model-name", meta.served_name(ms),
    ]  # fmt: skip
    args += to_cli_flags(engine_knobs(ms))
    # The API key is never an argument (argv is readable by every process on the node): the
    # runtime reads PAGODA_API_KEY from its env, which a secretKeyRef fills (see _env).
    args += ["--shutdown-timeout", str(shutdown_timeout_seconds(ms))]
    return args + list(ms.spec.engine.extra_args)


def _probe(period: int, failures: int, timeout: int = 5) -> dict:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _resources(ms: ModelServer) -> dict:
    res = ms.spec.resources
    # No CPU limit: CFS throttling of the step loop costs far more than it protects.
    out = {"requests": {"cpu": res.cpu, "memory": res.memory}, "limits": {"memory": res.memory}}
    if res.gpus:
        out["requests"]["nvidia.com/gpu"] = str(res.gpus)
        out["limits"]["nvidia.com/gpu"] = str(res.gpus)
    return out


def _volumes(ms: ModelServer) -> tuple[list[dict], list[dict], list[dict]]:
    """(volumes, mounts of the server, init containers)."""
    claim = meta.cache_claim_name(ms)
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": ms.spec.resources.shm_size}}
    volumes = [shm, meta.TMP_VOLUME]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, meta.TMP_MOUNT]
    init: list[dict] = []
    if claim:
        volumes.append(
            {"name": "model-cache", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        mounts.append({"name": "model-cache", "mountPath": CACHE_MOUNT, "readOnly": True})
    else:
        # No cache: every pod downloads into its own scratch volume before the server starts.
        volumes.append({"name": "model-cache", "emptyDir": {}})
        mounts.append({"name": "model-cache", "mountPath": CACHE_MOUNT, "readOnly": True})
        env = list(meta.HOME_ENV) + _hf_token_env(ms)
        init.append(
            {
                "name": "download",
                "image": ms.spec.image or "",
                "imagePullPolicy": ms.spec.image_pull_policy,
                "command": ["pagoda", "download", ms.spec.model.uri, meta.model_uri(ms).mount_path],
                "env": env,
                "securityContext": meta.restricted_container_security(),
                "volumeMounts": [{"name": "model-cache", "mountPath": CACHE_MOUNT}, meta.TMP_MOUNT],
            }
        )
    return volumes, mounts, init


def _hf_token_env(ms: ModelServer) -> list[dict]:
    ref = ms.spec.hf_token_secret_ref
    if not ref:
        return []
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def _env(ms: ModelServer) -> list[dict]:
    env = [{"name": "HF_HUB_OFFLINE", "value": "1"}, *meta.HOME_ENV]
    if ms.spec.api_key_secret_ref:
        ref = ms.spec.api_key_secret_ref
        env.append(
            {"name": "PAGODA_API_KEY", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    return env + list(ms.spec.env or [])


def _strategy(ms: ModelServer) -> dict:
    rollout = ms.spec.rollout
    if ms.spec.resources.gpus and ms.spec.replicas > 1:
        # Several GPU replicas: replace one at a time in place, needing no spare GPU set.
        surge, unavailable = 0, 1
    else:
        # One replica (or CPU): the new pod serves before the old one goes; a lone GPU replica
        # replaced in place would be an outage.
        surge, unavailable = 1, 0
    surge = rollout.max_surge if rollout.max_surge is not None else surge
    unavailable = rollout.max_unavailable if rollout.max_unavailable is not None else unavailable
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}


def shutdown_timeout_seconds(ms: ModelServer) -> int:
    """The runtime's graceful-shutdown timeout: what the grace period leaves after preStop, less
    a few seconds for the process to exit before the kubelet's SIGKILL."""
    rollout = ms.spec.rollout
    return max(1, rollout.termination_grace_period_seconds - rollout.pre_stop_seconds - 5)


def build_deployment(ms: ModelServer, config: OperatorConfig, model_path: str | None = None) -> dict:
    """model_path: the loaded model's folder (it lags the spec while a new URI is loading)."""
    image = ms.spec.image or config.runtime_image
    volumes, mounts, init = _volumes(ms)
    for container in init:
        container["image"] = image
    container = {
        "name": "runtime",
        "image": image,
        "imagePullPolicy": ms.spec.image_pull_policy,
        "args": serve_args(ms, model_path or meta.model_uri(ms).mount_path),
        "env": _env(ms),
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "resources": _resources(ms),
        "volumeMounts": mounts,
        "startupProbe": _probe(
            STARTUP_PERIOD_SECONDS, math.ceil(ms.spec.startup_timeout_seconds / STARTUP_PERIOD_SECONDS)
        ),
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(10, 6, timeout=10),
        "securityContext": meta.restricted_container_security(),
    }
    if ms.spec.rollout.pre_stop_seconds:
        # Endpoints drop a stopping pod asynchronously; serving on meanwhile loses no request.
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": ms.spec.rollout.pre_stop_seconds}}}
    if ms.spec.env_from:
        container["envFrom"] = list(ms.spec.env_from)
    pod_labels = {**(ms.spec.pod_labels or {}), **meta.labels(ms, meta.SERVER_COMPONENT)}
    pod_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(CONTAINER_PORT),
        "prometheus.io/path": "/metrics",
        **(ms.spec.pod_annotations or {}),
    }
    pod_spec = {
        **meta.pod_identity(ms),
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": ms.spec.rollout.termination_grace_period_seconds,
        "securityContext": meta.restricted_pod_security(),
        "containers": [container],
        "volumes": volumes,
        **meta.placement(ms),
    }
    if init:
        pod_spec["initContainers"] = init
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta.object_meta(ms, ms.name, meta.SERVER_COMPONENT),
        "spec": {
            "replicas": ms.spec.replicas,
            "selector": {"matchLabels": meta.selector_labels(ms)},
            "strategy": _strategy(ms),
            "revisionHistoryLimit": 3,
            # Weights stream in for minutes; a rollout is not stuck until the startup probe gives up.
            "progressDeadlineSeconds": ms.spec.startup_timeout_seconds + 600,
            "template": {
                "metadata": {"labels": pod_labels, "annotations": pod_annotations},
                "spec": pod_spec,
            },
        },
    }
