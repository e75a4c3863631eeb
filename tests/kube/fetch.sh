#!/usr/bin/env bash
# Fetch (once) what tests/kube_api.rs needs besides the API server itself:
# Debian's etcd-server and kubectl (forky), through the same PRIVATE apt
# configuration as the VM payload (tests/e2e/fetch.sh), into its cache:
#   $CACHE/root-etcd-server/usr/bin/etcd, $CACHE/root-kubectl/usr/bin/kubectl
# kube-apiserver comes from ../shared/tools/bin/kube-apiserver.xz (the test
# unpacks it) or NRI_QOS_KUBE_APISERVER.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../e2e/fetch.sh
source "$HERE/../e2e/fetch.sh"
ETCD_SUITE=forky
ETCD_VERSION=3.5
KUBECTL_SUITE=forky
KUBECTL_VERSION=1.36

mkdir -p "$CACHE"
private_apt
get_deb etcd-server "$ETCD_SUITE" "$ETCD_VERSION" etcd-server
get_deb kubectl "$KUBECTL_SUITE" "$KUBECTL_VERSION" kubectl
for n in etcd-server kubectl; do extract "$n"; done
log "ok: $CACHE/root-etcd-server/usr/bin/etcd $CACHE/root-kubectl/usr/bin/kubectl"
