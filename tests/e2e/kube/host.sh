# shellcheck shell=bash
# Host side of the Kubernetes node in the VM (`tests/e2e/run.sh --kube-node`,
# tests/e2e/kube/README.md). Sourced by run.sh, whose helpers it uses (log,
# tool, missing) with its WORK, CACHE and ROOT.
#
# kube_node_prepare   fetches etcd and kubectl (Debian), unpacks the
#                     Kubernetes binaries, makes the cluster's certificates,
#                     tokens and kubeconfigs, and builds the nri-qos image
#                     (scripts/build-image.sh) the guest installs.
# kube_node_rootfs R  copies the node's part into the guest's root R.
# kube_node_report F  prints the table of figures from console log F and
#                     the control plane's.
# The control plane runs on the host: control-plane.sh.

KUBE_NODE_DIR="$ROOT/tests/e2e/kube"
# The node's address (the guest's eth0) and the `kubernetes` Service's
# ClusterIP, which the kubelet and the DaemonSet's in-cluster client dial
# (control-plane.sh: where the API server listens).
KUBE_NODE_IP=192.168.50.2
KUBE_SERVICE_IP=10.0.0.1
declare -A KUBE_NODE_BIN
# shellcheck source=tests/e2e/kube/control-plane.sh
. "$KUBE_NODE_DIR/control-plane.sh"
# Every scenario (tests/e2e/kube/guest/NAME.sh), in the order one boot runs
# them: tiered last, since it leaves the kubelet with Memory QoS on.
KUBE_NODE_ALL="qos resize cpu away throttle pressure tiered"

# The image the guest installs: built from NRI_QOS_IMAGE_BIN when set, else
# from a release build (scripts/build-image.sh).
kube_node_prepare() {
    local k="$WORK/kube-node" b p
    kube_node_scenarios >/dev/null
    "$ROOT/tests/kube/fetch.sh"
    command -v openssl >/dev/null || { log "--kube-node: needs openssl on the host (certificates)"; exit 2; }
    command -v ip >/dev/null || { log "--kube-node: needs ip (iproute2) on the host (the control plane's network namespace)"; exit 2; }
    for b in kube-apiserver:NRI_QOS_KUBE_APISERVER kube-controller-manager:NRI_QOS_KUBE_CONTROLLER_MANAGER \
        kube-scheduler:NRI_QOS_KUBE_SCHEDULER kubelet:NRI_QOS_KUBELET; do
        p="$(tool "${b%%:*}" "${b#*:}")"
        # a machine without the Kubernetes binaries skips the boot, as others skip a runtime
        [ -n "$p" ] || { log "[kube-node] SKIP: missing $(missing "${b%%:*}" "${b#*:}")"; exit 0; }
        KUBE_NODE_BIN[${b%%:*}]="$p"
    done
    kube_node_certs "$k"
    mkdir -p "$WORK/images-kube"
    local t0=$SECONDS
    NRI_QOS_BIN="${NRI_QOS_IMAGE_BIN:-}" bash "$ROOT/scripts/build-image.sh" "$WORK/images-kube/nri-qos.oci.tar"
    KUBE_NODE_IMAGE_BIN="${NRI_QOS_IMAGE_BIN:-$ROOT/target/release/nri-qos}"
    log "kube-node: image built in $((SECONDS - t0)) s from $KUBE_NODE_IMAGE_BIN"
}

# The cluster's PKI: one CA, the API server's serving certificate (every
# name a client dials: loopback, the node IP, the Service IP and its DNS
# names), the service-account key pair, a static token per client and a
# kubeconfig per client (all dial the Service's ClusterIP). Made once per
# work dir.
kube_node_certs() {
    local k="$1" ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes) who
    grep -qs "server: https://$KUBE_SERVICE_IP:443" "$k/scheduler.kubeconfig" && return
    rm -rf "$k" && mkdir -p "$k"
    openssl req -x509 "${ec[@]}" -keyout "$k/ca.key" -out "$k/ca.crt" -subj /CN=e2e-kube-ca -days 3650 2>/dev/null
    openssl req "${ec[@]}" -keyout "$k/tls.key" -out "$k/tls.csr" -subj /CN=kube-apiserver 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
        "$KUBE_NODE_IP" "$KUBE_SERVICE_IP" >"$k/ext"
    openssl x509 -req -in "$k/tls.csr" -CA "$k/ca.crt" -CAkey "$k/ca.key" -CAcreateserial \
        -out "$k/tls.crt" -days 3650 -extfile "$k/ext" 2>/dev/null
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$k/sa.key" 2>/dev/null
    openssl pkey -in "$k/sa.key" -pubout -out "$k/sa.pub" 2>/dev/null
    # token,user,uid,"groups": the identities RBAC's bootstrap roles expect
    {
        printf 'e2e-admin-token,admin,admin-uid,"system:masters"\n'
        printf 'e2e-kubelet-token,system:node:e2e-node,kubelet-uid,"system:nodes"\n'
        printf 'e2e-kcm-token,system:kube-controller-manager,kcm-uid\n'
        printf 'e2e-scheduler-token,system:kube-scheduler,scheduler-uid\n'
    } >"$k/tokens.csv"
    for who in admin:e2e-admin-token kubelet:e2e-kubelet-token controller-manager:e2e-kcm-token scheduler:e2e-scheduler-token; do
        printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://%s:443\n    certificate-authority-data: %s\nusers:\n- name: %s\n  user:\n    token: %s\ncontexts:\n- name: e2e\n  context: {cluster: e2e, user: %s}\ncurrent-context: e2e\n' \
            "$KUBE_SERVICE_IP" "$(base64 -w0 "$k/ca.crt")" "${who%%:*}" "${who#*:}" "${who%%:*}" >"$k/${who%%:*}.kubeconfig"
    done
    # the CA key signs nothing later
    rm -f "$k/tls.csr" "$k/ext" "$k/ca.key" "$k/ca.srl"
}

# The scenarios of --kube-node LIST (comma-separated, or all), checked.
kube_node_scenarios() {
    local s list="${KUBE_NODE_SCENARIOS//,/ }"
    [ "$list" != all ] || list="$KUBE_NODE_ALL"
    for s in $list; do
        [ -f "$KUBE_NODE_DIR/guest/$s.sh" ] || { log "--kube-node: no scenario $s (tests/e2e/kube/guest/$s.sh)"; exit 2; }
    done
    echo "$list"
}

kube_node_rootfs() {
    local r="$1"
    cp "${KUBE_NODE_BIN[kubelet]}" "$CACHE/root-kubectl/usr/bin/kubectl" "$r/usr/bin/"
    # virtio-net, for the node's link to its control plane (insmod order)
    cp "$CACHE"/{virtio,virtio_ring,virtio_pci_legacy_dev,virtio_pci_modern_dev,virtio_pci,failover,net_failover,virtio_net}.ko "$r/e2e/"
    mkdir -p "$r/e2e/kube" "$r/e2e/images"
    cp -r "$WORK/kube-node" "$r/e2e/kube/pki"
    # the install as users do it: config/kubernetes unchanged
    cp -r "$ROOT/config/kubernetes" "$r/e2e/kube/deploy"
    cp -r "$KUBE_NODE_DIR/pods" "$r/e2e/kube/pods"
    cp -r "$KUBE_NODE_DIR/workloads" "$r/e2e/kube/workloads"
    cp "$KUBE_NODE_DIR"/guest/*.sh "$r/e2e/kube/"
    cp "$WORK/images-kube/nri-qos.oci.tar" "$r/e2e/images/"
    # explain and audit beside the image: the same binary
    cp "$KUBE_NODE_IMAGE_BIN" "$r/e2e/bin/nri-qos"
    # guest.sh hands the boot to /e2e/kube/node.sh when this file exists
    {
        echo "E2E_KUBE_SCENARIOS=\"$(kube_node_scenarios)\""
        echo "E2E_KUBE_NODE_IP=$KUBE_NODE_IP"
        echo "E2E_KUBE_SERVICE_IP=$KUBE_SERVICE_IP"
        echo "E2E_KUBE_GATEWAY=$KUBE_NODE_GATEWAY"
        # NRI_QOS_E2E_KUBE_ENV="QOS_SAMPLE_S=20 PRESS_RATE=8": the scenarios' knobs
        for kv in ${NRI_QOS_E2E_KUBE_ENV:-}; do echo "$kv"; done
        echo "E2E_KUBE_IMAGE=$(awk '$1 == "newName:" { n = $2 } $1 == "newTag:" { t = $2 } END { print n ":" t }' "$ROOT/config/kubernetes/kustomization.yaml")"
    } >"$r/e2e/kube/env"
}

# The figures the guest printed (E2E-FIGURE scenario|figure|value|note), as
# one table.
kube_node_report() {
    local f="$1"
    grep -aq '^E2E-FIGURE ' "$f" "$KUBE_CP_DIR/figures" 2>/dev/null || return 0
    echo "kube-node figures:"
    printf '  | %-10s | %-46s | %-28s | %s\n' scenario figure value note
    cat "$KUBE_CP_DIR/figures" "$f" 2>/dev/null | grep -a '^E2E-FIGURE ' | sed 's/^E2E-FIGURE //' |
        awk -F'|' '{ printf "  | %-10s | %-46s | %-28s | %s\n", $1, $2, $3, $4 }'
}
