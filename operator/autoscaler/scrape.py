"""Scrape each ready replica's /metrics over its pod IP, for the queue figures the policy needs.

A replica that does not answer in time, answers with an error, or answers without the gauges is
*unknown*: its PodLoad carries None, never zero, so that a silent replica cannot look idle and
invite a scale-down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pagoda.operator.autoscaler.metrics import RUNNING, WAITING
from pagoda.operator.autoscaler.policy import PodLoad

DEFAULT_PORT = 8000
DEFAULT_TIMEOUT_SECONDS = 2.0


@dataclass(slots=True, frozen=True)
class PodTarget:
    name: str
    ip: str
    port: int

    @property
    def metrics_url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip  # IPv6 pod IPs
        return f"http://{host}:{self.port}/metrics"


def ready_targets(pods: Iterable[Mapping[str, Any]], port_name: str = "http") -> list[PodTarget]:
    """The pods (as API dicts) that are Ready, not terminating and have an IP, as scrape targets.

    The port is the container port named `port_name`, else the first container port: the pod says
    where it serves, so the autoscaler does not have to agree with the builder on a number.
    """
    targets = []
    for pod in pods:
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        if not ready or meta.get("deletionTimestamp") or not status.get("podIP"):
            continue
        targets.append(PodTarget(meta["name"], status["podIP"], _port(pod, port_name)))
    return sorted(targets, key=lambda t: t.name)


def _port(pod: Mapping[str, Any], port_name: str) -> int:
    ports = [p for c in pod.get("spec", {}).get("containers") or [] for p in c.get("ports") or []]
    named = [p for p in ports if p.get("name") == port_name]
    chosen = (named or ports or [{"containerPort": DEFAULT_PORT}])[0]
    return int(chosen["containerPort"])


def parse_load(text: str) -> tuple[float, float] | None:
    """(waiting, running) summed over the samples of each gauge; None if either gauge is absent."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (WAITING, RUNNING):
            sums[family.name] = sum(s.value for s in family.samples if s.name == family.name)
    if WAITING not in sums or RUNNING not in sums:
        return None
    return sums[WAITING], sums[RUNNING]


async def scrape_pod(client: httpx.AsyncClient, target: PodTarget) -> PodLoad:
    try:
        response = await client.get(target.metrics_url)
        response.raise_for_status()
        load = parse_load(response.text)
    except (httpx.HTTPError, ValueError):
        # Timeouts, refused connections, 5xx and unparsable bodies alike: we know nothing.
        load = None
    if load is None:
        return PodLoad(target.name, None, None)
    return PodLoad(target.name, *load)


async def scrape_pods(
    targets: Sequence[PodTarget], timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> list[PodLoad]:
    """Scrape all targets concurrently; each one is bounded by `timeout` seconds in all."""
    # trust_env=False: a cluster-wide HTTP(S)_PROXY must not carry pod-IP traffic.
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), trust_env=False) as client:
        return list(await asyncio.gather(*(_bounded(client, t, timeout) for t in targets)))


async def _bounded(client: httpx.AsyncClient, target: PodTarget, timeout: float) -> PodLoad:
    # httpx's timeout is per phase (connect, read...); a slow drip could outlast it, so cap the total.
    try:
        return await asyncio.wait_for(scrape_pod(client, target), timeout)
    except asyncio.TimeoutError:
        return PodLoad(target.name, None, None)
