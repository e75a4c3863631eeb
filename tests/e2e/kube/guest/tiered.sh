# shellcheck shell=sh
# Scenario tiered: the kubelet restarted with its Memory QoS on
# (`MemoryQoS` feature gate, `memoryReservationPolicy: TieredReservation`,
# alpha in 1.36; memoryThrottlingFactor left at its 1.36 default), then the
# pods of scenario qos again: every container as explain predicts for that
# kubelet, the kubelet's own pod, QoS and kubepods values exact (its
# protection included), and no value changing while sampled each second
# for 2 minutes. The kubelet keeps this configuration for the rest of the
# boot: run it last. Sourced by node.sh (after qos.sh's functions).

QOS_ONLY_FUNCTIONS=1
# shellcheck source=tests/e2e/kube/guest/qos.sh
. /e2e/kube/qos.sh
QOS_ONLY_FUNCTIONS=0

# The kubelet's TieredReservation protection for QOS_PODS and the DaemonSet's
# Burstable pod (64Mi): Guaranteed pods memory.min = their requests,
# Burstable pods memory.low = theirs (kn-sidecar: max(init 64Mi, sidecar
# 32Mi + app 96Mi) = 128Mi; kn-podlevel: its pod-level 256Mi),
# /kubepods/burstable memory.low = the Burstable sum (128 + 256 + 128 + 64 =
# 576Mi), /kubepods memory.min = Guaranteed and Burstable together (128 +
# 576 = 704Mi).
tiered_kubelet_values() {
    qos_kubelet_values "$1"
    cat <<'EOF'
kn-guaranteed memory.min 134217728
kn-burstable memory.low 134217728
kn-podlevel memory.low 268435456
kn-sidecar memory.low 134217728
/kubepods/burstable memory.low 603979776
/kubepods memory.min 738197504
EOF
}

t=$(now_s)
kubelet_config "featureGates: {MemoryQoS: true}
memoryReservationPolicy: TieredReservation" >/etc/kubernetes/kubelet.yaml
: >/tmp/restart-planned-kubelet
kill "$(pidof kubelet)"
# Ready again, and its status posted since the restart
wait_for "node $NODE Ready after the kubelet's restart with MemoryQoS" 300 node_ready && sleep 10
figure tiered "kubelet restart with MemoryQoS to node Ready" "$(($(now_s) - t)) s" ""

QOS_KUBELET_VALUES=tiered_kubelet_values
qos_run tiered tiered
delete_pods $QOS_PODS
