#!/usr/bin/env bash
# Builds a real kube-apiserver (k8s.io/kubernetes v1.37.2) and etcd (the
# server module that release requires) from the Go module proxy into $1
# (default .cache/kube at the repository's root), with the InferencePool
# CRD of the Gateway API Inference Extension release pinned below, for
# kvrouter's Kubernetes tests (internal/kubeserver). Does nothing when
# they are there for this go.sum already. The first build cost 1,085
# CPU-seconds for kube-apiserver (measured; see docs/kubernetes.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../.cache/kube}
gie=v1.6.2 # sigs.k8s.io/gateway-api-inference-extension: the CRD's release
mkdir -p "$out"
out=$(cd "$out" && pwd)
stamp=$( (cat "$here/go.mod" "$here/go.sum" "$here/etcd/main.go"; echo "$gie") | sha256sum | cut -c1-16)
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ -f "$out/inferencepool-crd.yaml" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "kube-apiserver, etcd and the InferencePool CRD in $out are current"
  exit 0
fi
cd "$here"
export GOFLAGS=-buildvcs=false
version=v1.37.2
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
go build -ldflags "$ldflags" -o "$out/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
mv "$out/kube-apiserver.tmp" "$out/kube-apiserver"
go build -ldflags "-s -w" -o "$out/etcd.tmp" ./etcd
mv "$out/etcd.tmp" "$out/etcd"
dir=$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/gateway-api-inference-extension@$gie" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
cp "$dir/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$out/inferencepool-crd.yaml"
chmod 644 "$out/inferencepool-crd.yaml"
echo "$stamp" > "$out/stamp"
