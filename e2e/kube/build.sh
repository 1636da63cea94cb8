#!/usr/bin/env bash
# Build the test control plane (one multi-call binary, see cmd/pagoda-kube) from the Go module
# proxy, or find it cached. Prints the cache folder: bin/ (the binary and its per-program links)
# and stages/ (kwok's pod and node lifecycles at the pinned kwok version).
#
# The cache is keyed by the pinned versions and a digest of this module's files, so a changed
# pin or program builds afresh and a second run returns at once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod   # never download a toolchain; go.sum pins the modules
kube_version="$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$here/go.mod")"
kwok_version="$(awk '$1 == "sigs.k8s.io/kwok" {print $2}' "$here/go.mod")"
digest="$(cd "$here" && cat build.sh go.mod go.sum cmd/pagoda-kube/*.go | sha256sum | cut -c1-12)"
cache="${PAGODA_KUBE_CACHE:-$root/.cache/kube}/$kube_version-kwok-$kwok_version-$digest"
if [ -x "$cache/bin/pagoda-kube" ] && [ -d "$cache/stages" ]; then
  echo "$cache"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: the Go toolchain (go) is needed to build the control plane" >&2; exit 1; }
tmp="$cache.tmp.$$"
rm -rf "$tmp" && mkdir -p "$tmp/bin" "$tmp/stages"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "build.sh: building kube $kube_version + kwok $kwok_version (a cold build takes many minutes)" >&2
# The version the components report (Helm checks a chart's kubeVersion against it), as
# Kubernetes' own build stamps it.
minor="$(echo "$kube_version" | cut -d. -f2)"
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
(cd "$here" && nice go build -trimpath -ldflags="-s -w$stamp" -o "$tmp/bin/pagoda-kube" ./cmd/pagoda-kube)
for program in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok; do
  ln -s pagoda-kube "$tmp/bin/$program"
done
kwok_dir="$(cd "$here" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
stage="$kwok_dir/kustomize/stage"
cp "$stage"/node/fast/node-initialize.yaml "$stage"/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  "$stage"/pod/fast/pod-*.yaml "$tmp/stages/"
chmod -R u+w "$tmp/stages"
rm -rf "$cache" && mv "$tmp" "$cache"
# Builds of other pins or sources are 170 MB each: keep only this one.
find "$(dirname "$cache")" -mindepth 1 -maxdepth 1 -type d ! -path "$cache" ! -name '*.tmp.*' -exec rm -rf {} +
echo "build.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$cache"
