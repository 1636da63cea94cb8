"""The kopf handlers, in-process, against an emulated API server (kmock): the whole lifecycle.

The test plays the Kubernetes controllers the operator relies on: it marks the loader Job complete
(with the plan container's termination message on its pod) and the Deployment's replicas ready.
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path

import kmock
import kubernetes
import pytest
from crd_check import admit
from kopf_harness import eventually, running_operator
from test_operator_chart import render

from pagoda.operator.builders.meta import loader_job_name
from pagoda.operator.config import OperatorConfig
from pagoda.operator.k8s import Cluster
from pagoda.operator.spec import ModelServer

NS = "default"
CONFIG = OperatorConfig(runtime_image="registry.local/pagoda-runtime:test", retry_base_seconds=0.5)
DEMO_MODEL = Path(__file__).resolve().parents[2] / "e2e" / "demo-model"


@functools.cache
def plan_output() -> dict:
    """What the loader's plan container prints: the real `pagoda plan` on the demo model, 2 GiB."""
    from pagoda.runtime.plan import make_plan

    return make_plan(str(DEMO_MODEL), 2.0, dtype="float32")


pytestmark = pytest.mark.timeout(600)  # a hang guard: each wait below is on state
call = asyncio.to_thread  # the API server runs on this loop: never block it


def modelserver(name: str, **spec) -> dict:
    obj = {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"model": {"uri": "hf://org/tiny"}, "resources": {"gpus": 0, "memory": "2Gi"}, **spec},
    }
    defaulted, errors = admit(obj)  # as the API server would store it
    assert errors == []
    return defaulted


def set_status(cluster: Cluster, kind: str, name: str, status: dict) -> None:
    """What the Job / Deployment controllers would write, through the status subresource."""
    from pagoda.operator.k8s import TYPED

    api_name, resource = TYPED[kind]
    api = getattr(kubernetes.client, api_name)(cluster.api)
    getattr(api, f"patch_namespaced_{resource}_status")(
        name, NS, {"status": status}, _content_type="application/merge-patch+json", _preload_content=False
    )


def finish_job(cluster: Cluster, job_name: str, with_plan: bool = True) -> None:
    if with_plan:
        cluster.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{job_name}-x1", "namespace": NS, "labels": {"job-name": job_name}},
                "spec": {"containers": [{"name": "plan", "image": "x"}]},
                "status": {
                    "containerStatuses": [
                        {
                            "name": "plan",
                            "image": "x",
                            "imageID": "x",
                            "ready": False,
                            "restartCount": 0,
                            "state": {
                                "terminated": {"exitCode": 0, "message": json.dumps(plan_output(), indent=2)}
                            },
                        }
                    ]
                },
            }
        )
    set_status(
        cluster, "Job", job_name, {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    )


def make_ready(cluster: Cluster, name: str, replicas: int) -> None:
    gen = cluster.get("Deployment", NS, name)["metadata"]["generation"]
    set_status(
        cluster,
        "Deployment",
        name,
        {
            "observedGeneration": gen,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "conditions": [{"type": "Available", "status": "True"}],
        },
    )


def status(cluster: Cluster, name: str) -> dict:
    return (cluster.get("ModelServer", NS, name) or {}).get("status") or {}


def phase_is(cluster: Cluster, name: str, phase: str):
    """The phase, written by a pass that saw the ModelServer's latest spec (not an earlier one's)."""

    def check():
        ms = cluster.get("ModelServer", NS, name) or {}
        st = ms.get("status") or {}
        current = st.get("observedGeneration") == (ms.get("metadata") or {}).get("generation")
        return st if current and st.get("phase") == phase else None

    return check


def operator_passes(apiserver, plural: str) -> int:
    """The operator's writes of one kind of child (server-side apply is a PATCH): one per pass."""
    return sum(
        1
        for request in apiserver
        if isinstance(request, kmock.Request) and request.method == "PATCH" and request.resource is not None
        and request.resource.plural == plural and request.headers.get("User-Agent") != "pagoda-tests"
    )


def condition(st: dict, type_: str) -> dict:
    return next(c for c in st["conditions"] if c["type"] == type_)


def make_test_client() -> Cluster:
    """The test's own client, told apart from the operator's by its user agent."""
    cluster = Cluster.from_environment()
    cluster.api.user_agent = "pagoda-tests"
    return cluster


async def test_lifecycle(apiserver):
    cluster = make_test_client()
    async with running_operator(config=CONFIG):
        # create -> PVC and Job. Scaling is delegated to an HPA (which nothing runs here), so the
        # operator's own autoscaler leaves spec.replicas to this test.
        body = modelserver(
            "demo",
            cache={"retainOnDelete": False, "accessMode": "ReadWriteMany"},
            scaling={"mode": "hpa", "minReplicas": 1, "maxReplicas": 4},
        )
        await call(cluster.create, body)
        job = loader_job_name(ModelServer.from_body(body))
        await eventually(
            lambda: cluster.get("PersistentVolumeClaim", NS, "demo-cache") and cluster.get("Job", NS, job)
        )
        st = await eventually(phase_is(cluster, "demo", "Loading"))
        assert condition(st, "CacheReady")["status"] == "False"
        assert (await call(cluster.get, "Deployment", NS, "demo")) is None  # not before the cache is ready

        # Job succeeded -> Deployment and Service, plan figures in status
        await call(finish_job, cluster, job)
        st = await eventually(phase_is(cluster, "demo", "Starting"))
        assert (await call(cluster.get, "Service", NS, "demo"))["spec"]["ports"][0]["name"] == "http"
        assert condition(st, "CacheReady")["status"] == "True"
        plan = plan_output()
        assert st["plan"] == {
            "fits": True,
            "gpuMemoryGiB": 2.0,
            "weightBytes": plan["weight_bytes"],
            "kvBytesPerToken": plan["kv_bytes_per_token"],
            "kvCapacityTokens": plan["kv_capacity_tokens"],
            "maxConcurrentSeqs": plan["max_concurrent_seqs"],
        }
        assert st["endpoint"] == "http://demo.default.svc:8000/v1"
        assert st["selector"] == "app.kubernetes.io/component=server,pagoda.dev/modelserver=demo"
        deployment = await call(cluster.get, "Deployment", NS, "demo")
        owner = (await call(cluster.get, "ModelServer", NS, "demo"))["metadata"]["uid"]
        assert deployment["metadata"]["ownerReferences"][0]["uid"] == owner
        # The autoscaler's manifests (pagoda.operator.autoscaler.manifests) are applied alongside.
        hpa = await call(cluster.get, "HorizontalPodAutoscaler", NS, "demo")
        assert hpa["spec"]["maxReplicas"] == 4 and hpa["metadata"]["ownerReferences"][0]["uid"] == owner

        # Deployment ready -> phase Ready
        await call(make_ready, cluster, "demo", 1)
        st = await eventually(phase_is(cluster, "demo", "Ready"))
        assert condition(st, "Available")["status"] == "True"
        assert condition(st, "Progressing")["reason"] == "Complete"
        assert st["readyReplicas"] == 1

        # spec update -> Deployment patched
        await call(
            cluster.patch, "ModelServer", NS, "demo", {"spec": {"replicas": 2, "engine": {"maxNumSeqs": 8}}}
        )

        def patched():
            d = cluster.get("Deployment", NS, "demo")
            args = d["spec"]["template"]["spec"]["containers"][0]["args"]
            return d["spec"]["replicas"] == 2 and args[args.index("--max-num-seqs") + 1] == "8"

        await eventually(patched)
        st = await eventually(phase_is(cluster, "demo", "Starting"))  # 1/2 ready
        await call(make_ready, cluster, "demo", 2)
        await eventually(phase_is(cluster, "demo", "Ready"))

        # A new model URI reloads the cache first; the old pods serve meanwhile.
        old_args = (await call(cluster.get, "Deployment", NS, "demo"))["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
        await call(cluster.patch, "ModelServer", NS, "demo", {"spec": {"model": {"uri": "hf://org/tiny@v2"}}})
        new_job = loader_job_name(ModelServer.from_body(body), "hf://org/tiny@v2")
        await eventually(lambda: cluster.get("Job", NS, new_job))
        await eventually(phase_is(cluster, "demo", "Loading"))
        assert (await call(cluster.get, "Deployment", NS, "demo"))["spec"]["template"]["spec"]["containers"][
            0
        ]["args"] == old_args
        await call(finish_job, cluster, new_job)
        await eventually(
            lambda: (
                cluster.get("Deployment", NS, "demo")["spec"]["template"]["spec"]["containers"][0]["args"][0]
                == "/models/hf/org/tiny/v2"
            )
        )
        await eventually(lambda: cluster.get("Job", NS, job) is None)  # the stale loader is cleaned up
        await call(make_ready, cluster, "demo", 2)
        await eventually(phase_is(cluster, "demo", "Ready"))

    # restart -> no duplicates and no change to the Deployment. (The operator re-applies with
    # server-side apply; a real API server keeps a no-op apply's resourceVersion, the emulator bumps
    # it, so the spec is compared here.)
    before = list(apiserver.created)
    spec_before = (await call(cluster.get, "Deployment", NS, "demo"))["spec"]
    passes = operator_passes(apiserver, "deployments")
    async with running_operator(config=CONFIG):
        # The resume handler's pass has applied the Deployment again (and changed nothing).
        await eventually(lambda: operator_passes(apiserver, "deployments") > passes)
        created = [c for c in apiserver.created[len(before) :] if c[0] != "events"]
        assert created == []
        assert (await call(cluster.get, "Deployment", NS, "demo"))["spec"] == spec_before
        assert (await call(status, cluster, "demo"))["phase"] == "Ready"

        # delete -> the finalizer deletes the cache PVC (retainOnDelete: false)
        assert (
            "pagoda.dev/finalizer"
            in (await call(cluster.get, "ModelServer", NS, "demo"))["metadata"]["finalizers"]
        )
        await call(cluster.delete, "ModelServer", NS, "demo")
        await eventually(lambda: cluster.get("ModelServer", NS, "demo") is None)
        assert (await call(cluster.get, "PersistentVolumeClaim", NS, "demo-cache")) is None
    for plural in ("persistentvolumeclaims", "deployments", "services"):
        assert len(apiserver.creations(plural)) == 1, plural
    assert len(apiserver.creations("jobs")) == 2  # one per model URI

    # Every call the operator made is granted by the chart's RBAC.
    (role,) = [d for d in render({}) if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "pagoda"]
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    used = {(g, r, v) for ua, g, r, v in apiserver.calls if ua != "pagoda-tests"}
    assert len(used) >= 15 and used - granted == set(), used - granted


async def test_retained_cache_and_failed_loader(apiserver):
    cluster = make_test_client()
    # The Failed phase lasts until the retry, retry_base_seconds after the failure: long enough here
    # for the polls below to see it on a loaded machine (at 0.5 s they could miss it and wait forever).
    async with running_operator(config=CONFIG.with_overrides(retry_base_seconds=3.0)):
        body = modelserver("flaky")
        await call(cluster.create, body)
        job = loader_job_name(ModelServer.from_body(body))
        await eventually(lambda: cluster.get("Job", NS, job))
        await call(
            set_status,
            cluster,
            "Job",
            job,
            {
                "failed": 3,
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                    }
                ],
            },
        )
        st = await eventually(phase_is(cluster, "flaky", "Failed"))
        assert "BackoffLimitExceeded" in st["message"]
        assert condition(st, "CacheReady")["reason"] == "LoaderFailed"
        assert st["loader"]["failures"] == 1
        # Retried with backoff: the failed Job is deleted and created anew.
        # the first retry waits out the backoff; the default deadline is a hang guard for a loaded machine
        await eventually(lambda: len(apiserver.creations("jobs")) == 2)
        await eventually(phase_is(cluster, "flaky", "Loading"))
        await call(finish_job, cluster, job, False)
        st = await eventually(phase_is(cluster, "flaky", "Starting"))
        assert st["loader"] == {"failures": 0}

        # retainOnDelete (the default): the PVC outlives the ModelServer.
        await call(cluster.delete, "ModelServer", NS, "flaky")
        await eventually(lambda: cluster.get("ModelServer", NS, "flaky") is None)
        assert (await call(cluster.get, "PersistentVolumeClaim", NS, "flaky-cache")) is not None


def events(apiserver, reason: str) -> list[dict]:
    return [
        obj.raw
        for (resource, _, _), obj in apiserver.objects.items()
        if resource.plural == "events" and not obj.deleted and obj.get("reason") == reason
    ]


async def test_cache_smaller_than_the_plans_weights_is_flagged(apiserver):
    """The real `pagoda plan` on the demo model (about 43 MB of float32 weights) against a 16Mi
    claim: the pods still serve, the condition and a Warning name spec.cache.size, and raising the
    size expands the claim and clears it."""
    cluster = make_test_client()
    async with running_operator(config=CONFIG):
        body = modelserver("small", cache={"size": "16Mi"})
        await call(cluster.create, body)
        job = loader_job_name(ModelServer.from_body(body))
        await eventually(lambda: cluster.get("Job", NS, job))
        await call(finish_job, cluster, job)
        st = await eventually(phase_is(cluster, "small", "Starting"), timeout=60)
        flagged = condition(st, "CacheSizeSufficient")
        assert (flagged["status"], flagged["reason"]) == ("False", "CacheTooSmall")
        assert "spec.cache.size 16Mi" in flagged["message"]
        warning = (await eventually(lambda: events(apiserver, "CacheTooSmall"), timeout=60))[0]
        assert warning["type"] == "Warning" and "raise spec.cache.size" in warning["message"]
        assert condition(st, "CacheReady")["status"] == "True"  # flagged, not refused

        await call(cluster.patch, "ModelServer", NS, "small", {"spec": {"cache": {"size": "1Gi"}}})
        await eventually(lambda: condition(status(cluster, "small"), "CacheSizeSufficient")["status"] == "True",
                         timeout=60)  # fmt: skip
        claim = await call(cluster.get, "PersistentVolumeClaim", NS, "small-cache")
        assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
