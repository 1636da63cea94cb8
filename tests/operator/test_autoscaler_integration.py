"""The operator's autoscaler end to end on the CPU: kopf and the timer against an emulated API server
(kmock), three real `pagoda serve` processes on 127.0.0.2-4 standing in for the pods, and a bounded
load generator. The test plays the reconcile and the Deployment controller: it registers a Pod
object (with the process's address as its pod IP) for each replica the ModelServer's spec.replicas
asks for (the autoscaler's one write; the reconcile copies it into the Deployment, as
tests/kube/test_kube_scaling.py shows on a real API server), and routes the load to those.

What it checks (issue 8): replicas rise under a queue, in proportion (1 -> 3, not 1 -> 2 -> 3), hold
while the queue lasts, do not fall while a replica stops answering, and fall back one step at a
time once the queue has been empty for the delay; with status, condition and Events on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import helm_python as helm
import httpx
import kmock
import kopf
import pytest
import yaml
from kopf_harness import eventually
from serve_process import ServeProcess, free_port, pagoda_serve

from pagoda.operator.autoscaler.timer import register
from pagoda.operator.builders import meta
from pagoda.operator.builders.deployment import build_deployment
from pagoda.operator.config import OperatorConfig
from pagoda.operator.k8s import Cluster
from pagoda.operator.spec import ModelServer
from pagoda.runtime.tools.tiny_models import build_tiny_model

CHART = Path(__file__).resolve().parents[2] / "charts" / "pagoda"
NS, NAME, MODEL = "default", "tiny", "tiny"
IPS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
DELAY = 4  # scaleDownDelaySeconds
SCALING = {
    "mode": "operator",
    "minReplicas": 1,
    "maxReplicas": 3,
    "targetWaitingRequests": 1,
    "scrapeIntervalSeconds": 1,
    "scaleUpStabilizationSeconds": 1,
    "scaleDownDelaySeconds": DELAY,
}

pytestmark = pytest.mark.timeout(200)


@dataclass
class Replica:
    ip: str
    port: int
    server: ServeProcess

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def process(self) -> subprocess.Popen:
        return self.server.process


def common_free_port(ips) -> int:
    """One port free on every address, so the replicas look alike (as pods on one containerPort)."""
    for _ in range(50):
        port = free_port(ips[0])
        try:
            for ip in ips:
                with socket.socket() as s:
                    s.bind((ip, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no common free port")


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Three `pagoda serve` processes on the tiny model, one request at a time each (so requests queue)."""
    model = tmp_path_factory.mktemp("model") / "tiny"
    build_tiny_model(model, "llama")
    port = common_free_port(IPS)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    logs = tmp_path_factory.mktemp("logs")
    flags = ("--device", "cpu", "--max-num-seqs", "1", "--served-model-name", MODEL, "--log-level", "warning")
    with contextlib.ExitStack() as stack:
        started = [  # all three start at once, then each is awaited
            Replica(ip, port, stack.enter_context(
                pagoda_serve(model, *flags, log_path=logs / f"{ip}.log", host=ip, port=port, wait=False, env=env)
            ))
            for ip in IPS
        ]
        for r in started:
            r.server.wait_healthy()
        yield started


class LoadGenerator:
    """Closed-loop clients, each with one request in flight, spread round-robin over `targets`."""

    def __init__(self, workers: int, max_tokens: int = 48):
        self.workers, self.max_tokens = workers, max_tokens
        self.targets: list[str] = []
        self.completed = 0
        self._turn = itertools.count()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def _worker(self, client: httpx.AsyncClient, deadline: float) -> None:
        while not self._stop.is_set() and time.monotonic() < deadline:
            if not self.targets:
                await asyncio.sleep(0.05)
                continue
            url = self.targets[next(self._turn) % len(self.targets)]
            body = {
                "model": MODEL,
                "prompt": "the queue grows",
                "max_tokens": self.max_tokens,
                "ignore_eos": True,
            }
            response = await client.post(f"{url}/v1/completions", json=body)
            assert response.status_code == 200, response.text
            self.completed += 1

    @contextlib.asynccontextmanager
    async def running(self, limit_s: float):
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            deadline = time.monotonic() + limit_s  # bounded, whatever happens to the test
            self._tasks = [asyncio.create_task(self._worker(client, deadline)) for _ in range(self.workers)]
            try:
                yield self
            finally:
                self._stop.set()
                await asyncio.gather(*self._tasks)  # in-flight requests finish; surfaces failures


class TestClock:
    """The autoscaler's clock (memo.clock): real monotonic time until held, then only what the
    test moves it by. Each scrape-and-decide tick reads it once, so its reads count the ticks."""

    __test__ = False  # not a test class

    def __init__(self):
        self.reads = 0
        self._held: float | None = None

    def __call__(self) -> float:
        self.reads += 1
        return time.monotonic() if self._held is None else self._held

    def hold(self) -> None:
        self._held = time.monotonic()

    def advance(self, seconds: float) -> None:
        assert self._held is not None, "hold the clock first"
        self._held += seconds

    async def ticks(self, count: int) -> None:
        """Until `count` more ticks have begun, so all but the last have also finished (one daemon
        per ModelServer runs its ticks one after another): their decisions are written."""
        target = self.reads + count
        await eventually(lambda: self.reads >= target, timeout=30)


def pod_object(ms: ModelServer, index: int, replica: Replica) -> dict:
    """What the ReplicaSet and the kubelet would make: labelled by the selector, Ready, with a pod IP."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{NAME}-{index}",
            "namespace": NS,
            "labels": meta.labels(ms, meta.SERVER_COMPONENT),
        },
        "spec": {
            "containers": [
                {"name": "runtime", "image": "x", "ports": [{"name": "http", "containerPort": replica.port}]}
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": replica.ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


async def deployment_controller(
    cluster: Cluster, ms: ModelServer, replicas: list[Replica], load: LoadGenerator
):
    """Keep one Ready pod per desired replica (newest removed first) and route the load to them."""
    present: set[int] = set()
    while True:
        desired = (await asyncio.to_thread(cluster.get, "ModelServer", NS, NAME))["spec"]["replicas"]
        for i, replica in enumerate(replicas):
            if i < desired and i not in present:
                await asyncio.to_thread(cluster.create, pod_object(ms, i, replica))
                present.add(i)
            elif i >= desired and i in present:
                await asyncio.to_thread(cluster.delete, "Pod", NS, f"{NAME}-{i}")
                present.discard(i)
        load.targets = [replicas[i].url for i in sorted(present)]
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def autoscaler(cluster: Cluster, clock: TestClock):
    """kopf with only the autoscaler's daemon registered, on its own loop in
    a thread, as in production: kopf owns its loop and cancels what it finds there on stop."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(kopf.login_via_client)

    @kopf.on.startup(registry=registry)
    def settings(settings: kopf.OperatorSettings, **_):
        settings.scanning.disabled = True
        settings.posting.level = logging.INFO

    register(registry)
    stop, ready = threading.Event(), threading.Event()
    operator = kopf.operator(
        registry=registry, standalone=True, namespaces=[NS], memo=kopf.Memo(cluster=cluster, clock=clock),
        stop_flag=stop, ready_flag=ready,
    )  # fmt: skip
    thread = threading.Thread(target=asyncio.run, args=(operator,), name="kopf-autoscaler", daemon=True)
    thread.start()
    assert await asyncio.to_thread(ready.wait, 15), "the operator did not start"
    try:
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive(), "the operator did not stop"


def replicas_history(apiserver) -> list[int]:
    """Every spec.replicas the ModelServer has had, as the API server stored them, without repeats."""
    versions = apiserver.objects["pagoda.dev/v1alpha1/modelservers", NS, NAME].history
    values = [v["spec"]["replicas"] for v in versions if v is not None]
    return [n for n, _ in itertools.groupby(values)]


def scale_writes(apiserver) -> list[tuple[str, int]]:
    """The replica counts written through /scale subresources, in order: (plural, replicas)."""
    return [
        (request.resource.plural, request.data["spec"]["replicas"])
        for request in apiserver
        if isinstance(request, kmock.Request) and request.subresource == "scale" and request.method == "PATCH"
    ]


def events(apiserver, reason: str) -> list[dict]:
    return [
        obj.raw
        for (resource, _, _), obj in apiserver.objects.items()
        if resource.plural == "events" and not obj.deleted and obj.get("reason") == reason
    ]


def chart_grants() -> set[tuple[str, str, str]]:
    """(group, resource, verb) that the Helm chart's ClusterRole grants the operator."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render({}, name="pagoda", namespace="pagoda-system")
    docs = [
        doc
        for path, text in manifests.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "pagoda"]  # not the router's
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


async def test_replicas_follow_the_queue(apiserver, replicas):
    cluster = Cluster.from_environment()
    cluster.api.user_agent = "pagoda-tests"  # the test's own calls, told apart from the operator's
    body = {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "model": {"uri": "hf://org/tiny", "name": MODEL},
            "resources": {"gpus": 0},
            "replicas": 1,
            "engine": {"maxNumSeqs": 1},
            "scaling": SCALING,
        },
    }
    created = await asyncio.to_thread(cluster.create, body)
    ms = ModelServer.from_body(created)
    await asyncio.to_thread(cluster.ensure, build_deployment(ms, OperatorConfig()))

    def status() -> dict:
        return cluster.get("ModelServer", NS, NAME).get("status") or {}

    def scaling_condition() -> dict:
        return next((c for c in status().get("conditions") or [] if c["type"] == "ScalingActive"), {})

    def deployment_replicas() -> int:
        """What the Deployment is asked for: the ModelServer's spec.replicas (see the docstring)."""
        return cluster.get("ModelServer", NS, NAME)["spec"]["replicas"]

    async def now(check):
        """A sync API read from the test body: in a thread, as the API server shares this loop."""
        return await asyncio.to_thread(check)

    load = LoadGenerator(workers=6)
    clock = TestClock()
    async with autoscaler(Cluster.from_environment(), clock):
        controller = asyncio.create_task(deployment_controller(cluster, ms, replicas, load))
        try:
            # Idle at one replica: measured, within target.
            await eventually(lambda: scaling_condition()["reason"] == "WithinTarget", timeout=10)
            assert (await now(scaling_condition))["status"] == "True"
            assert await now(deployment_replicas) == 1

            async with load.running(limit_s=60):
                # Six clients on one replica that runs one at a time: ~5 waiting against a target of 1.
                started = time.monotonic()
                await eventually(lambda: deployment_replicas() == 3, timeout=20)
                rise_s = time.monotonic() - started
                assert replicas_history(apiserver) == [1, 3], (
                    "in proportion to the queue, not one pod at a time"
                )
                modelserver = await now(lambda: cluster.get("ModelServer", NS, NAME))
                assert modelserver["spec"]["replicas"] == 3
                assert scale_writes(apiserver) == [("modelservers", 3)]  # one writer
                st = await eventually(lambda: status().get("desiredReplicas") == 3 and status())
                assert st["lastScaleTime"]
                assert st["autoscaling"]["reason"] in ("QueueAboveTarget", "AtMaxReplicas")
                # kopf posts events in the background.
                await eventually(lambda: len(events(apiserver, "ScaledUp")) == 1)

                # Queue spread over three replicas: still waiting, so no scale-down, and no flapping.
                await eventually(lambda: len(load.targets) == 3)
                await asyncio.sleep(DELAY + 2)
                assert await now(deployment_replicas) == 3
                assert load.completed > 0
            assert replicas_history(apiserver) == [1, 3]

            # Load stopped: from here the autoscaler's clock stands still unless the test moves it, so
            # every delay below is passed by moving the clock, none by sleeping, and no step can come
            # early or late on a loaded machine. The queue empties at the held time.
            clock.hold()
            # One replica stops answering (SIGSTOP: it accepts nothing, answers nothing).
            silent = replicas[2]
            silent.process.send_signal(signal.SIGSTOP)
            try:
                await eventually(lambda: status()["autoscaling"]["unknownReplicas"] == 1, timeout=10)
                assert (await now(scaling_condition))["reason"] == "ReplicasUnknown"
                clock.advance(2 * DELAY + 2)  # well past the delay: the queue is empty elsewhere
                await clock.ticks(2)
                assert await now(deployment_replicas) == 3, "a silent replica must not cause a scale-down"
                assert replicas_history(apiserver) == [1, 3]
            finally:
                silent.process.send_signal(signal.SIGCONT)

            # All answer, queue empty: down one step per delay, to minReplicas. The calm is counted
            # afresh from when all answered, not from when the queue emptied (2 * DELAY + 2 ago on
            # this clock, which would step down at the first tick that sees every replica).
            async def calm_for(seconds: float, replicas: int) -> None:
                await eventually(lambda: (a := status()["autoscaling"])["unknownReplicas"] == 0
                                 and a["currentReplicas"] == replicas, timeout=DELAY + 10)  # fmt: skip
                await clock.ticks(2)
                assert await now(deployment_replicas) == replicas
                if seconds:
                    clock.advance(seconds)
                    await clock.ticks(2)
                    assert await now(deployment_replicas) == replicas, f"down before {DELAY}s of calm"
                st = await now(status)
                assert (st["autoscaling"]["reason"], st["autoscaling"]["calmSeconds"]) == ("ScaleDownDelayed", seconds)

            await calm_for(0, replicas=3)
            await calm_for(DELAY - 0.5, replicas=3)
            clock.advance(0.5)
            await eventually(lambda: deployment_replicas() == 2, timeout=10)
            # The streak starts again at two replicas: another full delay.
            await calm_for(DELAY - 0.5, replicas=2)
            clock.advance(0.5)
            await eventually(lambda: deployment_replicas() == 1, timeout=10)
            assert replicas_history(apiserver) == [1, 3, 2, 1]
            assert scale_writes(apiserver)[1:] == [("modelservers", 2), ("modelservers", 1)]
            await eventually(lambda: status()["autoscaling"]["currentReplicas"] == 1, timeout=10)
            clock.advance(DELAY + 1)
            await clock.ticks(2)
            assert await now(deployment_replicas) == 1  # never below minReplicas
            await eventually(lambda: len(events(apiserver, "ScaledDown")) == 2)
            assert len(events(apiserver, "ScaledUp")) == 1
            st = await now(status)
            assert st["desiredReplicas"] == 1
            assert st["autoscaling"]["waitingRequests"] == 0
            print(f"scaled up in {rise_s:.1f}s; {load.completed} requests served")

            # Every call the autoscaler made is one the chart's RBAC grants.
            used = {(g, r, v) for agent, g, r, v in apiserver.calls if agent != "pagoda-tests"}
            assert {("", "pods", "list"), ("pagoda.dev", "modelservers/scale", "patch")} <= used
            assert used - chart_grants() == set()
        finally:
            controller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await controller
