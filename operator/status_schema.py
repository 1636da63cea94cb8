"""The ModelServer's status as pydantic models: what the reconcile and the autoscaler write, and
what `crdgen` turns into the CRD's status schema."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from pagoda.operator.schema_base import Model


class StatusModel(Model):
    """Status is written by several hands (the reconcile, the autoscaler, older operator versions):
    reading it never fails on a field this version does not know."""

    model_config = ConfigDict(extra="ignore")


class Condition(StatusModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    observed_generation: int | None = None


class CacheStatus(StatusModel):
    claim_name: str | None = None
    uri: str | None = Field(default=None, description="The URI now loaded (or loading) in the cache.")
    path: str | None = Field(default=None, description="Model folder inside the pods.")
    ready: bool = False
    job_name: str | None = None


class PlanStatus(StatusModel):
    """`pagoda plan` figures for the loaded model on the requested GPU."""

    fits: bool | None = None
    gpu_memory_gib: float | None = Field(default=None, alias="gpuMemoryGiB")
    weight_bytes: int | None = None
    kv_bytes_per_token: int | None = None
    kv_capacity_tokens: int | None = None
    max_concurrent_seqs: int | None = None
    message: str | None = None


class LoaderStatus(StatusModel):
    failures: int = 0
    failed_job_uid: str | None = None
    retry_after: str | None = None
    last_error: str | None = Field(default=None, description="Why the last loader Job failed, from its pod.")


class RouterStatus(StatusModel):
    """Written by `pagoda router`: where to reach this ModelServer through it."""

    endpoint: str | None = Field(default=None, description="The router's OpenAI base URL.")
    model: str | None = Field(default=None, description="The `model` to ask the router for.")
    aliases: list[str] | None = None
    strategy: str | None = None


class ModelServerStatus(Model):
    phase: Literal["Pending", "Loading", "Starting", "Ready", "Failed"] | None = None
    message: str | None = None
    conditions: list[Condition] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int | None = None
    ready_replicas: int | None = None
    waiting_requests: float | None = Field(
        default=None, description="Queue depth, written by the autoscaler."
    )
    desired_replicas: int | None = Field(default=None, description="Written by the autoscaler.")
    endpoint: str | None = None
    observed_generation: int | None = None
    selector: str | None = Field(default=None, description="Pod label selector, for the scale subresource.")
    cache: CacheStatus | None = None
    plan: PlanStatus | None = None
    loader: LoaderStatus | None = None
    router: RouterStatus | None = None
    model_config = ConfigDict(extra="allow")
