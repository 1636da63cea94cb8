"""The ModelServer resource as pydantic models: the single source of truth for the CRD.

`crdgen` turns these models into the CRD's openAPIV3Schema. Field names are snake_case in Python and
camelCase in the CRD (pydantic aliases). CEL rules ride along as `x-kubernetes-validations` in each
model's JSON-schema extra, next to the fields they constrain, so the rule and the field never drift.
Kubernetes' own types (env, tolerations, affinity, ...) are passed through as free-form objects: the
API server validates them again when the operator writes the Deployment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from pagoda.operator.schema_base import Model
from pagoda.operator.status_schema import ModelServerStatus
from pagoda.runtime.model_uri import HF_PATTERN, PARENT, PVC_PATTERN

GROUP = "pagoda.dev"
VERSION = "v1alpha1"
KIND = "ModelServer"
PLURAL = "modelservers"
API_VERSION = f"{GROUP}/{VERSION}"


def _unnamed(pattern: str) -> str:
    """RE2 (CEL's matches) spells named groups (?P<x>...) too, but plain groups keep it portable."""
    return re.sub(r"\(\?P<\w+>", "(", pattern)


# hf://org/name[@revision] or pvc://claim/path: the parser's own patterns (model_uri.py).
URI_REGEX = f"^({_unnamed(HF_PATTERN)[1:-1]}|{_unnamed(PVC_PATTERN)[1:-1]})$"
# A Kubernetes quantity with no sign: sizes and requests are never negative.
QUANTITY_REGEX = r"^(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
# Replica counts end up in int32 fields (Deployment, HPA, the scale subresource).
INT32_MAX = 2**31 - 1
# extraArgs: bounded item by item, so that the spec (and kopf's copy of it in an annotation) stays
# far below the API server's 256 KiB limit on annotations.
MAX_EXTRA_ARGS = 64
MAX_EXTRA_ARG_LENGTH = 1024

# The ModelServer name becomes the Deployment, Service and `<name>-load-<hash>` Job names; Job pod
# labels cap at 63 characters, hence 45 here.
MAX_NAME_LENGTH = 45


def rule(expr: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict:
    """One CEL rule in the shape of `x-kubernetes-validations`."""
    out = {"rule": expr, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def free_form(description: str, *, array: bool = False) -> Any:
    """A Kubernetes-typed field kept opaque in the CRD (validated by the API server downstream)."""
    item = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema = {"type": "array", "items": item} if array else dict(item)
    return Field(default=None, description=description, json_schema_extra={"x-pagoda-raw": schema})


class ModelSource(Model):
    uri: str = Field(
        max_length=512,
        description="hf://org/name[@revision] (downloaded into the cache) or pvc://claim/path "
        "(already on a claim).",
    )
    name: str | None = Field(
        default=None,
        max_length=256,
        description="The served model name (OpenAI `model`). Defaults to org/name.",
    )
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    f"self.uri.matches('{URI_REGEX}')",
                    "model.uri must be hf://org/name[@revision] or pvc://claim/path",
                    ".uri",
                    "FieldValueInvalid",
                ),
                rule(
                    f"!self.uri.contains('{PARENT}')",
                    f"model.uri must not contain '{PARENT}'",
                    ".uri",
                    "FieldValueInvalid",
                ),
            ]
        }
    )


class EngineSpec(Model):
    max_model_len: int | None = Field(
        default=None, ge=16, description="Context length; defaults to the model's."
    )
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="Share of GPU memory to use.")
    max_num_seqs: int | None = Field(
        default=None, ge=1,
        description="Sequences batched together at most; unset means the runtime's default "
        "(1024 on GPUs of 70 GiB or more, else 256).",
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, description="Tokens per engine step at most."
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(default="auto")
    enable_prefix_caching: bool = Field(default=True)
    quantization: Literal["fp8"] | None = Field(
        default=None, description="fp8: FP8 weights quantized at load (per-channel weights, per-token activations); "
        "an FP8 checkpoint is read as FP8 without it.",
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3"] = Field(
        default="auto", description="KV-cache element type: auto (the model's dtype) or fp8 (e4m3, one byte).",
    )
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=8, description="GPUs one model copy spans; unset means resources.gpus (1 on CPU)."
    )
    runner: Literal["auto", "generate", "pooling"] = Field(
        default="auto", description="generate (text), pooling (an embedding server: /v1/embeddings), or auto "
        "(pooling for a sentence-transformers or bare *Model checkpoint, as vLLM's --runner auto).",
    )
    extra_args: list[Annotated[str, Field(max_length=MAX_EXTRA_ARG_LENGTH)]] = Field(
        default_factory=list, max_length=MAX_EXTRA_ARGS, description="Further `pagoda serve` flags, passed as-is."
    )


class ResourcesSpec(Model):
    gpus: int = Field(default=1, ge=0, le=8, description="nvidia.com/gpu per pod; 0 runs the CPU runtime.")
    gpu_type: str | None = Field(
        default=None,
        max_length=128,
        description="Node label nvidia.com/gpu.product to require, e.g. NVIDIA-H100-80GB-HBM3.",
    )
    gpu_memory_gib: float | None = Field(
        default=None,
        gt=0,
        alias="gpuMemoryGiB",
        description="Memory per GPU for the fit check; defaults from gpuType (see docs).",
    )
    cpu: str = Field(default="4", pattern=QUANTITY_REGEX, description="CPU request.")
    memory: str = Field(default="32Gi", pattern=QUANTITY_REGEX, description="Memory request and limit.")
    shm_size: str = Field(
        default="2Gi", pattern=QUANTITY_REGEX, description="Size of the memory-backed /dev/shm."
    )
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "!has(self.gpuType) || self.gpus > 0",
                    "resources.gpuType needs resources.gpus > 0",
                    ".gpuType",
                )
            ]
        }
    )


class CacheSpec(Model):
    enabled: bool = Field(default=True, description="Off: each pod downloads into an emptyDir at start.")
    storage_class_name: str | None = Field(default=None, max_length=253)
    size: str = Field(
        default="100Gi", pattern=QUANTITY_REGEX,
        description="The claim's request. Raising it later expands the claim (if its StorageClass allows); it never shrinks.",
    )
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"] = Field(
        default="ReadWriteOnce", description="ReadWriteMany lets replicas on several nodes share the cache."
    )
    existing_claim: str | None = Field(
        default=None, max_length=253, description="Use this PVC instead of making one."
    )
    retain_on_delete: bool = Field(
        default=True, description="Keep the cache PVC when the ModelServer is deleted."
    )


class SecretKeyRef(Model):
    name: str = Field(max_length=253)
    key: str = Field(max_length=253)


class ServiceSpec(Model):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    port: int = Field(default=8000, ge=1, le=65535)


class ScalingSpec(Model):
    """Read by the autoscaler (pagoda.operator.autoscaler); the reconcile only validates it."""

    mode: Literal["operator", "hpa", "keda"] = Field(default="operator")
    min_replicas: int = Field(default=1, ge=0, le=INT32_MAX)
    max_replicas: int = Field(default=1, ge=1, le=INT32_MAX)
    target_waiting_requests: float = Field(default=4.0, gt=0, description="Waiting requests per replica.")
    scrape_interval_seconds: int = Field(default=15, ge=1)
    scale_up_stabilization_seconds: int = Field(default=0, ge=0)
    scale_down_delay_seconds: int = Field(default=300, ge=0)
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "self.minReplicas <= self.maxReplicas",
                    "scaling.minReplicas must be at most scaling.maxReplicas",
                    ".minReplicas",
                ),
            ]
        }
    )


class LoadBalancingSpec(Model):
    """How `pagoda router` spreads this ModelServer's requests over its ready replicas."""

    strategy: Literal["LeastLoad", "PrefixHash", "RoundRobin"] = Field(
        default="LeastLoad",
        description="LeastLoad: the replica with the fewest running, waiting and in-flight requests. "
        "PrefixHash: consistent hashing with bounded loads over the prompt's first prefixCharLength "
        "characters, so requests that share a system prompt land where it is cached. RoundRobin: in turn.",
    )
    prefix_char_length: int = Field(
        default=100, ge=1, le=100_000, description="PrefixHash: characters of the prompt that are hashed."
    )


class EndpointPickerRef(Model):
    """The Gateway API Inference Extension's endpoint picker (EPP) Service for this pool."""

    name: str = Field(max_length=253, description="The endpoint picker's Service, in this namespace.")
    port: int = Field(default=9002, ge=1, le=65535, description="Its gRPC (ext-proc) port; 9002 is the EPP's default.")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose", description="What the Gateway does while the picker does not answer."
    )


class RoutingSpec(Model):
    """Read by `pagoda router`; the operator reads only inferencePool and endpointPickerRef."""

    aliases: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=32,
        description="Further `model` names the router accepts for this ModelServer, besides model.name.",
    )
    load_balancing: LoadBalancingSpec = Field(default_factory=LoadBalancingSpec)
    inference_pool: bool = Field(
        default=False,
        description="Also emit a Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1) "
        "selecting the serving pods, where that CRD is installed.",
    )
    endpoint_picker_ref: EndpointPickerRef | None = Field(
        default=None, description="The InferencePool's endpoint picker (EPP) Service."
    )


# The operator makes the cache claim itself (its accessMode applies) for hf:// URIs with the cache on.
OWN_CACHE = "self.model.uri.startsWith('hf://') && self.cache.enabled && !has(self.cache.existingClaim)"

def int_or_string(description: str) -> Any:
    """An IntOrString (a count or a percentage such as "25%"), as Deployment strategies take it."""
    schema = {"x-kubernetes-int-or-string": True, "pattern": r"^[0-9]+%?$"}
    return Field(default=None, description=description, json_schema_extra={"x-pagoda-raw": schema})


class RolloutSpec(Model):
    """How pods are replaced and stopped. Unset surge/unavailable: a lone GPU replica surges (a
    spare GPU set serves the new pod before the old one goes; no outage), several replace one at
    a time in place (no spare GPUs needed)."""

    max_surge: int | str | None = int_or_string("Deployment maxSurge (count or percentage).")
    max_unavailable: int | str | None = int_or_string("Deployment maxUnavailable (count or percentage).")
    termination_grace_period_seconds: int = Field(
        default=60, ge=1, le=3600,
        description="How long a stopping pod may finish its requests; the runtime's graceful-shutdown "
        "timeout is set to match.",
    )
    pre_stop_seconds: int = Field(
        default=10, ge=0, le=300,
        description="A stopping pod keeps serving this long first, while endpoints drop it.",
    )
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "self.preStopSeconds < self.terminationGracePeriodSeconds",
                    "rollout.preStopSeconds must be below rollout.terminationGracePeriodSeconds",
                    ".preStopSeconds",
                ),
                rule(
                    "!has(self.maxSurge) || !has(self.maxUnavailable) || "
                    "!(string(self.maxSurge) in ['0', '0%'] && string(self.maxUnavailable) in ['0', '0%'])",
                    "rollout.maxSurge and rollout.maxUnavailable cannot both be 0",
                    ".maxUnavailable",
                ),
            ]
        }
    )


class LocalObjectReference(Model):
    name: str = Field(max_length=253)


# Root-level rules see the whole object: the cache may not move once the loader has filled it.
# Its size may change: the reconcile expands the claim (where the StorageClass allows it) and
# warns on a shrink, which claims cannot do.
IMMUTABLE_CACHE_FIELDS = ("storageClassName", "accessMode", "existingClaim", "enabled")


def _same(field: str) -> str:
    new, old = "self.spec.cache", "oldSelf.spec.cache"
    return (
        f"(has({new}.{field}) == has({old}.{field}) && "
        f"(!has({new}.{field}) || {new}.{field} == {old}.{field}))"
    )


CACHE_LOADED = "has(oldSelf.status) && has(oldSelf.status.cache) && has(oldSelf.status.cache.ready) && oldSelf.status.cache.ready"
ROOT_RULES = [
    rule(
        f"!({CACHE_LOADED}) || ({' && '.join(_same(f) for f in IMMUTABLE_CACHE_FIELDS)})",
        "spec.cache fields ("
        + ", ".join(IMMUTABLE_CACHE_FIELDS)
        + ") are immutable once the cache is loaded",
        ".spec.cache",
        "FieldValueForbidden",
    ),
    rule(
        f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
        "(it names the Deployment, Service and loader Job)",
    ),
]


class ModelServerSpec(Model):
    model: ModelSource
    engine: EngineSpec = Field(default_factory=EngineSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    replicas: int = Field(
        default=1, ge=0, le=INT32_MAX, description="Pods; the autoscaler writes it via the scale subresource."
    )
    image: str | None = Field(
        default=None, max_length=512, description="Runtime image; the operator's default if unset."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None, max_length=16, description="Secrets for pulling the runtime image (serving and loader pods)."
    )
    service_account_name: str | None = Field(
        default=None, max_length=253,
        description="ServiceAccount of the serving and loader pods (e.g. for workload identity); its "
        "token is mounted only when this is set.",
    )
    env: list[dict[str, Any]] | None = free_form("Extra container env (core/v1 EnvVar).", array=True)
    env_from: list[dict[str, Any]] | None = free_form(
        "Extra env sources (core/v1 EnvFromSource).", array=True
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the API key."
    )
    hf_token_secret_ref: SecretKeyRef | None = Field(default=None, description="Secret key holding HF_TOKEN.")
    node_selector: dict[str, str] | None = None
    tolerations: list[dict[str, Any]] | None = free_form("core/v1 Tolerations.", array=True)
    affinity: dict[str, Any] | None = free_form("core/v1 Affinity.")
    priority_class_name: str | None = Field(default=None, max_length=253)
    runtime_class_name: str | None = Field(default=None, max_length=253)
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    pod_labels: dict[str, str] | None = None
    pod_annotations: dict[str, str] | None = None
    startup_timeout_seconds: int = Field(
        default=1800, ge=30, le=86400, description="How long a pod may take to load weights and warm up."
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)


    rollout: RolloutSpec = Field(default_factory=RolloutSpec)

    @property
    def tensor_parallel_size(self) -> int:
        """One model copy spans every GPU of the pod unless engine.tensorParallelSize says less."""
        return self.engine.tensor_parallel_size or max(self.resources.gpus, 1)

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "!has(self.engine.tensorParallelSize) || (self.resources.gpus == 0"
                    " ? self.engine.tensorParallelSize == 1"
                    " : self.resources.gpus % self.engine.tensorParallelSize == 0)",
                    "engine.tensorParallelSize must divide resources.gpus (and be 1 when gpus is 0)",
                    ".engine.tensorParallelSize",
                ),
                rule(
                    "!self.model.uri.startsWith('pvc://') || !has(self.cache.existingClaim)",
                    "cache.existingClaim cannot be combined with a pvc:// model.uri",
                    ".cache.existingClaim",
                ),
                # The loader Job writes the claim, then every serving pod mounts it.
                rule(
                    f"!({OWN_CACHE}) || self.cache.accessMode != 'ReadWriteOncePod'",
                    "cache.accessMode ReadWriteOncePod cannot work: the loader Job and the serving "
                    "pods mount the same claim (a reload would wait forever); use ReadWriteMany",
                    ".cache.accessMode",
                ),
                # A ReadWriteOnce volume attaches to one node; replicas on other nodes never start.
                rule(
                    f"!({OWN_CACHE}) || self.cache.accessMode != 'ReadWriteOnce'"
                    " || (self.replicas <= 1 && self.scaling.maxReplicas <= 1)",
                    "cache.accessMode ReadWriteOnce attaches to one node: replicas (or "
                    "scaling.maxReplicas) above 1 need ReadWriteMany",
                    ".cache.accessMode",
                ),
            ]
        }
    )


def _plain(value: Any) -> Any:
    """kopf hands out read-only mapping views; the models want plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class ModelServer(BaseModel):
    """A whole ModelServer object, as the builders take it (metadata kept as a plain dict)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    api_version: str = Field(default=API_VERSION, alias="apiVersion")
    kind: str = KIND
    metadata: dict[str, Any]
    spec: ModelServerSpec
    status: ModelServerStatus = Field(default_factory=ModelServerStatus)

    @classmethod
    def from_body(cls, body: Any) -> ModelServer:
        """From a kopf Body or a raw dict."""
        raw = {k: _plain(body.get(k) or {}) for k in ("metadata", "spec", "status")}
        return cls.model_validate({"apiVersion": API_VERSION, "kind": KIND, **raw})

    @property
    def name(self) -> str:
        return self.metadata["name"]

    @property
    def namespace(self) -> str:
        return self.metadata.get("namespace") or "default"

    @property
    def uid(self) -> str | None:
        return self.metadata.get("uid")

    @property
    def generation(self) -> int | None:
        return self.metadata.get("generation")
