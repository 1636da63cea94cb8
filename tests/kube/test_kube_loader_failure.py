"""A loader that fails says why, on the real control plane: the ModelServer's status (message,
CacheReady, loader.lastError) and a Warning event carry the download's own cause.

The test plays the loader pod's kubelet (loader_kubelet.py): it runs the pod's own download
command here, against a stand-in Hub whose model is larger than the free disk, and writes the exit
code and termination message it left into the pod's status. The Job controller fails the pod and,
past backoffLimit, the Job; the operator reads the cause back from the pods."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from fakehub import serve
from kube_cluster import ROOT, wait_for
from loader_kubelet import fail_loader
from pod_servers import NODE_LABEL

TERMINATION_LOG = "/dev/termination-log"


def run_download_here(pod: dict, hub_url: str, root) -> tuple[int, str]:
    """Run the pod's download container here, its volume and termination-log paths under root:
    (exit code, termination message)."""
    (download,) = pod["spec"]["initContainers"]
    root = root / pod["metadata"]["name"]
    log = root / "termination-log"
    args = [str(log) if a == TERMINATION_LOG else str(root) + a if a.startswith("/models") else a
            for a in download["command"][1:]]  # fmt: skip
    env = {"HF_ENDPOINT": hub_url, "HF_HUB_CACHE": str(root / "hf-cache"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = subprocess.run([sys.executable, "-m", "pagoda.runtime.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode != 0, "the download should have been refused"
    return done.returncode, log.read_text()


def test_a_download_the_cache_cannot_hold_fails_the_modelserver_naming_the_cause(kube, operator, tiny_model, tmp_path):
    ns = kube.namespace("loadfail")
    shard = next(p.name for p in tiny_model.iterdir() if p.suffix == ".safetensors")
    hub = serve(tiny_model, "org/huge", sizes={shard: shutil.disk_usage(tmp_path).free + 2**30})
    try:
        kube.apply({"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer",
                    "metadata": {"name": "huge", "namespace": ns},
                    "spec": {"model": {"uri": "hf://org/huge"}, "resources": {"gpus": 0},
                             "cache": {"retainOnDelete": False}, "nodeSelector": {NODE_LABEL: "nowhere"}}})  # fmt: skip
        url = f"http://127.0.0.1:{hub.server_port}"
        tried = fail_loader(kube, ns, "huge", lambda pod: run_download_here(pod, url, tmp_path))
        assert tried == 3, "backoffLimit 2: three pods tried"

        # The status holds the cause from the failure on, through the retry the operator starts
        # after its backoff (PAGODA_RETRY_BASE_SECONDS=2 here): Failed for a moment, then Loading.
        ms = wait_for(lambda: (m := kube.get("modelserver", "huge", ns))["status"].get("loader", {}).get("lastError")
                      and m, "the loader's cause in the status")  # fmt: skip
        cause = ms["status"]["loader"]["lastError"]
        assert cause.startswith("download: CacheTooSmall: hf://org/huge needs "), cause
        assert "spec.cache.size" in cause
        cache = next(c for c in ms["status"]["conditions"] if c["type"] == "CacheReady")
        assert cause in ms["status"]["message"] and cause in cache["message"] and cache["status"] == "False"
        by_reason = lambda: {e["reason"]: e for e in kube.events(ns, "huge")}  # noqa: E731
        wait_for(lambda: {"LoaderFailed", "PhaseFailed"} <= set(by_reason()), "the Warning events")
        for reason in ("LoaderFailed", "PhaseFailed"):
            event = by_reason()[reason]
            assert event["type"] == "Warning" and "CacheTooSmall: hf://org/huge needs" in event["message"], event
    finally:
        hub.shutdown()
    kube.kubectl("delete", "modelserver", "huge", "-n", ns, "--wait=true", "--timeout=120s")
