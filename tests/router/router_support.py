"""Real processes on loopback: two `pagoda serve` replicas of the demo model (served as `alpha`
and `beta`), and `pagoda router` processes in front of them, configured by static files."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from serve_process import ServeProcess, free_port, pagoda_serve

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = Path(os.environ.get("PAGODA_DEMO_MODEL", ROOT / "e2e" / "demo-model"))
REPLICA_FLAGS = ("--dtype", "float32", "--device", "cpu", "--num-kv-blocks", "256", "--log-level", "warning")


@pytest.fixture(scope="session")
def demo_model() -> Path:
    if not (DEMO_MODEL / "config.json").exists():
        pytest.skip(f"{DEMO_MODEL} holds no checkpoint (see tests/demo_model/conftest.py)")
    return DEMO_MODEL


@pytest.fixture(scope="session")
def replicas(demo_model, tmp_path_factory) -> dict[str, ServeProcess]:
    """{"alpha": replica, "beta": replica}, started side by side."""
    logs = tmp_path_factory.mktemp("replicas")
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(pagoda_serve(demo_model, "--served-model-name", name, *REPLICA_FLAGS,
                                                          log_path=logs / f"{name}.log", wait=False, cwd=ROOT))
                   for name in ("alpha", "beta")}
        for server in servers.values():
            server.wait_healthy()
        yield servers


def write_static(path: Path, models: list[dict]) -> Path:
    """Write the router's static file atomically (the router polls it and must never see half)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"models": models}))
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def router_process(static: Path, *flags: str, log_path: Path):
    port = free_port()
    cmd = [sys.executable, "-m", "pagoda.runtime.cli", "router", "--static", str(static), "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", *flags]
    with open(log_path, "wb") as log:
        router = ServeProcess(f"http://127.0.0.1:{port}",
                              subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), log_path)
        try:
            router.wait_healthy(timeout=60)
            yield router
        finally:
            router.stop()


@pytest.fixture(scope="session")
def router(replicas, tmp_path_factory):
    """A router for alpha (alias `a`, PrefixHash) and beta (LeastLoad)."""
    folder = tmp_path_factory.mktemp("router")
    static = write_static(folder / "models.yaml", [
        {"name": "alpha", "aliases": ["a"], "endpoints": [replicas["alpha"].url],
         "loadBalancing": {"strategy": "PrefixHash"}},
        {"name": "beta", "endpoints": [replicas["beta"].url]},
    ])
    with router_process(static, log_path=folder / "router.log") as r:
        yield r


def metric(url: str, name: str, **labels) -> float:
    """The sum of a family's samples (counters: the _total samples) matching `labels`, from /metrics.
    A runtime gauge may be exported under `pagoda:` or vLLM's `vllm:`; either is read."""
    text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text
    names = {name, name.replace("pagoda:", "vllm:")}
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name in names:
            for s in family.samples:
                if s.name in (family.name, family.name + "_total") and all(s.labels.get(k) == v
                                                                           for k, v in labels.items()):
                    total += s.value
    return total


def wait_for(predicate, what: str, timeout: float = 30.0):
    """Poll until predicate() is truthy; fail naming `what` (a bound against hangs, not a timing check)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)
