# shellcheck shell=sh
# Scenario resize: kn-resize (Burstable) resized in place with
# `kubectl patch --subresource resize`, requests and limits up, then down
# below where it started. The kubelet's update reaches the kernel as the
# container's new memory.max (the runtime writes it on the kubelet's
# UpdateContainerResources); from then on memory.high, memory.low, the pod
# cgroup's memory.low and the QoS and kubepods sums must reach their new
# values within 2 s, and the pod's class never changes. Sourced by node.sh.

# The sum of memory.low (or $2) over the pod cgroups under $1.
children_sum() {
    cat "$1"/pod*/"${2:-memory.low}" 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'
}

# Resizes kn-resize to the resources of manifest $2 (patch $3) and times
# what follows. $1: step name (up, down).
resize_step() {
    local step="$1" x=/tmp/explain-resize-$2 mem_kb cg pod qos t0 tk t_high t_low t_pod t_qos end new_max new_high new_low new_pod deadline
    mem_kb=$(awk '/MemTotal/ {print $2}' /proc/meminfo)
    /e2e/bin/nri-qos explain "/e2e/kube/pods/$2.yaml" --node-memory "${mem_kb}Ki" --node-cpus "$(nproc)" \
        --request-source api-server --kubelet-version 1.36 --output json | json_flat >"$x"
    new_max=$(xv "$x" 'containers\.0\.memoryMax')
    new_high=$(xv "$x" 'containers\.0\.memoryHigh')
    new_low=$(xv "$x" 'containers\.0\.memoryLow')
    new_pod=$(xv "$x" podCgroup.memoryLow)
    cg="$(ctr_cgroup kn-resize app)"
    pod="$(pod_cgroup kn-resize)"
    qos=/sys/fs/cgroup/kubepods/burstable
    t0=$(now_ms)
    if ! out="$(kc patch pod kn-resize --subresource resize -p "$3" 2>&1)"; then
        check "resize.$step.patch" FAIL "$out"
        rc=1
        return
    fi
    tk="" t_high="" t_low="" t_pod="" t_qos=""
    deadline=$((t0 + 120000))
    while [ "$(now_ms)" -lt "$deadline" ]; do
        [ -n "$tk" ] || { [ "$(cat "$cg/memory.max")" = "$new_max" ] && tk=$(now_ms); }
        [ -n "$t_high" ] || { [ "$(cat "$cg/memory.high")" = "$new_high" ] && t_high=$(now_ms); }
        [ -n "$t_low" ] || { [ "$(cat "$cg/memory.low")" = "$new_low" ] && t_low=$(now_ms); }
        [ -n "$t_pod" ] || { [ "$(cat "$pod/memory.low")" = "$new_pod" ] && t_pod=$(now_ms); }
        if [ -z "$t_qos" ] && [ -n "$t_pod" ] && [ "$(cat "$qos/memory.low")" = "$(children_sum "$qos")" ] &&
            [ "$(cat /sys/fs/cgroup/kubepods/memory.low)" = "$(($(children_sum /sys/fs/cgroup/kubepods) + $(cat "$qos/memory.low") + $(cat /sys/fs/cgroup/kubepods/besteffort/memory.low)))" ]; then
            t_qos=$(now_ms)
        fi
        [ -z "$tk" ] || [ -z "$t_high" ] || [ -z "$t_low" ] || [ -z "$t_pod" ] || [ -z "$t_qos" ] || break
        sleep 0.1
    done
    # ms after the kubelet's update ("-" when never reached)
    after() { if [ -n "$1" ] && [ -n "$tk" ]; then echo $(($1 - tk)); else echo -; fi; }
    figure resize "$step: kubelet's update after the patch" "$([ -n "$tk" ] && echo "$((tk - t0)) ms" || echo never)" "container memory.max $new_max"
    figure resize "$step: memory.high / memory.low after it" "$(after "$t_high") / $(after "$t_low") ms" "$new_high / $new_low"
    figure resize "$step: pod memory.low / QoS+kubepods sums after it" "$(after "$t_pod") / $(after "$t_qos") ms" "pod $new_pod; burstable $(cat "$qos/memory.low"), kubepods $(cat /sys/fs/cgroup/kubepods/memory.low)"
    for v in high:"$t_high" low:"$t_low" pod:"$t_pod" qos:"$t_qos"; do
        d="$(after "${v#*:}")"
        if [ "$d" != - ] && [ "$d" -le 2000 ]; then
            check "resize.$step.${v%%:*}" PASS "$d ms after the kubelet's update"
        else
            check "resize.$step.${v%%:*}" FAIL "${d} ms after the kubelet's update (limit 2000); kernel: memory.max $(cat "$cg/memory.max") memory.high $(cat "$cg/memory.high") memory.low $(cat "$cg/memory.low") pod memory.low $(cat "$pod/memory.low") burstable memory.low $(cat "$qos/memory.low") (pods $(children_sum "$qos"))"
            rc=1
        fi
    done
    explain_check_resized "$x"
    local class
    class="$(pod_field kn-resize '{.status.qosClass}')"
    if [ "$class" = Burstable ] && [ "$(pod_cgroup kn-resize)" = "$pod" ]; then
        check "resize.$step.class" PASS "Burstable, pod cgroup $pod"
    else
        check "resize.$step.class" FAIL "class $class, pod cgroup $(pod_cgroup kn-resize) (was $pod)"
        rc=1
    fi
}

# After a resize the container holds explain's values for the resized pod,
# oom_score_adj aside (fixed at the container's creation; the kubelet does
# not change it on a resize).
explain_check_resized() {
    local x="$1" cg got want
    cg="$(ctr_cgroup kn-resize app)"
    got="cpu.weight=$(cat "$cg/cpu.weight") cpu.max=$(cat "$cg/cpu.max") memory.min=$(cat "$cg/memory.min") memory.low=$(cat "$cg/memory.low") memory.high=$(cat "$cg/memory.high") memory.max=$(cat "$cg/memory.max")"
    want="cpu.weight=$(xv "$x" 'containers\.0\.cpuWeight') cpu.max=$(xv "$x" 'containers\.0\.cpuMax') memory.min=$(xv "$x" 'containers\.0\.memoryMin') memory.low=$(xv "$x" 'containers\.0\.memoryLow') memory.high=$(xv "$x" 'containers\.0\.memoryHigh') memory.max=$(xv "$x" 'containers\.0\.memoryMax')"
    if [ "$got" = "$want" ]; then
        check "resize.$step.explain" PASS "$got"
    else
        check "resize.$step.explain" FAIL "kernel: $got; explain: $want"
        rc=1
    fi
}

if create_pods kn-resize; then
    resize_step up kn-resize-up '{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"500m","memory":"192Mi"},"limits":{"cpu":"1","memory":"384Mi"}}}]}}'
    resize_step down kn-resize-down '{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"200m","memory":"96Mi"},"limits":{"cpu":"400m","memory":"192Mi"}}}]}}'
    kube_audit resize.audit
fi
delete_pods kn-resize
