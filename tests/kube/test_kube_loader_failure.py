"""A loader that fails says why, on the real control plane: the ModelServer's status (message,
CacheReady, loader.lastError) and a Warning event carry the download's own cause.

kwok runs no containers and its pods only succeed, so the loader pod is left unscheduled (its
nodeSelector matches no node) and the test plays its kubelet: it runs the pod's own download
command here, against a stand-in Hub whose model is larger than the free disk, and writes the
exit code and termination message it left into the pod's status. The Job controller then fails
the pod and, past backoffLimit, the Job; the operator reads the cause back from the pods."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from fakehub import serve
from kube_cluster import ROOT, wait_for
from pod_servers import NODE_LABEL

from pagoda.runtime.tools.tiny_models import build_tiny_model

SELECT = "pagoda.dev/modelserver={}"
TERMINATION_LOG = "/dev/termination-log"


def run_like_a_kubelet(pod: dict, hub_url: str, root) -> dict:
    """Run the pod's download container here, its volume and termination-log paths under root;
    the container statuses a kubelet would then write."""
    (download,) = pod["spec"]["initContainers"]
    log = root / "termination-log"
    log.unlink(missing_ok=True)
    args = [str(log) if a == TERMINATION_LOG else str(root) + a if a.startswith("/models") else a
            for a in download["command"][1:]]  # fmt: skip
    env = {"HF_ENDPOINT": hub_url, "HF_HUB_CACHE": str(root / "hf-cache"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = subprocess.run([sys.executable, "-m", "pagoda.runtime.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode != 0, "the download should have been refused"
    image = download["image"]
    status = lambda name, state: {"name": name, "image": image, "imageID": "", "ready": False,  # noqa: E731
                                  "restartCount": 0, "state": state}  # fmt: skip
    return {"phase": "Failed",
            "initContainerStatuses": [status("download", {"terminated": {
                "exitCode": done.returncode, "reason": "Error", "message": log.read_text()}})],
            "containerStatuses": [status("plan", {"waiting": {"reason": "PodInitializing"}})]}  # fmt: skip


def test_a_download_the_cache_cannot_hold_fails_the_modelserver_naming_the_cause(kube, operator, tmp_path):
    ns = kube.namespace("loadfail")
    source = build_tiny_model(tmp_path / "repo", "llama")
    shard = next(p.name for p in source.iterdir() if p.suffix == ".safetensors")
    hub = serve(source, "org/huge", sizes={shard: shutil.disk_usage(tmp_path).free + 2**30})
    try:
        kube.apply({"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer",
                    "metadata": {"name": "huge", "namespace": ns},
                    "spec": {"model": {"uri": "hf://org/huge"}, "resources": {"gpus": 0},
                             "cache": {"retainOnDelete": False}, "nodeSelector": {NODE_LABEL: "nowhere"}}})  # fmt: skip
        played: set[str] = set()

        def job_failed():
            jobs = kube.items("job", ns, SELECT.format("huge"))
            if not jobs:
                return None
            (job,) = jobs
            for pod in kube.items("pods", ns, f"job-name={job['metadata']['name']}"):
                name = pod["metadata"]["name"]
                if name not in played and (pod.get("status") or {}).get("phase") == "Pending":
                    status = run_like_a_kubelet(pod, f"http://127.0.0.1:{hub.server_port}", tmp_path / name)
                    kube.kubectl("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
                                 "-p", json.dumps({"status": status}))  # fmt: skip
                    played.add(name)
            return any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"].get("conditions") or [])

        wait_for(job_failed, "the Job controller to fail the loader Job past its backoffLimit")
        assert len(played) == 3, "backoffLimit 2: three pods tried"

        def failed():
            ms = kube.get("modelserver", "huge", ns)
            st = ms.get("status") or {}
            return ms if st.get("phase") == "Failed" and (st.get("loader") or {}).get("lastError") else None

        ms = wait_for(failed, "the ModelServer Failed with the loader's cause")
        cause = ms["status"]["loader"]["lastError"]
        assert cause.startswith("download: CacheTooSmall: hf://org/huge needs "), cause
        assert "spec.cache.size" in cause
        assert cause in ms["status"]["message"]
        cache = next(c for c in ms["status"]["conditions"] if c["type"] == "CacheReady")
        assert (cache["status"], cache["reason"]) == ("False", "LoaderFailed") and cause in cache["message"]
        warning = wait_for(lambda: [e for e in kube.events(ns, "huge") if e["reason"] == "LoaderFailed"],
                           "the LoaderFailed event")  # fmt: skip
        assert warning[0]["type"] == "Warning" and "CacheTooSmall" in warning[0]["message"]
    finally:
        hub.shutdown()
    kube.kubectl("delete", "modelserver", "huge", "-n", ns, "--wait=true", "--timeout=120s")
