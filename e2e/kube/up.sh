#!/usr/bin/env bash
# up.sh DIR: start a Kubernetes control plane on loopback for the operator's tests.
#
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake GPU nodes and pod
# lifecycles), all from the binary build.sh makes or finds cached. Writes DIR/kubeconfig (admin)
# and exits 0 once the API server answers and every kwok node is Ready. Everything it starts is
# recorded in DIR/pids; down.sh DIR stops exactly those. Logs are in DIR/logs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:?usage: up.sh DIR}"
mkdir -p "$dir" && dir="$(cd "$dir" && pwd)"
[ -e "$dir/pids" ] && { echo "up.sh: $dir/pids exists: run down.sh $dir first" >&2; exit 1; }
cache="$("$here/build.sh")"
bin="$cache/bin"
mkdir -p "$dir/pki" "$dir/logs" "$dir/etcd" "$dir/cmd"
: > "$dir/pids"

fail() {
  echo "up.sh: $*" >&2
  for log in "$dir"/logs/*.log; do echo "--- $log (last lines)" >&2; tail -n 15 "$log" >&2 || true; done
  "$here/down.sh" "$dir" >&2 || true
  exit 1
}

# Free loopback ports, chosen now so that several clusters (and CI) can run side by side.
read -r etcd_port peer_port api_port kwok_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)

# -- credentials: a CA, the API server's serving cert, the service-account signing key, tokens --
pki="$dir/pki"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=pagoda-test-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
  -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n' > "$pki/san.ext"
openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 2 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
token() { openssl rand -hex 24; }
admin_token="$(token)" cm_token="$(token)" sched_token="$(token)" kwok_token="$(token)"
# The components act as cluster admins here: the test is of the operator's RBAC, not theirs.
cat > "$pki/tokens.csv" <<CSV
$admin_token,admin,admin,"system:masters"
$cm_token,system:kube-controller-manager,kcm,"system:masters"
$sched_token,system:kube-scheduler,ksched,"system:masters"
$kwok_token,kwok,kwok,"system:masters"
CSV

kubeconfig() {  # kubeconfig FILE TOKEN
  cat > "$1" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: pagoda-test
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: user
  user:
    token: $2
contexts:
- name: pagoda-test
  context: {cluster: pagoda-test, user: user, namespace: default}
current-context: pagoda-test
YAML
}
kubeconfig "$dir/kubeconfig" "$admin_token"
kubeconfig "$pki/controller-manager.kubeconfig" "$cm_token"
kubeconfig "$pki/scheduler.kubeconfig" "$sched_token"
kubeconfig "$pki/kwok.kubeconfig" "$kwok_token"

# Kubernetes' Job controller waits 10 s, then 20 s, before it replaces a failed pod, and no flag
# sets that; the tests fail loader pods on purpose, so this control plane's starts at 1 s
# (cmd/pagoda-kube/job.go). The other components ignore the variable.
job_pod_backoff="${PAGODA_KUBE_JOB_POD_BACKOFF:-1s}"

start() {  # start NAME ARGS...: run in its own session; record the pid, and the command (restart.sh)
  local name="$1"; shift
  local cmd=(env "PAGODA_KUBE_JOB_POD_BACKOFF=$job_pod_backoff" "$bin/$name" "$@")
  printf '%s\0' "${cmd[@]}" > "$dir/cmd/$name"
  setsid "${cmd[@]}" > "$dir/logs/$name.log" 2>&1 < /dev/null &
  echo "$! $name" >> "$dir/pids"
}

start etcd --data-dir "$dir/etcd" \
  --listen-client-url "http://127.0.0.1:$etcd_port" --listen-peer-url "http://127.0.0.1:$peer_port"

# A production cluster's admission chain: the defaults, plus NodeRestriction and
# OwnerReferencesPermissionEnforcement (OpenShift enables it; it checks blockOwnerDeletion).
admission=NamespaceLifecycle,LimitRanger,ServiceAccount,TaintNodesByCondition,PodSecurity,Priority
admission+=,DefaultTolerationSeconds,DefaultStorageClass,StorageObjectInUseProtection
admission+=,PersistentVolumeClaimResize,RuntimeClass,CertificateApproval,CertificateSigning
admission+=,CertificateSubjectRestriction,DefaultIngressClass,MutatingAdmissionWebhook
admission+=,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook,ResourceQuota
admission+=,NodeRestriction,OwnerReferencesPermissionEnforcement
start kube-apiserver \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
  --authorization-mode Node,RBAC --enable-admission-plugins "$admission" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-cluster-ip-range 10.96.0.0/16 --allow-privileged=false \
  --cert-dir "$pki" --profiling=false --v=1

kubectl() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local deadline=$(( $(date +%s) + $1 )) what="$2"; shift 2
  until "$@" > /dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "timed out waiting for $what"
    while read -r pid name; do
      kill -0 "$pid" 2>/dev/null || fail "$name exited while waiting for $what"
    done < "$dir/pids"
    sleep 1
  done
}
# Generous: a loaded 2-core machine can take a minute to bring the API server up.
wait_for 180 "the API server" kubectl get --raw /readyz

# The HPA controller syncs every 2 s instead of 15: a test's HPA gets its conditions in a moment.
start kube-controller-manager --kubeconfig "$pki/controller-manager.kubeconfig" \
  --leader-elect=false --secure-port 0 --root-ca-file "$pki/ca.crt" \
  --service-account-private-key-file "$pki/sa.key" --use-service-account-credentials=false \
  --controllers '*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle' \
  --horizontal-pod-autoscaler-sync-period 2s --v=1
start kube-scheduler --kubeconfig "$pki/scheduler.kubeconfig" --leader-elect=false --secure-port 0 --v=1

# kwok: node and pod lifecycles from the stages shipped with the pinned kwok. Pod IPs come from
# 127.10.0.0/16, loopback addresses on which a test can run a real server for a fake pod.
{
  cat <<YAML
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: 127.10.0.1/16
  nodeIP: 127.0.0.1
  nodeLeaseDurationSeconds: 40
  # kwok applies its documented defaults only through kwokctl: spell them out.
  nodeLeaseParallelism: 4
  podPlayStageParallelism: 4
  nodePlayStageParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
YAML
  for stage in "$cache"/stages/*.yaml; do echo "---"; cat "$stage"; done
} > "$dir/kwok.yaml"
start kwok --kubeconfig "$pki/kwok.kubeconfig" --config "$dir/kwok.yaml" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --server-address "127.0.0.1:$kwok_port"

# The cluster's furniture: GPU nodes, a StorageClass with pre-made volumes, a restricted namespace.
wait_for 60 "the default namespace" kubectl get namespace default
kubectl apply -f "$here/cluster.yaml" > /dev/null || fail "kubectl apply cluster.yaml failed"
python3 "$here/volumes.py" "$dir/volumes" | kubectl apply -f - > /dev/null || fail "creating volumes failed"
nodes="$(kubectl get nodes -o name | wc -l)"
ready() { [ "$(kubectl get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)" -eq "$nodes" ]; }
wait_for 120 "$nodes kwok nodes to be Ready" ready
echo "up.sh: control plane up, kubeconfig $dir/kubeconfig" >&2
