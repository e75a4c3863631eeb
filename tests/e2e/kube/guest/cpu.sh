# shellcheck shell=sh
# Scenario cpu: two Burstable pods (1 CPU and 250m requested, no limits) and
# a BestEffort pod, each running two busy loops on the 2-vCPU node. The CPU
# each pod gets (its pod cgroup's cpu.stat usage_usec over CPU_WINDOW_S,
# 30 s), first without nri-qos (the DaemonSet held off the node by a
# nodeSelector no node matches; the pods created then), then with it (the
# selector removed; adjust-existing brings the running containers in line),
# against the shares their requests promise (1000 : 250 : 0). And what
# reaches the kernel at each level: kubepods, QoS, pod, container
# cpu.weight. Sourced by node.sh.

CPU_PODS="kn-cpu-1000 kn-cpu-250 kn-cpu-be"

# The DaemonSet off this node ($1 = off) or back (on), and waits for it.
nri_qos_placement() {
    local sel=null
    [ "$1" = off ] && sel='"true"'
    kc -n kube-system patch ds nri-qos -p "{\"spec\":{\"template\":{\"spec\":{\"nodeSelector\":{\"e2e.nri-qos.io/off\":$sel}}}}}" >/dev/null
    if [ "$1" = off ]; then
        wait_for "the nri-qos DaemonSet pod gone from the node" 300 \
            no_pods app.kubernetes.io/name=nri-qos kube-system
    else
        wait_plugin "back on the node"
    fi
}

# "weight kubepods/QoS/pod/container" of pod $1.
cpu_weights() {
    local pod ctr
    pod="$(pod_cgroup "$1")"
    ctr="$(ctr_cgroup "$1" app)"
    echo "$(cat /sys/fs/cgroup/kubepods/cpu.weight)/$(cat "$(dirname "$pod")/cpu.weight")/$(cat "$pod/cpu.weight")/$(cat "$ctr/cpu.weight")"
}

# Each pod's share of the three pods' CPU over the window; $1: label.
cpu_measure() {
    local label="$1" p u0 u1 total shares="" cores="" weights=""
    for p in $CPU_PODS; do
        eval "u0_$(echo "$p" | tr - _)=$(awk '/^usage_usec/ { print $2 }' "$(pod_cgroup "$p")/cpu.stat")"
    done
    sleep "${CPU_WINDOW_S:-30}"
    total=0
    for p in $CPU_PODS; do
        u1=$(awk '/^usage_usec/ { print $2 }' "$(pod_cgroup "$p")/cpu.stat")
        eval "u0=\$u0_$(echo "$p" | tr - _)"
        eval "d_$(echo "$p" | tr - _)=$((u1 - u0))"
        total=$((total + u1 - u0))
    done
    for p in $CPU_PODS; do
        eval "d=\$d_$(echo "$p" | tr - _)"
        shares="$shares$(awk -v d="$d" -v t="$total" 'BEGIN { printf "%.3f", d / t }') "
        cores="$cores$(awk -v d="$d" -v w="${CPU_WINDOW_S:-30}" 'BEGIN { printf "%.2f", d / w / 1e6 }') "
        weights="$weights$(cpu_weights "$p") "
    done
    figure cpu "$label: CPU share 1000m / 250m / BestEffort" "$(echo "$shares" | sed 's/ $//; s/ / \/ /g')" "promised 0.800 / 0.200 / 0; CPUs used $(echo "$cores" | sed 's/ $//; s/ / \/ /g') of $(nproc)"
    figure cpu "$label: cpu.weight kubepods/QoS/pod/container" "$(echo "$weights" | sed 's/ $//; s/ / ; /g')" "1000m ; 250m ; BestEffort"
    cpu_last_shares="$shares"
}

if nri_qos_placement off; then
    create_pods $CPU_PODS && cpu_measure "without nri-qos"
    without="$cpu_last_shares"
    nri_qos_placement on && sleep 2 && cpu_measure "with nri-qos"
    with="$cpu_last_shares"
    # Between pods the pod cgroups' cpu.weight decides, which the kubelet
    # writes (linear, proportional to the requests); nri-qos's container
    # weights decide only between containers of one pod. The figures show
    # both phases; the check is the order the requests promise.
    for phase in "without:$without" "with:$with"; do
        set -- ${phase#*:} - - -
        if awk -v a="$1" -v b="$2" -v c="$3" 'BEGIN { exit !(a > b && b > c) }'; then
            check "cpu.order_${phase%%:*}" PASS "shares $1 > $2 > $3 (1000m > 250m > BestEffort)"
        else
            check "cpu.order_${phase%%:*}" FAIL "shares $1 / $2 / $3 (1000m / 250m / BestEffort)"
            rc=1
        fi
    done
fi
delete_pods $CPU_PODS
[ -n "$(ds_pod)" ] || nri_qos_placement on
