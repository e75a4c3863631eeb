#!/usr/bin/env bash
# The NRI hook benchmark (benches/nri_roundtrip.rs) with the Kubernetes API
# source off, then on: the plugin watching a node of 110 pods on a real
# kube-apiserver (tests/kube_api.rs serve_for_benchmarks), for the README's
# "hook latency unchanged" figures. Needs what tests/kube_api.rs needs
# (tests/kube/fetch.sh; ../shared/tools or NRI_QOS_KUBE_APISERVER).
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -f "$work/kubeconfig"; sleep 1; rm -rf "$work"' EXIT

echo "=== API source off ==="
cargo bench --bench nri_roundtrip

NRI_QOS_KUBE_SERVE="$work/kubeconfig" cargo test --test kube_api -- --ignored serve_for_benchmarks >"$work/serve.log" 2>&1 &
for _ in $(seq 600); do [ -s "$work/kubeconfig" ] && break; sleep 0.5; done
[ -s "$work/kubeconfig" ] || { cat "$work/serve.log"; exit 1; }
echo "=== API source on: watching 110 pods ==="
NRI_QOS_KUBERNETES_KUBECONFIG="$work/kubeconfig" NRI_QOS_KUBERNETES_NODE_NAME=node-big \
    cargo bench --bench nri_roundtrip
