# shellcheck shell=sh
# crictl as the client, sourced by guest.sh (uses its check/info/audit and
# $rc): one pod per QoS class, sent the way the kubelet would send the
# manifest (the `kubelet` block of `nri-qos explain --output json`), driven
# with crictl runp/create/start/inspect/update/stopp/rmp, the Burstable one
# resized in place; every kernel value must be what explain predicts.

CRICTL_DIR=/tmp/crictl
mkdir -p "$CRICTL_DIR"
crictl_mem_kb="$(awk '/MemTotal/ {print $2}' /proc/meminfo)"

# `parent|<cgroup parent>` and per container
# `ctr|name|weight|cpu.max|min|low|high|max|oom|k_shares|k_quota|k_period|k_limit|k_oom`
# from explain's JSON (one key per line; no jq in the guest).
crictl_explain() {
    /e2e/bin/nri-qos explain "$1" --node-memory "${crictl_mem_kb}Ki" --output json | awk -F': ' '
        function v(s) { sub(/,$/, "", s); gsub(/"/, "", s); return s }
        function k(s) { gsub(/[ "]/, "", s); return s }
        /^  "cgroupParent"/ { print "parent|" v($2) }
        /^  "containers"/ { c = 1 }
        /^  "sandbox"/ { c = 0 }
        c && /^      "[a-zA-Z]+": [^{]/ { p[k($1)] = v($2) }
        c && /^        "[a-zA-Z]+": / { q[k($1)] = v($2) }
        c && /^    }/ {
            print "ctr|" p["name"] "|" p["cpuWeight"] "|" p["cpuMax"] "|" p["memoryMin"] "|" p["memoryLow"] "|" \
                p["memoryHigh"] "|" p["memoryMax"] "|" p["oomScoreAdj"] "|" q["cpuShares"] "|" q["cpuQuota"] "|" \
                q["cpuPeriod"] "|" q["memoryLimit"] "|" q["oomScoreAdj"]
        }'
}

# Compares the kernel's values for container $2 (key $1) with explain's row
# fields $3..$9 (weight, cpu.max, min, low, high, max, oom_score_adj).
crictl_check_values() {
    key="$1" cid="$2"
    pid="$(crictl inspect -o go-template --template '{{.info.pid}}' "$cid" 2>&1)"
    state="$(crictl inspect -o go-template --template '{{.status.state}}' "$cid" 2>&1)"
    check "$key.inspect" "$([ "$state" = CONTAINER_RUNNING ] && [ "$pid" -gt 0 ] 2>/dev/null && echo PASS || echo FAIL)" \
        "state=$state pid=$pid"
    dir="/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$pid/cgroup" 2>/dev/null)"
    shift 2
    for pair in "cpu.weight=$1" "cpu.max=$2" "memory.min=$3" "memory.low=$4" "memory.high=$5" "memory.max=$6" "oom_score_adj=$7"; do
        f="${pair%%=*}" want="${pair#*=}"
        if [ "$f" = oom_score_adj ]; then got="$(cat "/proc/$pid/oom_score_adj" 2>&1)"; else got="$(cat "$dir/$f" 2>&1)"; fi
        if [ "$got" = "$want" ]; then
            check "$key.$f" PASS "got=$got cgroup=${dir#/sys/fs/cgroup}"
        else
            check "$key.$f" FAIL "got=$got want=$want cgroup=${dir#/sys/fs/cgroup}"
            rc=1
        fi
    done
}

# Runs the pod of manifest $1; $2 (optional): the resized manifest, sent to
# its containers with `crictl update`.
crictl_pod() {
    crictl_explain "$1" >"$CRICTL_DIR/rows" || { check "crictl.explain" FAIL "$1"; rc=1; return; }
    name="$(awk '/^  name:/ {print $2; exit}' "$1")"
    uid="$(awk '/^  uid:/ {print $2; exit}' "$1")"
    parent="$(sed -n 's/^parent|//p' "$CRICTL_DIR/rows")"
    labels="\"io.kubernetes.pod.name\":\"$name\",\"io.kubernetes.pod.namespace\":\"default\",\"io.kubernetes.pod.uid\":\"$uid\""
    hostnet='"security_context":{"namespace_options":{"network":2,"pid":1}}'
    # no hostname: a hostNetwork pod shares the node's UTS namespace (runc
    # refuses a hostname there)
    printf '{"metadata":{"name":"%s","namespace":"default","uid":"%s","attempt":0},"labels":{%s},"linux":{"cgroup_parent":"%s",%s}}\n' \
        "$name" "$uid" "$labels" "$parent" "$hostnet" >"$CRICTL_DIR/$name-pod.json"
    if ! pod="$(crictl runp "$CRICTL_DIR/$name-pod.json" 2>&1)"; then
        check "crictl:$name.runp" FAIL "$pod"
        rc=1
        return
    fi
    grep '^ctr|' "$CRICTL_DIR/rows" >"$CRICTL_DIR/$name-ctrs"
    pod_dir="/sys/fs/cgroup$parent"
    while IFS='|' read -r _ cname weight cmax mmin mlow mhigh mmax oom ks kq kp kl ko; do
        key="crictl:$name/$cname"
        printf '{"metadata":{"name":"%s"},"image":{"image":"e2e.local/busybox:latest"},"command":["/bin/sleep","86400"],"labels":{"io.kubernetes.container.name":"%s",%s},"linux":{"resources":{"cpu_shares":%s,"cpu_quota":%s,"cpu_period":%s,"memory_limit_in_bytes":%s,"oom_score_adj":%s},%s}}\n' \
            "$cname" "$cname" "$labels" "$ks" "$kq" "$kp" "$kl" "$ko" "$hostnet" >"$CRICTL_DIR/$name-$cname.json"
        if ! cid="$(crictl create "$pod" "$CRICTL_DIR/$name-$cname.json" "$CRICTL_DIR/$name-pod.json" 2>&1)" ||
            ! out="$(crictl start "$cid" 2>&1)"; then
            check "$key.started" FAIL "$cid ${out:-}"
            rc=1
            continue
        fi
        check "$key.started" PASS "$cid"
        crictl_check_values "$key" "$cid" "$weight" "$cmax" "$mmin" "$mlow" "$mhigh" "$mmax" "$oom"
        [ -n "${2:-}" ] || continue
        # resized in place, as the kubelet does: UpdateContainerResources
        # with the resized manifest's kubelet values
        row="$(crictl_explain "$2" | grep "^ctr|$cname|")"
        IFS='|' read -r _ _ weight cmax mmin mlow mhigh mmax oom ks kq kp kl ko <<EOF
$row
EOF
        if out="$(crictl update --cpu-share "$ks" --cpu-quota "$kq" --cpu-period "$kp" --memory "$kl" "$cid" 2>&1)"; then
            check "$key@updated.update" PASS ""
            crictl_check_values "$key@updated" "$cid" "$weight" "$cmax" "$mmin" "$mlow" "$mhigh" "$mmax" "$oom"
        else
            check "$key@updated.update" FAIL "$out"
            rc=1
        fi
    done <"$CRICTL_DIR/$name-ctrs"
    # what the runtime put into the pod cgroup (CRI-O: conmon beside the containers?)
    for d in "$pod_dir"/*/; do
        [ -d "$d" ] && info "crictl:$name cgroup $(basename "$d"): pids $(tr '\n' ' ' <"$d/cgroup.procs")$(for p in $(cat "$d/cgroup.procs"); do printf '%s ' "$(tr '\0' ' ' </proc/"$p"/cmdline | cut -c1-40)"; done)"
    done
}

info "scenario crictl: start ($(crictl --version))"
crictl_pod /e2e/scenarios/pods/guaranteed.yaml
crictl_pod /e2e/scenarios/pods/crictl-burstable.yaml /e2e/scenarios/pods/crictl-burstable-resized.yaml
crictl_pod /e2e/scenarios/pods/besteffort.yaml
audit crictl
pods="$(crictl pods -q)"
ctrs="$(crictl ps -q)"
# as the kubelet: the containers first, without grace period (CRI-O's
# StopPodSandbox would wait out their stop timeout: `sleep` ignores SIGTERM)
# shellcheck disable=SC2086 # one argument per id
if out="$({ [ -z "$ctrs" ] || crictl stop --timeout 0 $ctrs; } 2>&1 &&
    { [ -z "$pods" ] || { crictl stopp $pods && crictl rmp $pods; }; } 2>&1)" &&
    [ -z "$(crictl pods -q)" ]; then
    check crictl.cleanup PASS "$(echo "$pods" | wc -w) pods stopped and removed"
else
    check crictl.cleanup FAIL "$out"
    rc=1
fi
info "scenario crictl: end"
