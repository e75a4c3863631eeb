# shellcheck shell=bash
# The cluster's control plane, on the host beside the VM that is its node
# (tests/e2e/kube/README.md): etcd, kube-apiserver, kube-controller-manager
# and kube-scheduler, native, in a network namespace of their own where the
# guest's qemu runs too. Sourced by host.sh; uses run.sh's log and WORK and
# host.sh's KUBE_NODE_BIN, KUBE_NODE_IP and KUBE_SERVICE_IP.
#
# The network: qemu's user-mode network gives the guest the node IP, and
# what the guest dials leaves from the namespace. The namespace's lo carries
# the `kubernetes` Service's ClusterIP, where the API server listens on the
# Service's port (443): the kubelet and the DaemonSet's in-cluster client
# reach it as on a cluster, with no kube-proxy. The API server reaches the
# kubelet (logs, exec) at the node IP, which the namespace's lo carries too
# and qemu forwards to the guest's port 10250.
#
# kube_cp_start        a fresh control plane, waited for (its API server
#                      ready); figures in $KUBE_CP_DIR/figures.
# kube_cp_stop [LINES] stops it and removes the namespace; with LINES, the
#                      daemons' log tails first (a failed boot).
# kube_cp_qemu_net     qemu's arguments for the node's network device.

KUBE_CP_NS="nriqos-e2e-kube-$$"
KUBE_CP_DIR="$WORK/kube-cp"
KUBE_CP_DAEMONS="etcd kube-apiserver kube-controller-manager kube-scheduler"
KUBE_CP_PIDS=()
# The guest's gateway: qemu's user-mode network answers for it.
KUBE_NODE_GATEWAY=192.168.50.1

kube_cp_ns() { ip netns exec "$KUBE_CP_NS" "$@"; }

kube_cp_figure() { echo "E2E-FIGURE $1|$2|$3|${4:-}" >>"$KUBE_CP_DIR/figures"; }

# Runs daemon $1 (arguments $2...) in the namespace, its log in
# $KUBE_CP_DIR/$1.log, and starts it again whenever it exits, as a control
# plane's init system does (each exit counted in $KUBE_CP_DIR/restarts-$1).
kube_cp_supervise() {
    local name="$1"
    shift
    (
        while :; do
            kube_cp_ns "$@" >>"$KUBE_CP_DIR/$name.log" 2>&1
            echo "exit $? at $(date +%s)" >>"$KUBE_CP_DIR/restarts-$name"
            sleep 1
        done
    ) &
    KUBE_CP_PIDS+=("$!")
}

kube_cp_kubectl() { kube_cp_ns "$CACHE/root-kubectl/usr/bin/kubectl" --kubeconfig "$WORK/kube-node/admin.kubeconfig" --request-timeout=10s "$@"; }

kube_cp_start() {
    local pki="$WORK/kube-node" t0 limit=180
    kube_cp_stop
    rm -rf "$KUBE_CP_DIR"
    mkdir -p "$KUBE_CP_DIR/etcd"
    ip netns add "$KUBE_CP_NS"
    kube_cp_ns ip link set lo up
    kube_cp_ns ip addr add "$KUBE_SERVICE_IP/32" dev lo
    kube_cp_ns ip addr add "$KUBE_NODE_IP/32" dev lo
    # Dialed from the node IP itself, qemu would hand the guest a connection
    # from its own address, which it drops: from the ClusterIP instead.
    kube_cp_ns ip route change table local local "$KUBE_NODE_IP" dev lo proto kernel scope host src "$KUBE_SERVICE_IP"
    t0=$SECONDS
    kube_cp_supervise etcd "$CACHE/root-etcd-server/usr/bin/etcd" --name e2e --data-dir "$KUBE_CP_DIR/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster e2e=http://127.0.0.1:2380
    kube_cp_supervise kube-apiserver "${KUBE_NODE_BIN[kube-apiserver]}" --etcd-servers=http://127.0.0.1:2379 \
        --bind-address=0.0.0.0 --secure-port=443 --advertise-address="$KUBE_SERVICE_IP" \
        --tls-cert-file="$pki/tls.crt" --tls-private-key-file="$pki/tls.key" \
        --token-auth-file="$pki/tokens.csv" --authorization-mode=Node,RBAC \
        --enable-admission-plugins=NodeRestriction \
        --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$pki/sa.pub" \
        --service-account-signing-key-file="$pki/sa.key" --service-cluster-ip-range=10.0.0.0/24 \
        --endpoint-reconciler-type=none --cert-dir="$KUBE_CP_DIR/apiserver" \
        --kubelet-preferred-address-types=InternalIP
    log "kube-node: waiting for kube-apiserver ready (/readyz, namespace default) in netns $KUBE_CP_NS (at most $limit s)"
    until kube_cp_kubectl get --raw /readyz >/dev/null 2>&1 && kube_cp_kubectl get namespace default >/dev/null 2>&1; do
        if [ $((SECONDS - t0)) -ge "$limit" ]; then
            log "kube-node: kube-apiserver not ready after $limit s"
            kube_cp_stop 40
            return 1
        fi
        sleep 1
    done
    kube_cp_figure boot "kube-apiserver ready after start (host)" "$((SECONDS - t0)) s" "etcd and kube-apiserver native, netns $KUBE_CP_NS"
    log "kube-node: kube-apiserver ready after $((SECONDS - t0)) s"
    # Only the controllers the scenarios use: service accounts and their
    # tokens, the CA bundles every projected token volume mounts
    # (kube-root-ca.crt, and openshift-service-ca.crt, which this API
    # server build's ServiceAccount admission adds to every such volume:
    # OpenShift's patch, active without --openshift-config), DaemonSets,
    # Deployments and ReplicaSets, the garbage collector (cascading
    # deletes), the node lifecycle (conditions to taints: memory-pressure
    # keeps pods off the node as on any cluster) and pod garbage collection.
    kube_cp_supervise kube-controller-manager "${KUBE_NODE_BIN[kube-controller-manager]}" \
        --kubeconfig="$pki/controller-manager.kubeconfig" \
        --controllers=serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,service-ca-certificate-publisher-controller,daemonset-controller,deployment-controller,replicaset-controller,garbage-collector-controller,node-lifecycle-controller,pod-garbage-collector-controller \
        --use-service-account-credentials=true --service-account-private-key-file="$pki/sa.key" \
        --root-ca-file="$pki/ca.crt" --cluster-name=e2e --leader-elect=false \
        --bind-address=127.0.0.1 --cert-dir="$KUBE_CP_DIR/controller-manager"
    kube_cp_supervise kube-scheduler "${KUBE_NODE_BIN[kube-scheduler]}" --kubeconfig="$pki/scheduler.kubeconfig" \
        --leader-elect=false --bind-address=127.0.0.1
}

# CPU seconds (user + system) of the namespace's processes by name.
kube_cp_cpu() {
    local pid comm ticks hz
    hz="$(getconf CLK_TCK)"
    for pid in $(ip netns pids "$KUBE_CP_NS" 2>/dev/null); do
        # the command's name (comm cuts kube-controller-manager at 15)
        comm="$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1)" || continue
        comm="${comm##*/}"
        case " $KUBE_CP_DAEMONS " in *" $comm "*) ;; *) continue ;; esac
        ticks="$(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null)" || continue
        printf '%s %s; ' "$comm" "$((ticks / hz))"
    done
}

kube_cp_stop() {
    local lines="${1:-}" d p
    ip netns list 2>/dev/null | grep -q "^$KUBE_CP_NS\b" || return 0
    if [ -n "$lines" ]; then
        for d in $KUBE_CP_DAEMONS; do
            [ -f "$KUBE_CP_DIR/$d.log" ] || continue
            echo "---- control plane (host): $d.log (tail) ----"
            tail -n "$lines" "$KUBE_CP_DIR/$d.log" | cut -c1-400
        done >&2
    fi
    kube_cp_figure boot "control plane CPU seconds (host, native)" "$(kube_cp_cpu)" ""
    kube_cp_figure boot "control plane restarts (unplanned)" "$(cat "$KUBE_CP_DIR"/restarts-* 2>/dev/null | wc -l)" ""
    for p in "${KUBE_CP_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    KUBE_CP_PIDS=()
    for p in $(ip netns pids "$KUBE_CP_NS" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    sleep 2
    for p in $(ip netns pids "$KUBE_CP_NS" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$KUBE_CP_NS" 2>/dev/null || true
}

kube_cp_qemu_net() {
    echo "-netdev user,id=n0,net=${KUBE_NODE_IP%.*}.0/24,host=$KUBE_NODE_GATEWAY,hostfwd=tcp:$KUBE_NODE_IP:10250-$KUBE_NODE_IP:10250" \
        "-device virtio-net-pci,netdev=n0,romfile="
}
