"""Two operator replicas, as the chart runs them: kopf peering through the chart's
ClusterKopfPeering. One works and the other stands by; when the working one dies (SIGKILL, no
goodbye) the other takes over once its keep-alive lapses, and ModelServers keep converging."""

from __future__ import annotations

from kube_cluster import RELEASE, Operator, service_account_kubeconfig, wait_for

PEERING = RELEASE  # the chart names it after the release (templates/peering.yaml)


def modelserver(name: str, ns: str) -> dict:
    return {"apiVersion": "pagoda.dev/v1alpha1", "kind": "ModelServer", "metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"uri": f"hf://org/{name}"}, "cache": {"enabled": False}}}  # fmt: skip


def ready(kube, name: str, ns: str):
    return lambda: (kube.get("modelserver", name, ns) or {}).get("status", {}).get("phase") == "Ready"


def peers(kube) -> dict:
    return kube.kubectl_json("get", "clusterkopfpeering", PEERING).get("status") or {}


def test_a_standby_replica_takes_over_when_the_leader_dies(kube, operator, tmp_path):
    ns = kube.namespace("ha")
    operator.stop()  # the session's operator runs standalone: out of the way while the pair runs
    kubeconfig = service_account_kubeconfig(kube)
    # Explicit priorities, so that the test knows which one leads (the chart's default: the
    # earliest started). A keep-alive lapses after 6 s here, not the default 15: the takeover
    # below waits that out (kopf then renews it every second, 5 s of slack for a loaded machine).
    env = {"PAGODA_PEERING_LIFETIME_SECONDS": "6"}
    leader = Operator(kubeconfig=kubeconfig, log=tmp_path / "leader.log", env=env,
                      args=("--peering", PEERING, "--priority", "2"))  # fmt: skip
    standby = Operator(kubeconfig=kubeconfig, log=tmp_path / "standby.log", env=env,
                       args=("--peering", PEERING, "--priority", "1"))  # fmt: skip
    try:
        # kopf starts each replica paused and lets it work once the peering object shows nobody
        # above it. The leader is up first (as a running operator is when a replica is added): a
        # replica that starts before any keep-alive is written works until it sees one.
        leader.start()
        wait_for(lambda: "Resuming operations" in leader.log.read_text(errors="replace"), "the leader to work")
        wait_for(lambda: len(peers(kube)) == 1, "the leader's keep-alive")
        standby.start()
        live = wait_for(lambda: (p := peers(kube)) and len(p) == 2 and p, "both replicas in the peering object")
        assert sorted(p["priority"] for p in live.values()) == [1, 2]

        kube.apply(modelserver("ha-first", ns))
        wait_for(ready(kube, "ha-first", ns), "ha-first Ready, by the leader")
        assert "ha-first" in leader.log.read_text(errors="replace")
        log = standby.log.read_text(errors="replace")
        assert "Resuming operations" not in log and "ha-first" not in log, "the standby must not work"

        leader.stop(kill=True)  # no goodbye: the standby waits out the leader's keep-alive
        kube.apply(modelserver("ha-second", ns))
        try:
            wait_for(ready(kube, "ha-second", ns), "ha-second Ready, by the former standby")
        except AssertionError:
            print(standby.tail())
            raise
        assert "Resuming operations" in standby.log.read_text(errors="replace")
        assert "ha-second" in standby.log.read_text(errors="replace")
    finally:
        leader.stop()
        standby.stop()
        operator.start()
    for name in ("ha-first", "ha-second"):
        kube.kubectl("delete", "modelserver", name, "-n", ns, "--wait=true", "--timeout=120s")
