"""The real control plane for tests: e2e/kube/up.sh and down.sh, kubectl, the chart's operator.

A module of its own (not conftest) so that tests import its helpers by name.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "e2e" / "kube"
CHART = ROOT / "charts" / "pagoda"
EXAMPLES = ROOT / "examples"
OPERATOR_NAMESPACE = "pagoda-system"
RELEASE = "pagoda"
# Generous: a 2-core CI machine runs the whole control plane beside the operator and pytest. Every
# wait is on state (a condition, observedGeneration, a count); this deadline only guards a hang.
WAIT_SECONDS = float(os.environ.get("PAGODA_KUBE_WAIT_SECONDS", "300"))


def cache_dir() -> Path:
    """The control plane's build (build.sh builds it, or finds it cached, and prints where)."""
    out = subprocess.run([str(KUBE / "build.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class Kube:
    """A running control plane: its admin kubeconfig and a kubectl bound to it."""

    dir: Path
    bin: Path

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def server(self) -> str:
        return yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]

    def restart(self, component: str) -> None:
        """Stop one component of the control plane and start it again as up.sh did (restart.sh)."""
        subprocess.run([str(KUBE / "restart.sh"), str(self.dir), component], check=True, timeout=60)

    def collect_garbage_of_new_kinds(self) -> None:
        """After installing CRDs: the garbage collector learns resource kinds only every 30 s (a
        constant in Kubernetes), and until then a ModelServer's children outlive it; a restarted
        controller-manager learns them at once."""
        self.restart("kube-controller-manager")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / "kubectl"), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=360)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def api(self, kubeconfig: Path | None = None) -> kubernetes.client.ApiClient:
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(kubeconfig or self.kubeconfig), client_configuration=configuration
        )
        return kubernetes.client.ApiClient(configuration)

    def namespace(self, prefix: str = "t", restricted: bool = True) -> str:
        """A fresh namespace, under the restricted Pod Security Standard unless asked otherwise."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        labels = {"pod-security.kubernetes.io/enforce": "restricted"} if restricted else {}
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        self.kubectl("apply", "-f", "-", input=json.dumps(ns))
        return name

    def apply(self, obj: dict | list[dict] | str, namespace: str | None = None) -> str:
        text = obj if isinstance(obj, str) else yaml.safe_dump_all(obj if isinstance(obj, list) else [obj])
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        return self.kubectl(*args, input=text).stdout

    # Reads go through one kept-alive HTTPS client, not a kubectl process each: the waits below
    # poll twice a second, and a kubectl start (a 170 MB binary, its kubeconfig, a TLS handshake,
    # the discovery cache) costs a tenth of a CPU-second on each poll. Writes stay kubectl's.
    @functools.cached_property
    def _reader(self) -> kubernetes.client.ApiClient:
        return self.api()

    def _resources(self, refresh: bool = False) -> dict[str, tuple[str, str, bool]]:
        """{name: (API path, plural, namespaced)} under every name kubectl takes for a resource
        (plural, singular, short names, kind), from the server's discovery in its priority order:
        the core group first, then each group's preferred version, the first one to claim a name
        keeps it (as kubectl's resolution does)."""
        if refresh or "_table" not in self.__dict__:
            get = lambda path: self._get_json(path)  # noqa: E731
            versions = [("/api/v1", get("/api/v1"))]
            for group in get("/apis")["groups"]:
                path = f"/apis/{group['preferredVersion']['groupVersion']}"
                versions.append((path, get(path)))
            table: dict[str, tuple[str, str, bool]] = {}
            for path, listing in versions:
                for r in listing["resources"]:
                    if "/" in r["name"]:
                        continue  # a subresource
                    entry = (path, r["name"], r["namespaced"])
                    for name in (r["name"], r.get("singularName") or "", r["kind"].lower(), *r.get("shortNames", [])):
                        if name:
                            table.setdefault(name, entry)
            self.__dict__["_table"] = table
        return self.__dict__["_table"]

    def _resource(self, kind: str) -> tuple[str, str, bool]:
        kind = kind.lower()
        found = self._resources().get(kind) or self._resources(refresh=True).get(kind)  # a new CRD
        if found is None:
            raise AssertionError(f"the server has no resource type {kind!r}")
        return found

    def _get_json(self, path: str, **query) -> dict:
        request = self._reader.param_serialize("GET", path, query_params=list(query.items()),
                                               header_params={"Accept": "application/json"},
                                               auth_settings=["BearerToken"])  # fmt: skip
        response = self._reader.call_api(*request, _request_timeout=60)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise kubernetes.client.ApiException(status=response.status, reason=response.reason)
        return json.loads(data)

    @staticmethod
    def _as_kubectl_shows(obj: dict) -> dict:
        obj.get("metadata", {}).pop("managedFields", None)  # kubectl -o json hides them
        return obj

    def get(self, kind: str, name: str, namespace: str) -> dict | None:
        path, plural, namespaced = self._resource(kind)
        scope = f"/namespaces/{namespace}" if namespaced else ""
        try:
            return self._as_kubectl_shows(self._get_json(f"{path}{scope}/{plural}/{name}"))
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise AssertionError(f"get {kind} {name} -n {namespace}: {exc.status} {exc.body}") from exc

    def items(self, kind: str, namespace: str, selector: str | None = None) -> list[dict]:
        """As `kubectl get KIND[,KIND...] -n NS [-l SELECTOR] -o json`: each item with its kind."""
        found = []
        for one in kind.split(","):
            path, plural, namespaced = self._resource(one)
            scope = f"/namespaces/{namespace}" if namespaced else ""
            listing = self._get_json(f"{path}{scope}/{plural}", **({"labelSelector": selector} if selector else {}))
            api_version, item_kind = listing["apiVersion"], listing["kind"].removesuffix("List")
            found += [self._as_kubectl_shows({"apiVersion": api_version, "kind": item_kind, **item})
                      for item in listing["items"]]  # fmt: skip
        return found

    def events(self, namespace: str, name: str) -> list[dict]:
        items = self.items("events", namespace)
        return [e for e in items if (e.get("involvedObject") or {}).get("name") == name]


def wait_for(check, what: str, timeout: float = WAIT_SECONDS, interval: float = 0.5):
    """Poll check() until it returns truthy; no timing is asserted, the deadline is a hang guard."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = check()
            if last:
                return last
        except (AssertionError, KeyError, TypeError, IndexError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
        time.sleep(interval)


def start(dir: Path) -> Kube:
    bin = cache_dir() / "bin"
    up = subprocess.run([str(KUBE / "up.sh"), str(dir)], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        stop(dir)
        raise RuntimeError(f"up.sh failed ({up.returncode}):\n{up.stderr[-6000:]}")
    return Kube(dir=dir, bin=bin)


def stop(dir: Path) -> None:
    subprocess.run([str(KUBE / "down.sh"), str(dir)], check=False, timeout=120)


# -- the chart and the operator -------------------------------------------------------------------


def install_chart(kube: Kube, values: dict | None = None, release: str = RELEASE,
                  namespace: str = OPERATOR_NAMESPACE) -> dict:
    """helm install, with helm-python-sdk (Helm's own Go code), into OPERATOR_NAMESPACE."""
    import helm_python as helm

    with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=namespace) as config:
        with helm.Chart.load(CHART) as chart:
            return config.install(
                chart, release, values or {}, namespace=namespace, create_namespace=True, timeout=300,
            )


def uninstall_chart(kube: Kube, release: str, namespace: str) -> dict:
    import helm_python as helm

    with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=namespace) as config:
        return config.uninstall(release, timeout=300)


def service_account_kubeconfig(kube: Kube, name: str = RELEASE, namespace: str = OPERATOR_NAMESPACE,
                               server: str | None = None) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (a TokenRequest token), so
    the operator running on this machine is held to the chart's RBAC."""
    token = kube.kubectl("create", "token", name, "-n", namespace, "--duration", "6h").stdout.strip()
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {**cluster, **({"server": server} if server else {})}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": name}}],
        "current-context": "c",
    }
    path = kube.dir / f"operator-{uuid.uuid4().hex[:6]}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Operator:
    """`pagoda operator` as a local process, as the chart's ServiceAccount."""

    kubeconfig: Path
    log: Path
    env: dict = field(default_factory=dict)
    args: tuple[str, ...] = ()  # more `pagoda operator` flags
    scope: tuple[str, ...] = ("--all-namespaces",)  # or ("--namespace", NS)
    process: subprocess.Popen | None = None

    def start(self) -> Operator:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PAGODA_RESYNC_SECONDS": "3",
            "PAGODA_RETRY_BASE_SECONDS": "2",
            "PAGODA_RUNTIME_IMAGE": "registry.local/pagoda-runtime:test",
            **self.env,
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        handle = self.log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pagoda.runtime.cli", "operator", *self.scope, "--verbose", *self.args],
            env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
        )
        return self

    def stop(self, kill: bool = False) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
