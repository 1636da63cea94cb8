#!/usr/bin/env bash
# Pagoda end to end on a kind cluster, on the CPU (gpus: 0): build both images, install the chart,
# put the demo model on a PVC, apply a ModelServer and query it through its Service.
# Needs docker, kind, kubectl and helm. See README.md next to this script.
set -euo pipefail

CLUSTER=${CLUSTER:-pagoda}
NAMESPACE=${NAMESPACE:-pagoda-demo}
TAG=${TAG:-e2e}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/e2e/kind
KEEP=${KEEP:-0}

log() { printf '\n==> %s\n' "$*"; }

if ! kind get clusters | grep -qx "$CLUSTER"; then
  log "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 120s
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null

log "building images (runtime: CPU torch on ubuntu)"
docker build -f "$ROOT/Dockerfile.operator" -t "pagoda-operator:$TAG" "$ROOT"
docker build -f "$ROOT/Dockerfile.runtime" -t "pagoda-runtime:$TAG" \
  --build-arg BASE_IMAGE=ubuntu:24.04 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu "$ROOT"
kind load docker-image --name "$CLUSTER" "pagoda-operator:$TAG" "pagoda-runtime:$TAG"

log "installing the chart"
helm upgrade --install pagoda "$ROOT/charts/pagoda" --namespace pagoda-system --create-namespace \
  --set image.repository=pagoda-operator --set image.tag="$TAG" --set image.pullPolicy=Never \
  --set runtimeImage="pagoda-runtime:$TAG" --set resyncSeconds=5 --wait --timeout 180s

log "copying the demo model onto a PVC"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$NAMESPACE" apply -f "$HERE/demo-weights.yaml"
kubectl -n "$NAMESPACE" wait --for=condition=Ready pod/demo-weights-copier --timeout=180s
kubectl -n "$NAMESPACE" exec demo-weights-copier -- mkdir -p /weights/demo-model
kubectl -n "$NAMESPACE" cp "$ROOT/e2e/demo-model/." demo-weights-copier:/weights/demo-model/
kubectl -n "$NAMESPACE" delete pod demo-weights-copier --wait=true

log "applying the ModelServer"
kubectl -n "$NAMESPACE" apply -f "$HERE/modelserver-demo.yaml"
# Loader Job (download is a no-op for pvc://, then `pagoda plan`), then the Deployment.
kubectl -n "$NAMESPACE" wait --for=jsonpath='{.status.phase}'=Ready modelserver/demo --timeout=600s
kubectl -n "$NAMESPACE" get modelserver demo
kubectl -n "$NAMESPACE" get modelserver demo -o jsonpath='{.status.plan}{"\n"}'

log "querying it through the Service"
kubectl -n "$NAMESPACE" port-forward svc/demo 18000:8000 >/dev/null 2>&1 &
PF=$!
trap 'kill $PF 2>/dev/null || true' EXIT
for _ in $(seq 30); do curl -sf localhost:18000/health >/dev/null && break; sleep 1; done
curl -sf localhost:18000/v1/models
echo
curl -sf localhost:18000/v1/completions -H 'Content-Type: application/json' \
  -d '{"model": "pagoda-demo", "prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": 0}'
echo

log "events"
kubectl -n "$NAMESPACE" get events --field-selector involvedObject.kind=ModelServer --sort-by=.lastTimestamp

if [ "$KEEP" != 1 ]; then
  log "deleting the ModelServer (retainOnDelete: false takes the cache claim too)"
  kubectl -n "$NAMESPACE" delete modelserver demo --wait=true
fi
log "done"
