# shellcheck shell=sh
# Scenario qos: a pod of each class, one with pod-level resources, one with
# an init container and a sidecar, created with kubectl. Every running
# container holds what `nri-qos explain` of the same manifest predicts; the
# kubelet's own pod-, QoS- and kubepods-level values are the kubelet's; then
# every value is sampled each second for QOS_SAMPLE_S (120 s: two of the
# kubelet's one-minute QoS updates) and none may change. Sourced by node.sh.

QOS_PODS="kn-guaranteed kn-burstable kn-besteffort kn-podlevel kn-sidecar"

# What the kubelet writes itself (pkg/kubelet/cm: ResourceConfigForPod for
# pod cgroups, the QoS manager's setCPUCgroupConfig for the QoS cgroups,
# node allocatable for kubepods), by its linear shares-to-weight conversion
# 1 + ((shares - 2) * 9999) / 262142 (250m: 256 shares -> 10; 500m -> 20;
# 2 CPUs -> 79; 2 shares -> 1). The burstable QoS cgroup sums every
# Burstable pod's CPU request on the node: these pods' 250m + 500m + 250m
# and the nri-qos DaemonSet's own pod (Burstable, 50m: 1050m -> 41).
# "PATH FILE VALUE"; $1: MemTotal in bytes, rounded down to a page.
qos_kubelet_values() {
    local ds_m
    ds_m="$(kc -n kube-system get ds nri-qos -o jsonpath='{.spec.template.spec.containers[0].resources.requests.cpu}' | sed 's/m$//')"
    cat <<EOF
kn-guaranteed cpu.weight 10
kn-guaranteed cpu.max 25000_100000
kn-guaranteed memory.max 134217728
kn-burstable cpu.weight 10
kn-burstable cpu.max 50000_100000
kn-burstable memory.max 268435456
kn-besteffort cpu.weight 1
kn-besteffort cpu.max max_100000
kn-besteffort memory.max max
kn-podlevel cpu.weight 20
kn-podlevel cpu.max 100000_100000
kn-podlevel memory.max 536870912
kn-sidecar cpu.weight 10
kn-sidecar cpu.max max_100000
kn-sidecar memory.max 268435456
/kubepods/burstable cpu.weight $(linear_weight $((1000 + ${ds_m:-0})))
/kubepods/besteffort cpu.weight 1
/kubepods cpu.weight 79
/kubepods memory.max $1
EOF
}

# $1: scenario name, $2: the kubelet's Memory QoS for explain (none, tiered).
qos_run() {
    local scen="$1" mode="$2" t memmax
    t=$(now_s)
    create_pods $QOS_PODS || return 0
    figure "$scen" "5 pods created to all Ready" "$(($(now_s) - t)) s" "$QOS_PODS"
    explain_check "$scen.explain" "$mode" $QOS_PODS
    figure "$scen" "values equal to nri-qos explain" "$explain_ok of $explain_all" "running containers' 7 values each, and each pod cgroup's memory.min/low"
    memmax=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) * 1024 / 4096 * 4096))
    # a file, not a pipe: the check sets $kubelet_ok and $rc in this shell
    "${QOS_KUBELET_VALUES:-qos_kubelet_values}" "$memmax" >/tmp/kubelet-values
    kubelet_values_check "$scen.kubelet_values" </tmp/kubelet-values
    figure "$scen" "the kubelet's pod/QoS/kubepods values kept" "$kubelet_ok of $kubelet_all" "cpu.weight, cpu.max, memory.max as its formulas give"
    kube_audit "$scen.audit"
    figure "$scen" "audit drift" "$(echo "$audit_out" | grep -oE '[0-9]+ drifting' | tail -n 1 || echo '?')" "$(echo "$audit_out" | grep '^api-server:' | cut -c1-80)"
    sample_window "$scen" "${QOS_SAMPLE_S:-120}" $QOS_PODS
    # a file, not a pipe: the check sets $kubelet_ok and $rc in this shell
    "${QOS_KUBELET_VALUES:-qos_kubelet_values}" "$memmax" >/tmp/kubelet-values
    kubelet_values_check "$scen.kubelet_values_after" </tmp/kubelet-values
}

if [ "${QOS_ONLY_FUNCTIONS:-0}" = 0 ]; then
    qos_run qos none
    delete_pods $QOS_PODS
fi
