"""Names, labels and owner references shared by every manifest builder."""

from __future__ import annotations

from pagoda.operator.spec import ModelServer
from pagoda.runtime.model_uri import ModelURI, uri_digest

MANAGED_BY = "pagoda-operator"
LABEL_MODELSERVER = "pagoda.dev/modelserver"
LABEL_COMPONENT = "app.kubernetes.io/component"
# The Deployment's selector: immutable once created, so it holds only what never changes.
SERVER_COMPONENT = "server"
LOADER_COMPONENT = "loader"
CACHE_COMPONENT = "cache"
RUNTIME_UID = 1000  # the non-root user both Dockerfiles create


def labels(ms: ModelServer, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "pagoda",
        "app.kubernetes.io/instance": ms.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_COMPONENT: component,
        LABEL_MODELSERVER: ms.name,
    }


def selector_labels(ms: ModelServer) -> dict[str, str]:
    return {LABEL_MODELSERVER: ms.name, LABEL_COMPONENT: SERVER_COMPONENT}


def selector_string(ms: ModelServer) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(ms).items()))


def owner_body(ms: ModelServer) -> dict:
    """The ModelServer in the shape kopf's ownership helpers read."""
    return {"apiVersion": ms.api_version, "kind": ms.kind, "metadata": ms.metadata}


def owner_reference(ms: ModelServer) -> dict:
    """Garbage collection deletes the owned objects with the ModelServer (not the cache PVC)."""
    import kopf  # here: the router (its image has no kopf) imports this module for served_name

    return dict(kopf.build_owner_reference(owner_body(ms), controller=True, block_owner_deletion=True))


def object_meta(ms: ModelServer, name: str, component: str, *, owned: bool = True) -> dict:
    meta = {"name": name, "namespace": ms.namespace, "labels": labels(ms, component)}
    if owned and ms.uid:
        meta["ownerReferences"] = [owner_reference(ms)]
    return meta


def model_uri(ms: ModelServer) -> ModelURI:
    return ModelURI.parse(ms.spec.model.uri)


def served_name(ms: ModelServer) -> str:
    return ms.spec.model.name or model_uri(ms).default_served_name


def cache_claim_name(ms: ModelServer) -> str | None:
    """The claim the weights live on: pvc:// names it, existingClaim names it, else our own."""
    uri = model_uri(ms)
    if uri.scheme == "pvc":
        return uri.claim
    if not ms.spec.cache.enabled:
        return None
    return ms.spec.cache.existing_claim or f"{ms.name}-cache"


def owns_cache_claim(ms: ModelServer) -> bool:
    return model_uri(ms).scheme == "hf" and ms.spec.cache.enabled and not ms.spec.cache.existing_claim


def loader_job_name(ms: ModelServer, uri: str | None = None) -> str:
    return f"{ms.name}-load-{uri_digest(uri or ms.spec.model.uri)}"


GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def placement(ms: ModelServer) -> dict:
    """Where a ModelServer's pods run, the loader's included: the user's scheduling fields, plus
    the GPU product selector and the toleration of the taint GPU nodes commonly carry."""
    spec = ms.spec
    node_selector = dict(spec.node_selector or {})
    tolerations = list(spec.tolerations or [])
    if spec.resources.gpus:
        if spec.resources.gpu_type:
            node_selector[GPU_PRODUCT_LABEL] = spec.resources.gpu_type
        if GPU_TOLERATION not in tolerations:
            tolerations.append(GPU_TOLERATION)
    out: dict = {}
    for key, value in (
        ("nodeSelector", node_selector),
        ("tolerations", tolerations),
        ("affinity", spec.affinity),
        ("priorityClassName", spec.priority_class_name),
        ("runtimeClassName", spec.runtime_class_name),
    ):
        if value:
            out[key] = value
    return out


def pod_identity(ms: ModelServer) -> dict:
    """The pods' ServiceAccount and pull secrets. No API token is mounted unless a ServiceAccount
    is named: the runtime never calls the API server."""
    out: dict = {"automountServiceAccountToken": bool(ms.spec.service_account_name)}
    if ms.spec.service_account_name:
        out["serviceAccountName"] = ms.spec.service_account_name
    if ms.spec.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": ref.name} for ref in ms.spec.image_pull_secrets]
    return out


def restricted_container_security() -> dict:
    """The Pod Security Standards' `restricted` profile, per container."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_pod_security() -> dict:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUNTIME_UID,
        "runAsGroup": RUNTIME_UID,
        # The cache PVC is written by the loader and read by the servers, both as this group.
        "fsGroup": RUNTIME_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# A writable /tmp: the root filesystem is read-only, and HF, Triton and torch keep caches under HOME.
TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
HOME_ENV = [
    {"name": "HOME", "value": "/tmp"},
    {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
    {"name": "TRITON_CACHE_DIR", "value": "/tmp/.triton"},
]
