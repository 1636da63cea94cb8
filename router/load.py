"""What each replica carries: the router's own in-flight count, and the replica's queue gauges.

LeastLoad needs both. The in-flight count is exact but only sees this router; the replica's
num_requests_running + num_requests_waiting sees every client but is as old as the last scrape.
The load is the scraped figure plus whatever this router sent since that scrape, and never less
than what this router has in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger("pagoda.router")

# The runtime's gauges, under Pagoda's prefix and under vLLM's (either may be exported).
RUNNING = ("pagoda:num_requests_running", "vllm:num_requests_running")
WAITING = ("pagoda:num_requests_waiting", "vllm:num_requests_waiting")


def parse_queue(text: str) -> float | None:
    """num_requests_running + num_requests_waiting from a /metrics page; None if neither is there."""
    total, found = 0.0, False
    for family in text_string_to_metric_families(text):
        if family.name in RUNNING or family.name in WAITING:
            found = True
            total += sum(s.value for s in family.samples if s.name == family.name)
    return total if found else None


@dataclass(slots=True)
class _Load:
    in_flight: int = 0
    scraped: float | None = None
    in_flight_at_scrape: int = 0


class Loads:
    def __init__(self):
        self._loads: dict[str, _Load] = {}

    def _get(self, url: str) -> _Load:
        return self._loads.setdefault(url, _Load())

    def in_flight(self, url: str) -> int:
        load = self._loads.get(url)
        return load.in_flight if load else 0

    def load(self, url: str) -> float:
        load = self._loads.get(url)
        if load is None:
            return 0.0
        if load.scraped is None:
            return float(load.in_flight)
        return max(float(load.in_flight), load.scraped + load.in_flight - load.in_flight_at_scrape)

    @contextlib.contextmanager
    def track(self, url: str):
        load = self._get(url)
        load.in_flight += 1
        try:
            yield
        finally:
            load.in_flight -= 1

    def record_scrape(self, url: str, queue: float | None) -> None:
        load = self._get(url)
        load.scraped = queue
        load.in_flight_at_scrape = load.in_flight

    def forget_except(self, urls: Iterable[str]) -> None:
        keep = set(urls)
        for url in [u for u, load in self._loads.items() if u not in keep and load.in_flight == 0]:
            del self._loads[url]


async def scrape(client: httpx.AsyncClient, url: str) -> float | None:
    try:
        response = await client.get(f"{url}/metrics")
        response.raise_for_status()
        return parse_queue(response.text)
    except (httpx.HTTPError, ValueError):
        return None  # unknown: LeastLoad falls back to the in-flight count


async def scrape_forever(loads: Loads, urls_now, interval: float, timeout: float = 2.0) -> None:
    """Every `interval` seconds, scrape every endpoint `urls_now()` returns."""
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        while True:
            urls = sorted(set(urls_now()))
            results = await asyncio.gather(*(scrape(client, u) for u in urls))
            for url, queue in zip(urls, results):
                loads.record_scrape(url, queue)
            loads.forget_except(urls)
            await asyncio.sleep(interval)
