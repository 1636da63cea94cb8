"""The loader Job: fill the cache once (`pagoda download`), then size the model (`pagoda plan`).

The plan's JSON is the plan container's termination message, so the operator reads the figures
from the pod's status with no log access and no extra RBAC.
"""

from __future__ import annotations

from pagoda.operator.builders import meta
from pagoda.operator.config import OperatorConfig
from pagoda.operator.gpus import gpu_memory_gib, quantity_gib
from pagoda.operator.spec import ModelServer
from pagoda.runtime.engine_args import to_cli_flags
from pagoda.runtime.model_uri import CACHE_MOUNT, HF_FOLDER

PLAN_CONTAINER = "plan"
DOWNLOAD_CONTAINER = "download"
TERMINATION_LOG = "/dev/termination-log"
# The plan's arguments follow the script ("$@"), so no path is ever re-parsed by the shell.
# `pagoda plan` exits 1 when the model does not fit: that is a finding for the status, not a failed
# load, so only 2 and up (no config.json, bad flags) fail the Job.
PLAN_SCRIPT = (
    'pagoda plan "$@" --json > /dev/termination-log; rc=$?; cat /dev/termination-log; [ "$rc" -le 1 ]'
)


def plan_args(ms: ModelServer, model_path: str) -> list[str]:
    engine = ms.spec.engine
    gib, _ = plan_memory_gib(ms)
    knobs = {"gpu_memory_utilization": engine.gpu_memory_utilization, "dtype": engine.dtype,
             "max_model_len": engine.max_model_len, "quantization": engine.quantization,
             "kv_cache_dtype": None if engine.kv_cache_dtype == "auto" else engine.kv_cache_dtype}
    return [model_path, "--gpu-memory-gib", f"{gib:g}", *to_cli_flags(knobs)]


def plan_memory_gib(ms: ModelServer) -> tuple[float, bool]:
    """The memory one replica's model copy spans: per-GPU × tensorParallelSize, or RAM on CPU."""
    res = ms.spec.resources
    if res.gpus == 0:
        return round(quantity_gib(res.memory), 3), False
    per_gpu, assumed = gpu_memory_gib(res.gpu_type, res.gpu_memory_gib)
    return per_gpu * ms.spec.tensor_parallel_size, assumed


def build_loader_job(ms: ModelServer, config: OperatorConfig) -> dict | None:
    """None when the cache is disabled: then each serving pod downloads for itself."""
    uri = meta.model_uri(ms)
    claim = meta.cache_claim_name(ms)
    if claim is None:
        return None
    image = ms.spec.image or config.runtime_image
    security = meta.restricted_container_security()
    env = list(meta.HOME_ENV)
    if ms.spec.hf_token_secret_ref:
        ref = ms.spec.hf_token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    mounts = [
        {"name": "model-cache", "mountPath": CACHE_MOUNT, "readOnly": uri.scheme == "pvc"},
        meta.TMP_MOUNT,
    ]
    resources = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    labels = meta.labels(ms, meta.LOADER_COMPONENT)
    # The cause of a failure goes to the termination message, where the operator reads it for the
    # status; the log's tail stands in when the container dies before writing it.
    command = ["pagoda", "download", ms.spec.model.uri, uri.mount_path, "--error-file", TERMINATION_LOG]
    if meta.owns_cache_claim(ms):
        # Our own claim holds one model: the other revisions go once this one is complete. A claim
        # the user names (existingClaim) may be shared by other ModelServers, so it is never pruned.
        command += ["--prune-root", f"{CACHE_MOUNT}/{HF_FOLDER}"]
    download = {
        "name": DOWNLOAD_CONTAINER,
        "image": image,
        "imagePullPolicy": ms.spec.image_pull_policy,
        "command": command,
        "env": env,
        "resources": resources,
        "securityContext": security,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    plan = {
        "name": PLAN_CONTAINER,
        "image": image,
        "imagePullPolicy": ms.spec.image_pull_policy,
        "command": ["sh", "-c", PLAN_SCRIPT, "plan", *plan_args(ms, uri.mount_path)],
        "env": list(meta.HOME_ENV),
        "resources": resources,
        "securityContext": security,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{**mounts[0], "readOnly": True}, meta.TMP_MOUNT],
    }
    pod_spec = {
        "restartPolicy": "Never",
        **meta.pod_identity(ms),
        "enableServiceLinks": False,
        "securityContext": meta.restricted_pod_security(),
        "initContainers": [download],
        "containers": [plan],
        "volumes": [
            {
                "name": "model-cache",
                "persistentVolumeClaim": {"claimName": claim, "readOnly": uri.scheme == "pvc"},
            },
            meta.TMP_VOLUME,
        ],
    }
    # Placed like the serving pods (GPU nodes, their taint, the product, affinity, runtimeClass):
    # a ReadWriteOnce cache attaches where the loader ran, and that node must take the servers.
    pod_spec.update(meta.placement(ms))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            **meta.object_meta(ms, meta.loader_job_name(ms), meta.LOADER_COMPONENT),
            "annotations": {"pagoda.dev/model-uri": ms.spec.model.uri},
        },
        "spec": {
            # Pod-level retries for flaky downloads; after that the operator retries with backoff.
            "backoffLimit": 2,
            "activeDeadlineSeconds": 6 * 3600,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
