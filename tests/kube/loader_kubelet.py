"""The kubelet's part for a loader pod that kwok cannot play: kwok runs no containers and its pods
only succeed, so a test leaves the loader pod unscheduled (a nodeSelector no node matches) and
writes the container statuses a kubelet would after a failed run. The Job controller does the rest."""

from __future__ import annotations

import json
from collections.abc import Callable

from kube_cluster import Kube, wait_for

SELECT = "pagoda.dev/modelserver={}"


def failed_status(pod: dict, exit_code: int, message: str) -> dict:
    """The status of a loader pod whose download container exited with this termination message."""
    (download,) = pod["spec"]["initContainers"]
    image = download["image"]

    def container(name: str, state: dict) -> dict:
        return {"name": name, "image": image, "imageID": "", "ready": False, "restartCount": 0, "state": state}

    return {"phase": "Failed",
            "initContainerStatuses": [container(download["name"], {"terminated": {
                "exitCode": exit_code, "reason": "Error", "message": message}})],
            "containerStatuses": [container("plan", {"waiting": {"reason": "PodInitializing"}})]}  # fmt: skip


def fail_loader(kube: Kube, ns: str, name: str, run: Callable[[dict], tuple[int, str]], uri: str | None = None) -> int:
    """Fail each pod of the ModelServer's loader Job (the one for `uri`, if given) with what
    run(pod) returns, (exit code, termination message), until the Job controller fails the Job
    past its backoffLimit. Returns how many pods were failed."""
    played: set[str] = set()

    def job_failed():
        jobs = [j for j in kube.items("job", ns, SELECT.format(name))
                if uri is None or j["metadata"]["annotations"]["pagoda.dev/model-uri"] == uri]  # fmt: skip
        if not jobs:
            return None
        (job,) = jobs
        for pod in kube.items("pods", ns, f"job-name={job['metadata']['name']}"):
            pod_name = pod["metadata"]["name"]
            if pod_name not in played and (pod.get("status") or {}).get("phase") == "Pending":
                status = failed_status(pod, *run(pod))
                kube.kubectl("patch", "pod", pod_name, "-n", ns, "--subresource=status", "--type=merge",
                             "-p", json.dumps({"status": status}))  # fmt: skip
                played.add(pod_name)
        return any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"].get("conditions") or [])

    wait_for(job_failed, "the Job controller to fail the loader Job past its backoffLimit")
    return len(played)
