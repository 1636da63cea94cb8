"""The e2e/kube contract another harness relies on: `up.sh DIR` exits 0 with DIR/kubeconfig
answering and every kwok node Ready; `down.sh DIR` stops exactly what that up.sh started, and
leaves any other cluster (the session's) running."""

from __future__ import annotations

import os
import subprocess

from kube_cluster import KUBE, Kube


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def recorded(dir) -> dict[str, int]:
    return {name: int(pid) for pid, name in (line.split() for line in (dir / "pids").read_text().splitlines())}


def test_down_stops_exactly_what_up_started(kube, tmp_path):
    up = subprocess.run([str(KUBE / "up.sh"), str(tmp_path)], capture_output=True, text=True, timeout=900)
    try:
        assert up.returncode == 0, up.stderr[-4000:]
        second = Kube(dir=tmp_path, bin=kube.bin)
        assert second.server != kube.server, "a cluster of its own, on ports of its own"
        nodes = second.kubectl_json("get", "nodes")["items"]
        assert nodes and all(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
                             for n in nodes)  # fmt: skip
        pids = recorded(tmp_path)
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
        assert all(alive(pid) for pid in pids.values())
        session = recorded(kube.dir)
    finally:
        down = subprocess.run([str(KUBE / "down.sh"), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not any(alive(pid) for pid in pids.values()), "every process up.sh started is gone"
    assert not (tmp_path / "pids").exists()
    assert all(alive(pid) for pid in session.values()), "the session's cluster is untouched"
    assert kube.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
