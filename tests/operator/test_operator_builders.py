"""Manifest builders over a matrix of specs, validated against the real Kubernetes OpenAPI schemas
(kubernetes-validate, strict: unknown fields fail) plus the properties the design promises."""

from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from crd_check import admit

from pagoda.operator.builders import meta
from pagoda.operator.builders.deployment import build_deployment
from pagoda.operator.builders.loader_job import PLAN_CONTAINER, build_loader_job
from pagoda.operator.builders.pvc import build_cache_pvc
from pagoda.operator.builders.service import build_service
from pagoda.operator.config import OperatorConfig
from pagoda.operator.spec import ModelServer
from pagoda.runtime.download import add_arguments as download_arguments

K8S_VERSION = "1.37"
ROOT = Path(__file__).resolve().parents[2]
CONFIG = OperatorConfig(runtime_image="registry.local/pagoda-runtime:test")

SPECS = {
    "minimal": {"model": {"uri": "hf://Qwen/Qwen2.5-0.5B-Instruct"}},
    "cpu-demo": {
        "model": {"uri": "hf://org/tiny@v1", "name": "tiny"},
        "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
        "service": {"type": "NodePort", "port": 80},
        "startupTimeoutSeconds": 95,
    },
    "full": yaml.safe_load((ROOT / "examples" / "modelserver-full.yaml").read_text())["spec"],
    "cache-disabled": {
        "model": {"uri": "hf://org/m"},
        "cache": {"enabled": False},
        "hfTokenSecretRef": {"name": "hf", "key": "t"},
    },
    "pvc-uri": {
        "model": {"uri": "pvc://weights/llama/8b"},
        "resources": {"gpus": 2, "gpuType": "NVIDIA-H200"},
        "engine": {"tensorParallelSize": 2, "enablePrefixCaching": False, "maxModelLen": 4096},
    },
    "multi-gpu": {"model": {"uri": "hf://org/big"}, "resources": {"gpus": 4, "gpuType": "NVIDIA-H200"}},
    "existing-claim": {
        "model": {"uri": "hf://org/m@refs/pr/1"},
        "cache": {"existingClaim": "shared-models"},
        "apiKeySecretRef": {"name": "k", "key": "key"},
        "replicas": 0,
    },
}


def modelserver(name: str) -> ModelServer:
    obj = {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name, "namespace": "ml", "uid": "0b4a-uid", "generation": 1},
        "spec": copy.deepcopy(SPECS[name]),
    }
    defaulted, errors = admit(obj)
    assert errors == []
    return ModelServer.from_body(defaulted)


def manifests(ms: ModelServer) -> list[dict]:
    out = [build_deployment(ms, CONFIG), build_service(ms), build_loader_job(ms, CONFIG), build_cache_pvc(ms)]
    return [o for o in out if o is not None]


def test_the_validator_is_strict():
    deployment = build_deployment(modelserver("minimal"), CONFIG)
    deployment["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", SPECS)
def test_manifests_are_valid_kubernetes(name):
    for obj in manifests(modelserver(name)):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["labels"][meta.LABEL_MODELSERVER] == name


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _restricted(pod_spec: dict) -> None:
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod_spec.get("initContainers", []) + pod_spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("name", SPECS)
def test_deployment_promises(name):
    ms = modelserver(name)
    d = build_deployment(ms, CONFIG)
    pod = d["spec"]["template"]["spec"]
    c = _container(d)
    gpus = ms.spec.resources.gpus
    _restricted(pod)
    assert d["metadata"]["ownerReferences"][0]["uid"] == "0b4a-uid"
    assert d["spec"]["replicas"] == ms.spec.replicas
    # GPU limits; a lone replica surges (no outage), several GPU replicas replace in place.
    assert c["resources"]["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
    rolling = d["spec"]["strategy"]["rollingUpdate"]
    in_place = bool(gpus) and ms.spec.replicas > 1
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == ((0, 1) if in_place else (1, 0))
    # Stopping: preStop keeps serving while endpoints drop the pod, and the runtime's graceful
    # shutdown ends before the grace period does.
    grace = pod["terminationGracePeriodSeconds"]
    assert grace == ms.spec.rollout.termination_grace_period_seconds
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    shutdown = float(c["args"][c["args"].index("--shutdown-timeout") + 1])
    assert 0 < pre_stop and pre_stop + shutdown < grace
    assert ("--device" in c["args"]) == (gpus == 0)
    if ms.spec.resources.gpu_type:
        assert pod["nodeSelector"]["nvidia.com/gpu.product"] == ms.spec.resources.gpu_type
    # Memory-backed /dev/shm.
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    # Probes on /health; the startup probe covers startupTimeoutSeconds.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    sp = c["startupProbe"]
    assert sp["periodSeconds"] * sp["failureThreshold"] >= ms.spec.startup_timeout_seconds
    assert sp["periodSeconds"] * (sp["failureThreshold"] - 1) < ms.spec.startup_timeout_seconds
    # The cache read-only, offline.
    cache_mount = next(m for m in c["volumeMounts"] if m["name"] == "model-cache")
    assert cache_mount["readOnly"] is True
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]
    assert c["args"][0] == meta.model_uri(ms).mount_path
    assert c["args"][c["args"].index("--served-model-name") + 1] == meta.served_name(ms)
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_engine_args_and_secrets():
    ms = modelserver("full")
    c = _container(build_deployment(ms, CONFIG))
    args = c["args"]
    pairs = dict(zip(args[1::2], args[2::2]))
    assert pairs["--max-model-len"] == "8192" and pairs["--max-num-batched-tokens"] == "8192"
    assert pairs["--dtype"] == "bfloat16" and pairs["--gpu-memory-utilization"] == "0.9"
    assert args[-2:] == ["--block-size", "16"]  # extraArgs last, as given
    # The key reaches the runtime only through its env (argv is visible on the node).
    assert "--api-key" not in args and not any("API_KEY" in a for a in args)
    key = next(e for e in c["env"] if e["name"] == "PAGODA_API_KEY")
    assert key["valueFrom"]["secretKeyRef"] == {"name": "llama-api-key", "key": "api-key"}
    tp = _container(build_deployment(modelserver("pvc-uri"), CONFIG))["args"]
    assert "--no-enable-prefix-caching" in tp and tp[tp.index("--tensor-parallel-size") + 1] == "2"
    # Seats: as the spec says, else the runtime's default for its GPU (no flag at all).
    assert pairs["--max-num-seqs"] == str(ms.spec.engine.max_num_seqs) == "256"
    assert "--max-num-seqs" not in tp and modelserver("pvc-uri").spec.engine.max_num_seqs is None


def test_cache_layout_per_uri_kind():
    pvc_uri = modelserver("pvc-uri")
    assert build_cache_pvc(pvc_uri) is None
    claim = next(
        v
        for v in build_deployment(pvc_uri, CONFIG)["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "model-cache"
    )
    assert claim["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    assert build_cache_pvc(modelserver("existing-claim")) is None
    pvc = build_cache_pvc(modelserver("full"))
    assert pvc["metadata"]["name"] == "full-cache" and "ownerReferences" not in pvc["metadata"]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "standard-rwx",
        "resources": {"requests": {"storage": "200Gi"}},
    }
    # No cache: each pod downloads into an emptyDir before serving.
    assert build_loader_job(modelserver("cache-disabled"), CONFIG) is None
    d = build_deployment(modelserver("cache-disabled"), CONFIG)["spec"]["template"]["spec"]
    (init,) = d["initContainers"]
    assert (
        init["command"][:3] == ["pagoda", "download", "hf://org/m"] and init["image"] == CONFIG.runtime_image
    )
    assert next(v for v in d["volumes"] if v["name"] == "model-cache") == {
        "name": "model-cache",
        "emptyDir": {},
    }


def download_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    download_arguments(parser)
    return parser


def test_loader_job_never_prunes_a_claim_it_does_not_own():
    for name in ("existing-claim", "pvc-uri"):  # a user's claim may hold other ModelServers' models
        (download,) = build_loader_job(modelserver(name), CONFIG)["spec"]["template"]["spec"]["initContainers"]
        assert "--prune-root" not in download["command"], name
        assert download_parser().parse_args(download["command"][2:]).prune_root is None


def test_loader_job():
    ms = modelserver("full")
    job = build_loader_job(ms, CONFIG)
    pod = job["spec"]["template"]["spec"]
    _restricted(pod)
    (download,), (plan,) = pod["initContainers"], pod["containers"]
    target = "/models/hf/meta-llama/Llama-3.1-8B-Instruct/0e9e39f249a16976918f6564b8830bc894c89659"
    # The claim is the ModelServer's own: the other revisions on it go once this one is complete.
    assert download["command"] == ["pagoda", "download", ms.spec.model.uri, target, "--error-file",
                                   "/dev/termination-log", "--prune-root", "/models/hf"]  # fmt: skip
    download_args = download_parser().parse_args(download["command"][2:])
    assert (download_args.dir, download_args.prune_root) == (target, "/models/hf")
    # A failure's cause is the container's termination message, which the operator reads back.
    assert download_args.error_file == download["terminationMessagePath"] == "/dev/termination-log"
    assert download["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
    } in download["env"]
    assert plan["name"] == PLAN_CONTAINER and plan["terminationMessagePath"] == "/dev/termination-log"
    # H100-80GB, tensorParallelSize 1; the engine settings that change the figures go along.
    assert plan["command"][3:] == [
        "plan",
        target,
        "--gpu-memory-gib",
        "80",
        "--gpu-memory-utilization",
        "0.9",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "8192",
    ]
    assert "nvidia.com/gpu" not in str(plan["resources"])  # sizing needs no GPU
    assert job["metadata"]["name"] == meta.loader_job_name(ms) and len(job["metadata"]["name"]) <= 63
    # A new URI gets a new Job name, so it reloads.
    other = ms.model_copy(deep=True)
    other.spec.model.uri = "hf://meta-llama/Llama-3.1-8B-Instruct"
    assert meta.loader_job_name(other) != meta.loader_job_name(ms)
    cpu = build_loader_job(modelserver("cpu-demo"), CONFIG)["spec"]["template"]["spec"]["containers"][0]
    assert cpu["command"][cpu["command"].index("--gpu-memory-gib") + 1] == "2"  # the pod's memory, in GiB
    mounts = build_loader_job(modelserver("pvc-uri"), CONFIG)["spec"]["template"]["spec"]["initContainers"][
        0
    ]["volumeMounts"]
    assert mounts[0]["readOnly"] is True  # pvc:// weights are never written


def test_service():
    svc = build_service(modelserver("minimal"))
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert (
        svc["spec"]["selector"]
        == build_deployment(modelserver("minimal"), CONFIG)["spec"]["selector"]["matchLabels"]
    )


def test_startup_threshold_rounds_up():
    ms = modelserver("cpu-demo")
    sp = _container(build_deployment(ms, CONFIG))["startupProbe"]
    assert sp["failureThreshold"] == math.ceil(95 / 10)


@pytest.mark.parametrize("name", list(SPECS))
def test_runtime_cli_accepts_the_deployment_args(name):
    """The Deployment's args parse with the runtime's own `pagoda serve` parser (the contract)."""
    import argparse

    from pagoda.runtime.frontend.server.cli import add_arguments

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    ms = modelserver(name)
    args = _container(build_deployment(ms, CONFIG))["args"]
    if name == "full":
        args = args[:-2]  # extraArgs are the user's own
    parsed = parser.parse_args(args)
    assert parsed.model == meta.model_uri(ms).mount_path
    assert parsed.max_num_seqs == ms.spec.engine.max_num_seqs
    # One pod holds one model copy over all its GPUs unless tensorParallelSize says less.
    gpus = ms.spec.resources.gpus
    assert parsed.tensor_parallel_size == (ms.spec.engine.tensor_parallel_size or max(gpus, 1))
    if name == "multi-gpu":
        assert parsed.tensor_parallel_size == 4
        limits = _container(build_deployment(ms, CONFIG))["resources"]["limits"]
        assert limits["nvidia.com/gpu"] in (4, "4")


def test_plan_cli_accepts_the_loader_args():
    import argparse

    from pagoda.runtime.plan import add_arguments

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    for name in SPECS:
        ms = modelserver(name)
        job = build_loader_job(ms, CONFIG)
        if job is None:
            continue
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        parsed = parser.parse_args([*command[4:], "--json"])
        assert parsed.json and parsed.model == meta.model_uri(ms).mount_path


def test_rollout_settings_are_passed_through():
    ms = modelserver("full")
    ms.spec.rollout.max_surge, ms.spec.rollout.max_unavailable = "25%", 0
    ms.spec.rollout.termination_grace_period_seconds, ms.spec.rollout.pre_stop_seconds = 120, 0
    d = build_deployment(ms, CONFIG)
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": "25%", "maxUnavailable": 0}
    c = _container(d)
    assert "lifecycle" not in c and c["args"][c["args"].index("--shutdown-timeout") + 1] == "115"
    kubernetes_validate.validate(d, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", SPECS)
def test_loader_job_is_placed_like_the_serving_pods(name):
    ms = modelserver(name)
    server = build_deployment(ms, CONFIG)["spec"]["template"]["spec"]
    job = build_loader_job(ms, CONFIG)
    if job is None:
        return
    loader = job["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName",
                "imagePullSecrets", "serviceAccountName", "automountServiceAccountToken"):
        assert loader.get(key) == server.get(key), key
    if ms.spec.resources.gpus:
        assert meta.GPU_TOLERATION in loader["tolerations"]


def test_pods_get_pull_secrets_and_a_service_account_when_asked():
    ms = modelserver("full")
    assert build_deployment(ms, CONFIG)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    raw = ms.model_dump(by_alias=True)
    raw["spec"].update(imagePullSecrets=[{"name": "registry"}], serviceAccountName="model-reader")
    ms = type(ms).model_validate(raw)
    for pod in (
        build_deployment(ms, CONFIG)["spec"]["template"]["spec"],
        build_loader_job(ms, CONFIG)["spec"]["template"]["spec"],
    ):
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
        assert pod["serviceAccountName"] == "model-reader" and pod["automountServiceAccountToken"] is True
