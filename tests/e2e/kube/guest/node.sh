# shellcheck shell=sh
# The VM as a Kubernetes node of a single-node cluster, nri-qos installed on
# it with kubectl as users install it, and the scenarios driven through
# kubectl (tests/e2e/kube/README.md). Sourced by guest.sh after its mounts
# and cgroup set-up when /e2e/kube/env exists; sets $rc. busybox sh.
#
# The kubelet (cgroupfs driver) with containerd; its control plane (etcd,
# kube-apiserver with RBAC, kube-controller-manager, kube-scheduler) runs on
# the host (control-plane.sh), reached over the node's one network device.
# No CNI plugin: every pod uses the host network, and a loopback-only
# conflist makes containerd report NetworkReady, without which the node
# stays NotReady and the scheduler places nothing but DaemonSet pods.

# shellcheck source=/dev/null
. /e2e/kube/env
. /e2e/kube/lib.sh
PKI=/e2e/kube/pki
export KUBECONFIG=$PKI/admin.kubeconfig
# kubectl caches the API's discovery under $HOME/.kube: once, not per call
export HOME=/root
mkdir -p /root
NODE=e2e-node
rc=0
kube_t0=$(now_s)

# --- the node's network: one link to the control plane ---------------------------
# virtio-net (qemu's user-mode network, control-plane.sh): the node IP on
# eth0, everything else through the gateway, the `kubernetes` Service's
# ClusterIP included (no kube-proxy: the host answers at that address).
net_modules=""
for m in virtio virtio_ring virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci failover net_failover virtio_net; do
    out="$(insmod "/e2e/$m.ko" 2>&1)" || net_modules="$net_modules $m: $out;"
done
# the device is probed after insmod returns
wait_for "the network device eth0 (virtio-net;$net_modules)" 30 ip link show eth0 >/dev/null || true
if ip link set eth0 up && ip addr add "$E2E_KUBE_NODE_IP/24" dev eth0 && ip route add default via "$E2E_KUBE_GATEWAY"; then
    check kube.network PASS "eth0 $E2E_KUBE_NODE_IP/24, default via $E2E_KUBE_GATEWAY"
else
    check kube.network FAIL "no eth0 (virtio-net): $(ip link 2>&1 | tr '\n' ' ')"
    finish 1
fi
mkdir -p /etc/cni/net.d /opt/cni/bin /var/lib/kubelet /etc/kubernetes
printf '{"cniVersion":"1.0.0","name":"lo","plugins":[{"type":"loopback"}]}\n' >/etc/cni/net.d/10-loopback.conflist
# the kubelet's cadvisor reads it; any stable value
echo e2e0000000000000000000000000000 >/etc/machine-id

kube_watchdog "${E2E_KUBE_STALL_S:-240}" &

# Runs daemon $1 (arguments $2...; log /var/log/$1.log) and starts it again
# whenever it exits, as a node's init system does. Each unplanned exit is
# counted in /tmp/restarts-$1 and said on the console; a restart a scenario
# asks for (it touches /tmp/restart-planned-$1, then kills the daemon) is not.
supervise() {
    local name="$1"
    shift
    (
        while :; do
            "$@" >>"/var/log/$name.log" 2>&1
            code=$?
            if [ -f "/tmp/restart-planned-$name" ]; then
                rm -f "/tmp/restart-planned-$name"
            else
                echo "exit $code at t=$(uptime_s)s" >>"/tmp/restarts-$name"
                info "$name exited with status $code; starting it again"
            fi
            sleep 1
        done
    ) &
}

# /data: the node's disk, ext2 over a loop device (a sparse file in the
# tmpfs root), for workloads whose page cache must be reclaimable.
case " $E2E_KUBE_SCENARIOS " in
*" throttle "*)
    mkdir -p /data
    if insmod /e2e/loop.ko 2>/dev/null || [ -e /dev/loop0 ]; then
        dd if=/dev/zero of=/disk.img bs=1M count=0 seek=4096 2>/dev/null &&
            losetup /dev/loop0 /disk.img && mke2fs -q /dev/loop0 >/dev/null && mount -t ext4 /dev/loop0 /data &&
            check kube.disk PASS "/data on ext2 over /dev/loop0" || check kube.disk FAIL "could not set up /data"
    else
        check kube.disk FAIL "insmod loop.ko failed"
    fi
    ;;
esac

# --- containerd and the images ---------------------------------------------------
# NRI's request and registration timeouts (2 s and 5 s by default) are made
# 10x longer in this guest only: qemu's software emulation on a busy 2-core
# host runs it 20-50x slower than hardware, and a Synchronize that missed
# 2 s made containerd drop the plugin, which registered again and missed
# again while pod creation waited. What the plugin does when it misses a
# deadline on a real node is not what this measures.
awk '{ print } $0 == "[plugins.\"io.containerd.nri.v1.nri\"]" {
        print "  plugin_request_timeout = \"20s\""; print "  plugin_registration_timeout = \"50s\"" }' \
    /etc/containerd/config.toml >/etc/containerd/config.toml.new && mv /etc/containerd/config.toml.new /etc/containerd/config.toml
grep -q 'plugin_request_timeout' /etc/containerd/config.toml || check kube.nri_timeouts FAIL "no [plugins.\"io.containerd.nri.v1.nri\"] table in /etc/containerd/config.toml"
containerd --version
containerd --config /etc/containerd/config.toml >>/var/log/containerd.log 2>&1 &
wait_for "containerd's socket" 60 test -S /run/containerd/containerd.sock || finish 1
check kube.containerd PASS "socket up at t=$(uptime_s)s"
for img in /e2e/images/*.tar; do
    out="$(ctr -n k8s.io images import --local --snapshotter native "$img" 2>&1)" ||
        { check kube.image_import FAIL "$img: $out"; finish 1; }
done
check kube.image_import PASS "$(ctr -n k8s.io images ls -q | tr '\n' ' ')"

# --- the control plane: on the host (control-plane.sh), ready before the boot ------
apiserver_ready() { kc get --raw /readyz >/dev/null && kc get namespace default >/dev/null; }
wait_for "the control plane's API server at https://$E2E_KUBE_SERVICE_IP:443" 120 apiserver_ready || finish 1
check kube.apiserver PASS "reached at t=$(uptime_s)s"

# --- the kubelet -------------------------------------------------------------------
# $1: extra lines for the KubeletConfiguration (scenario tiered: Memory QoS).
kubelet_config() {
    cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
# no webhook: the API server reaches the kubelet (logs, exec) anonymously
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
# the images are imported, never pulled: no image garbage collection
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# CRI calls may take minutes here (emulation on a busy host: a sandbox and
# its containers starting beside four others took more than the default 2m,
# and each retry found the half-made sandbox's name still reserved)
runtimeRequestTimeout: 10m
EOF
    [ -z "${1:-}" ] || printf '%s\n' "$1"
}

# The kubelet reads /etc/kubernetes/kubelet.yaml at each start (scenario
# tiered rewrites it and restarts the kubelet).
kubelet_config >/etc/kubernetes/kubelet.yaml
# --vmodule: the QoS cgroup manager's "Updated QoS cgroup configuration" (V4)
supervise kubelet kubelet --config=/etc/kubernetes/kubelet.yaml --kubeconfig=$PKI/kubelet.kubeconfig \
    --hostname-override=$NODE --node-ip="$E2E_KUBE_NODE_IP" --vmodule=qos_container_manager_linux=4

t=$(now_s)
if wait_for "node $NODE Ready (kubelet registered, runtime and network ready)" 420 node_ready; then
    figure boot "node Ready after the API server" "$(($(now_s) - t)) s" "t=$(uptime_s)s"
else
    kubectl get node -o yaml 2>&1 | tail -n 40
    finish 1
fi
# the controllers a pod needs: a ServiceAccount per namespace, the CA bundle
# every projected token volume mounts
pod_prerequisites() { kc get serviceaccount default >/dev/null && kc -n kube-system get configmap kube-root-ca.crt openshift-service-ca.crt >/dev/null; }
wait_for "ServiceAccount default/default, ConfigMaps kube-system/kube-root-ca.crt and openshift-service-ca.crt (controller-manager)" 300 pod_prerequisites || finish 1

# --- nri-qos, installed as users install it ----------------------------------------
t=$(now_s)
if out="$(kc apply -k /e2e/kube/deploy 2>&1)"; then
    check kube.install_apply PASS "$(echo "$out" | tr '\n' ';')"
else
    check kube.install_apply FAIL "$(echo "$out" | tr '\n' ';')"
    finish 1
fi
if wait_plugin install; then
    p="$(ds_pod)"
    figure install "kubectl apply -k to plugin synchronized" "$(($(now_s) - t)) s" "pod $p, image $(pod_field "$p" '{.spec.containers[0].image}' kube-system)"
    check kube.install PASS "pod $p: $(kc -n kube-system logs "$p" | grep -E 'API source|api|synchronized' | head -n 4 | cut -c1-200 | tr '\n' ';')"
else
    kc -n kube-system describe pod -l app.kubernetes.io/name=nri-qos 2>&1 | tail -n 30
    kc -n kube-system logs -l app.kubernetes.io/name=nri-qos 2>&1 | tail -n 30
    finish 1
fi
figure boot "boot to nri-qos synchronized" "$(uptime_s) s" "guest uptime"

# --- scenarios -----------------------------------------------------------------------
for s in $E2E_KUBE_SCENARIOS; do
    [ -f "/e2e/kube/$s.sh" ] || { check "kube.$s" FAIL "no scenario /e2e/kube/$s.sh"; rc=1; continue; }
    info "kube scenario $s: start"
    t=$(now_s)
    # In a subshell: a scenario that stops on an error (set -u) fails
    # its own checks, not the boot's remaining scenarios.
    # shellcheck source=/dev/null
    # rc starts at 0: a failed scenario before must not fail this one.
    (
        rc=0
        . "/e2e/kube/$s.sh"
        exit "$rc"
    ) || {
        rc=1
        check "kube.$s" FAIL "scenario $s exited before its end or failed a check (see above)"
    }
    figure "$s" "scenario wall time" "$(($(now_s) - t)) s" ""
    info "kube scenario $s: end"
done

figure boot "node daemon restarts (unplanned)" "$(cat /tmp/restarts-* 2>/dev/null | wc -l)" "$(for f in /tmp/restarts-*; do [ -f "$f" ] && printf '%s %s; ' "${f#/tmp/restarts-}" "$(wc -l <"$f")"; done)"
figure boot "guest uptime at the end" "$(uptime_s) s" "RSS kB: $(for p in kubelet containerd; do printf '%s %s ' "$p" "$(awk '/VmRSS/ {print $2}' /proc/"$(pidof "$p" | cut -d' ' -f1)"/status 2>/dev/null)"; done)"
# CPU seconds (user + system) each daemon used, against the guest's busy time.
cpu_s() { awk -v hz="$(getconf CLK_TCK 2>/dev/null || echo 100)" '{ printf "%.0f", ($14 + $15) / hz }' "/proc/$1/stat" 2>/dev/null; }
figure boot "node CPU seconds (guest, emulated)" "$(awk '/^cpu / { printf "%.0f s busy", ($2 + $3 + $4 + $7 + $8) / 100 }' /proc/stat)" "$(for p in kubelet containerd; do printf '%s %s; ' "$p" "$(cpu_s "$(pidof "$p" | cut -d' ' -f1)")"; done)"
[ "$rc" = 0 ] || dump_node_logs 30
