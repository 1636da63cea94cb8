"""Real `pagoda serve` processes behind kwok's fake pods.

kwok gives a pod an address from its node's spec.podCIDR, in order (.1, .2, ...; a freed one is
used again first). A test makes a kwok node of its own with a loopback podCIDR and starts the
servers on that CIDR's first addresses, on the Deployment's container port, before any pod
exists: a pod is then Ready (kwok runs no probes) only where a server already answers, as a
kubelet's readiness probe would see to. The autoscaler scrapes the pods' IPs and the router
routes to them, both for real.

The API server keeps loopback addresses out of EndpointSlices (the EndpointSlice controller's
writes are refused), so a test that needs a pod behind its Service uses the host's own address.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
from kube_cluster import Kube, wait_for
from prometheus_client.parser import text_string_to_metric_families
from serve_process import ServeProcess, pagoda_serve

from pagoda.operator.builders.deployment import CONTAINER_PORT

NODE_LABEL = "pagoda.dev/e2e-node"
SERVE_FLAGS = ("--device", "cpu", "--max-num-seqs", "1", "--log-level", "warning")


def make_node(kube: Kube, name: str, cidr: str) -> str:
    """A Ready kwok CPU node whose pods get addresses from `cidr`; pods pick it by NODE_LABEL."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", NODE_LABEL: name},
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
        },
    }
    kube.apply(node)

    def ready():
        conditions = (kube.kubectl_json("get", "node", name).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(ready, f"kwok node {name} Ready")
    return name


def host_cidr() -> str | None:
    """A one-address podCIDR whose pod gets this machine's own non-loopback IPv4 address (kwok
    hands out network + 1), or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))  # no packet is sent: this only picks the source address
            address = ipaddress.ip_address(probe.getsockname()[0])
        except OSError:
            return None
    if address.is_loopback or address.is_link_local or address.is_unspecified:
        return None
    return f"{address - 1}/32"


def pod_addresses(cidr: str, count: int) -> list[str]:
    """The first `count` addresses kwok hands out on a node with this podCIDR."""
    network = ipaddress.ip_network(cidr)
    return [str(network.network_address + i) for i in range(1, count + 1)]


@contextlib.contextmanager
def servers_for_pods(model: Path, served_name: str, addresses: list[str], logs: Path) -> Iterator[dict[str, ServeProcess]]:
    """{address: server}: one `pagoda serve` per address, on CONTAINER_PORT, started side by side."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with contextlib.ExitStack() as stack:
        servers = {
            ip: stack.enter_context(pagoda_serve(
                model, "--served-model-name", served_name, *SERVE_FLAGS, log_path=logs / f"{ip}.log", host=ip,
                port=CONTAINER_PORT, wait=False, env=env,
            ))
            for ip in addresses
        }  # fmt: skip
        for server in servers.values():
            server.wait_healthy()
        yield servers


def ready_pod_ips(kube: Kube, namespace: str, selector: str) -> list[str]:
    """The IPs of the Ready, not terminating pods a Service with this selector would send to."""
    ips = []
    for pod in kube.items("pods", namespace, selector):
        status = pod.get("status") or {}
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
        if ready and status.get("podIP") and not pod["metadata"].get("deletionTimestamp"):
            ips.append(status["podIP"])
    return sorted(ips)


def requests_served(server: ServeProcess) -> float:
    """Finished requests, from the server's own /metrics (vLLM's name: vllm:request_success)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10, trust_env=False).text
    return sum(s.value for family in text_string_to_metric_families(text) if family.name == "vllm:request_success"
               for s in family.samples if s.name.endswith("_total"))  # fmt: skip
