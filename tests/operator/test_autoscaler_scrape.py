"""Scraping: the runtime's own /metrics exposition parses to its figures; a replica that does not
answer (hangs, refuses, errors, lacks the gauges) comes back unknown, never as zero."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from prometheus_client import generate_latest

from pagoda.operator.autoscaler.policy import PodLoad
from pagoda.operator.autoscaler.scrape import PodTarget, parse_load, ready_targets, scrape_pods
from pagoda.runtime.frontend.server.metrics import ServerMetrics

pytestmark = pytest.mark.timeout(60)


def runtime_exposition(waiting: int, running: int) -> str:
    """What `pagoda serve` answers on /metrics, from the runtime's own metrics module."""
    stats = {
        "num_waiting": waiting,
        "num_running": running,
        "kv_cache_usage": 0.5,
        "kv_capacity_tokens": 4096,
    }
    metrics = ServerMetrics("tiny", lambda: stats)
    return generate_latest(metrics.registry).decode()


def test_parses_the_runtime_exposition():
    assert parse_load(runtime_exposition(waiting=7, running=3)) == (7.0, 3.0)
    assert parse_load(runtime_exposition(waiting=0, running=0)) == (0.0, 0.0)


def test_missing_gauges_are_unknown_not_zero():
    text = runtime_exposition(2, 1)
    without_waiting = (
        "\n".join(line for line in text.splitlines() if "num_requests_waiting" not in line) + "\n"
    )
    assert parse_load(without_waiting) is None
    assert parse_load("") is None


def pod(
    name: str, ip: str | None = "10.0.0.1", ready: bool = True, deleting: bool = False, ports=None
) -> dict:
    meta = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    containers = [
        {
            "name": "runtime",
            "ports": ports if ports is not None else [{"name": "http", "containerPort": 8000}],
        }
    ]
    return {"metadata": meta, "spec": {"containers": containers}, "status": status}


def test_ready_targets_skip_unready_terminating_and_ipless_pods():
    pods = [
        pod(
            "b",
            "10.0.0.2",
            ports=[{"name": "metrics", "containerPort": 9000}, {"name": "http", "containerPort": 8080}],
        ),
        pod("a", "10.0.0.1"),
        pod("starting", ready=False),
        pod("going", deleting=True),
        pod("pending", ip=None),
        pod("portless", "10.0.0.3", ports=[]),
    ]
    assert ready_targets(pods) == [
        PodTarget("a", "10.0.0.1", 8000),
        PodTarget("b", "10.0.0.2", 8080),
        PodTarget("portless", "10.0.0.3", 8000),
    ]
    assert PodTarget("v6", "fd00::1", 8000).metrics_url == "http://[fd00::1]:8000/metrics"


@pytest.fixture()
async def replicas():
    """Four HTTP servers on 127.0.0.1: healthy, hanging, failing, and one without the gauges."""
    hang = asyncio.Event()

    async def healthy(_):
        return web.Response(text=runtime_exposition(waiting=5, running=2), content_type="text/plain")

    async def hanging(_):
        await hang.wait()
        return web.Response(text=runtime_exposition(0, 0))

    async def failing(_):
        return web.Response(status=500, text="engine died")

    async def bare(_):
        return web.Response(text="# nothing here\n")

    runners, ports = [], {}
    for name, handler in (("healthy", healthy), ("hanging", hanging), ("failing", failing), ("bare", bare)):
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        ports[name] = runner.addresses[0][1]
    # A port that refuses connections: bound once, then closed.
    probe = web.AppRunner(web.Application())
    await probe.setup()
    site = web.TCPSite(probe, "127.0.0.1", 0)
    await site.start()
    ports["closed"] = probe.addresses[0][1]
    await probe.cleanup()
    yield ports
    hang.set()
    for runner in runners:
        await runner.cleanup()


async def test_scrape_marks_silent_replicas_unknown_within_the_timeout(replicas):
    targets = [PodTarget(name, "127.0.0.1", port) for name, port in replicas.items()]
    # The hanging replica never answers until the test ends, so returning at all proves it was cut
    # at the timeout; wait_for only turns a regression into a failure instead of a hung test.
    loads = {load.name: load for load in await asyncio.wait_for(scrape_pods(targets, timeout=0.5), 60)}

    assert loads["healthy"] == PodLoad("healthy", 5.0, 2.0)
    for silent in ("hanging", "failing", "bare", "closed"):
        assert loads[silent] == PodLoad(silent, None, None), silent
        assert not loads[silent].known
