# shellcheck shell=sh
# Helpers of the Kubernetes node in the VM (sourced by node.sh; busybox sh).
# guest.sh gives info, check and uptime_s.

# The watchdog's clock: every step that gets somewhere touches it.
progress() { : >/tmp/kube-progress; }

# Seconds since boot, whole.
now_s() { cut -d. -f1 /proc/uptime; }
# Milliseconds since boot.
now_ms() { awk '{ printf "%d", $1 * 1000 }' /proc/uptime; }

# One figure of the closing table: scenario, figure, value, note.
figure() {
    echo "E2E-FIGURE $1|$2|$3|${4:-}"
    progress
}

# kubectl with a bound on every request, tried again (4 times in all) when
# the API server could not answer at all: under emulation on a busy machine
# it sometimes misses a TLS handshake or a request deadline. A request that
# got an answer (NotFound, Forbidden...) is never repeated, nor one that
# reads standard input.
kc() {
    local try=1 err out code
    err="$(mktemp)"
    while :; do
        out="$(kubectl --request-timeout=60s "$@" 2>"$err")"
        code=$?
        [ "$code" != 0 ] && [ "$try" -lt 4 ] || break
        grep -qE 'Unable to connect|TLS handshake timeout|i/o timeout|connection refused|Client.Timeout|context deadline exceeded|currently unable to handle|request did not complete|etcdserver: request timed out' "$err" || break
        case " $* " in *" - "*) break ;; esac
        try=$((try + 1))
        sleep 2
    done
    [ -z "$out" ] || printf '%s\n' "$out"
    cat "$err" >&2
    rm -f "$err"
    return "$code"
}

# The kubelet's and the runtime's log tails ($1 lines each); the host prints
# the control plane's when the boot fails.
dump_node_logs() {
    local l
    for l in kubelet containerd; do
        [ -f "/var/log/$l.log" ] || continue
        echo "---- $l.log (tail) ----"
        tail -n "${1:-30}" "/var/log/$l.log" | cut -c1-400
    done
}

# wait_for WHAT SECONDS CMD...: runs CMD every second until it succeeds,
# saying what it waits for (and every 30 s that it still does). Sets
# $waited (seconds). On time-out: a FAIL check naming WHAT, the last output
# of CMD and the node's logs; returns 1.
wait_for() {
    local what="$1" limit="$2" start next out
    shift 2
    start=$(now_s)
    info "waiting for $what (at most $limit s)"
    next=30
    while :; do
        if out="$("$@" 2>&1)"; then
            waited=$(($(now_s) - start))
            progress
            return 0
        fi
        waited=$(($(now_s) - start))
        if [ "$waited" -ge "$limit" ]; then
            check "kube.wait" FAIL "$what: not after $waited s; last: $(echo "$out" | tail -n 3 | tr '\n' ' ' | cut -c1-300)"
            dump_node_logs 40
            rc=1
            return 1
        fi
        if [ "$waited" -ge "$next" ]; then
            info "still waiting for $what ($waited s)"
            next=$((next + 30))
        fi
        sleep 1
    done
}

# Background: when no step got anywhere for $1 s, print the node's logs,
# its pods and what runs (once per stall), so a hung run explains itself.
kube_watchdog() {
    local stall="$1" told=0 age
    progress
    while sleep 20; do
        age=$(($(date +%s) - $(stat -c %Y /tmp/kube-progress)))
        if [ "$age" -lt "$stall" ]; then
            told=0
            continue
        fi
        [ "$told" = 0 ] || continue
        told=1
        info "kube watchdog: no progress for $age s; processes, pods and the node's logs follow"
        top -b -n 1 | head -n 25 | cut -c1-200
        kubectl --request-timeout=20s get pods -A -o wide 2>&1 | head -n 40
        dump_node_logs 40
    done
}

# Field $2 of pod $1 (namespace default unless $3): kubectl jsonpath.
pod_field() { kc get pod "$1" -n "${3:-default}" -o jsonpath="$2" 2>/dev/null; }


# Every kubectl call costs seconds under emulation, so pod facts are read
# in one call into an index ($1: namespace, default default):
# /tmp/pods-NS.idx, lines "name uid ctr=id ctr=id ..." (running and
# last-run containers, init containers included).
pods_index() {
    kc get pods -n "${1:-default}" -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {range .status.containerStatuses[*]}{.name}={.containerID} {end}{range .status.initContainerStatuses[*]}{.name}={.containerID} {end}{"\n"}{end}' |
        sed 's#=[a-z]*://#=#g' >"/tmp/pods-${1:-default}.idx.new" && mv "/tmp/pods-${1:-default}.idx.new" "/tmp/pods-${1:-default}.idx"
}

# Field $2 of pod $1's index line (2: uid); refreshes the index once when
# the pod or the field is missing. $3: namespace.
pod_idx() {
    local f="/tmp/pods-${3:-default}.idx" v
    v="$(awk -v p="$1" -v k="$2" '$1 == p { if (k ~ /^[0-9]+$/) print $k; else for (i = 3; i <= NF; i++) if (index($i, k "=") == 1) print substr($i, length(k) + 2) }' "$f" 2>/dev/null)"
    if [ -z "$v" ]; then
        pods_index "${3:-default}"
        v="$(awk -v p="$1" -v k="$2" '$1 == p { if (k ~ /^[0-9]+$/) print $k; else for (i = 3; i <= NF; i++) if (index($i, k "=") == 1) print substr($i, length(k) + 2) }' "$f" 2>/dev/null)"
    fi
    [ -n "$v" ] && echo "$v"
}

# The pod cgroup of pod $1 (cgroupfs driver): /sys/fs/cgroup/kubepods[/qos]/pod<uid>.
pod_cgroup() {
    local uid d
    uid="$(pod_idx "$1" 2 "${2:-default}")" || return 1
    for d in /sys/fs/cgroup/kubepods/pod"$uid" /sys/fs/cgroup/kubepods/burstable/pod"$uid" /sys/fs/cgroup/kubepods/besteffort/pod"$uid"; do
        [ -d "$d" ] && { echo "$d"; return 0; }
    done
    return 1
}

# The cgroup of container $2 of pod $1 (running, or the last one to run).
ctr_cgroup() {
    local id p
    p="$(pod_cgroup "$1" "${3:-default}")" || return 1
    id="$(pod_idx "$1" "$2" "${3:-default}")"
    if [ -n "$id" ] && [ ! -d "$p/$id" ]; then
        # a restarted container: its new ID
        pods_index "${3:-default}"
        id="$(pod_idx "$1" "$2" "${3:-default}")"
    fi
    [ -n "$id" ] && [ -d "$p/$id" ] && echo "$p/$id"
}

# Pretty-printed JSON (nri-qos explain --output json) as path=value lines:
# containers.1.cpuWeight=35, podCgroup.memoryLow=134217728, strings unquoted.
json_flat() {
    awk '
    function path(   p, i) { p = ""; for (i = 1; i <= depth; i++) p = p (p == "" ? "" : ".") key[i]; return p }
    {
        line = $0; sub(/^[ \t]+/, "", line); sub(/,$/, "", line)
        k = ""
        if (line ~ /^"[^"]*": /) { k = line; sub(/":.*/, "", k); sub(/^"/, "", k); sub(/^"[^"]*": /, "", line) }
        else if (depth > 0 && isarr[depth] && line !~ /^[\]\}]/) { k = idx[depth]++ }
        if (line == "{" || line == "[") { depth++; key[depth] = k; isarr[depth] = (line == "["); idx[depth] = 0; next }
        if (line == "}" || line == "]" || line == "{}" || line == "[]") { if (line == "}" || line == "]") depth--; next }
        gsub(/^"|"$/, "", line)
        depth++; key[depth] = k; print path() "=" line; depth--
    }'
}

# Pods $@ (namespace default) are all Ready (one kubectl call).
pods_ready() {
    local ready p
    ready="$(kc get pods -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}')" || return 1
    for p in "$@"; do
        case " $ready " in *" $p=True "*) ;; *) return 1 ;; esac
    done
}

# Creates pods $@ from /e2e/kube/pods/NAME.yaml (one kubectl call), waits
# until all are Ready and indexes them.
create_pods() {
    local p out args=""
    for p in "$@"; do args="$args -f /e2e/kube/pods/$p.yaml"; done
    # shellcheck disable=SC2086
    out="$(kc create $args 2>&1)" || { check "kube.create" FAIL "$(echo "$out" | tr '\n' ';')"; rc=1; }
    wait_for "pods Ready: $*" 600 pods_ready "$@" && pods_index
}

# Deletes pods $@ and waits until they are gone.
delete_pods() {
    kc delete pod "$@" --wait=true --timeout=180s >/dev/null 2>&1 || true
}

# nri-qos audit in the DaemonSet's pod, as an operator runs it there (its
# config, the runtime's pods, the API source). $1: check name. Sets
# $audit_out; a FAIL check on drift.
kube_audit() {
    local pod
    pod="$(ds_pod)"
    if audit_out="$(kc -n kube-system exec "$pod" -- /usr/local/bin/nri-qos audit --timeout-seconds 30 --api-timeout-seconds 30 2>&1)"; then
        check "$1" PASS "$(echo "$audit_out" | grep '^api-server:' | cut -c1-160); $(echo "$audit_out" | tail -n 1)"
    else
        check "$1" FAIL "$(echo "$audit_out" | grep -E 'DRIFT|skipped|rror' | head -n 12 | tr '\n' ';' | cut -c1-900) $(echo "$audit_out" | tail -n 1)"
        echo "$audit_out" | head -n 80
        rc=1
    fi
}

# Value of key $2 in the flattened explain file $1.
xv() { sed -n "s/^$2=//p" "$1" | head -n 1; }

# Every running container of pods $3... holds what `nri-qos explain` of its
# manifest predicts (--request-source api-server, the kubelet's Memory QoS
# $2: none or tiered), oom_score_adj included, and each pod cgroup the
# protection explain gives it. $1: check prefix. Sets $explain_ok/$explain_all.
explain_check() {
    local prefix="$1" mode="$2" mem_kb pod i name cg pid got want x bad
    shift 2
    mem_kb=$(awk '/MemTotal/ {print $2}' /proc/meminfo)
    explain_ok=0 explain_all=0
    for pod in "$@"; do
        x=/tmp/explain-$pod
        /e2e/bin/nri-qos explain "/e2e/kube/pods/$pod.yaml" --node-memory "${mem_kb}Ki" --node-cpus "$(nproc)" \
            --request-source api-server --kubelet-version 1.36 --kubelet-memory-qos "$mode" --output json | json_flat >"$x"
        i=0
        while name="$(xv "$x" "containers\.$i\.name")" && [ -n "$name" ]; do
            if [ "$(xv "$x" "containers\.$i\.init")" = true ] && [ "$(xv "$x" "containers\.$i\.sidecar")" = false ]; then
                i=$((i + 1))
                continue # ran to completion: its cgroup is gone
            fi
            explain_all=$((explain_all + 1))
            if ! cg="$(ctr_cgroup "$pod" "$name")"; then
                check "$prefix.$pod/$name" FAIL "no cgroup for the running container"
                rc=1
                i=$((i + 1))
                continue
            fi
            pid="$(head -n 1 "$cg/cgroup.procs")"
            got="cpu.weight=$(cat "$cg/cpu.weight") cpu.max=$(cat "$cg/cpu.max") memory.min=$(cat "$cg/memory.min") memory.low=$(cat "$cg/memory.low") memory.high=$(cat "$cg/memory.high") memory.max=$(cat "$cg/memory.max") oom_score_adj=$(cat "/proc/$pid/oom_score_adj")"
            want="cpu.weight=$(xv "$x" "containers\.$i\.cpuWeight") cpu.max=$(xv "$x" "containers\.$i\.cpuMax") memory.min=$(xv "$x" "containers\.$i\.memoryMin") memory.low=$(xv "$x" "containers\.$i\.memoryLow") memory.high=$(xv "$x" "containers\.$i\.memoryHigh") memory.max=$(xv "$x" "containers\.$i\.memoryMax") oom_score_adj=$(xv "$x" "containers\.$i\.oomScoreAdj")"
            if [ "$got" = "$want" ]; then
                check "$prefix.$pod/$name" PASS "$got"
                explain_ok=$((explain_ok + 1))
            else
                check "$prefix.$pod/$name" FAIL "kernel: $got; explain: $want"
                rc=1
            fi
            i=$((i + 1))
        done
        explain_all=$((explain_all + 1))
        cg="$(pod_cgroup "$pod")"
        got="memory.min=$(cat "$cg/memory.min") memory.low=$(cat "$cg/memory.low")"
        want="memory.min=$(xv "$x" podCgroup.memoryMin) memory.low=$(xv "$x" podCgroup.memoryLow)"
        if [ "$got" = "$want" ]; then
            check "$prefix.$pod/pod-cgroup" PASS "$got (owner $(xv "$x" podCgroup.owner))"
            explain_ok=$((explain_ok + 1))
        else
            check "$prefix.$pod/pod-cgroup" FAIL "kernel: $got; explain: $want (owner $(xv "$x" podCgroup.owner))"
            rc=1
        fi
    done
}

# The kubelet's own values (stdin: lines "PATH FILE VALUE", PATH a pod name
# or a cgroup under /sys/fs/cgroup; cpu.max with _ for the space) must be in
# the kernel. $1: check prefix. Sets $kubelet_ok/$kubelet_all.
kubelet_values_check() {
    local prefix="$1" where file want dir got
    kubelet_ok=0 kubelet_all=0
    while read -r where file want; do
        [ -n "$where" ] || continue
        case "$where" in
        /*) dir="/sys/fs/cgroup$where" ;;
        *) dir="$(pod_cgroup "$where")" ;;
        esac
        kubelet_all=$((kubelet_all + 1))
        got="$(cat "$dir/$file" 2>/dev/null | tr ' ' _)"
        if [ "$got" = "$want" ]; then
            kubelet_ok=$((kubelet_ok + 1))
        else
            check "$prefix.$where.$file" FAIL "kernel $got, the kubelet's $want"
            rc=1
        fi
    done
    if [ "$kubelet_ok" = "$kubelet_all" ]; then
        check "$prefix" PASS "$kubelet_ok of $kubelet_all pod, QoS and kubepods values are the kubelet's"
    fi
}

# The QoS files of pods $@: each pod cgroup's and each running container's.
pod_files() {
    local pod d c
    for pod in "$@"; do
        d="$(pod_cgroup "$pod")" || continue
        ls "$d"/cpu.weight "$d"/cpu.max "$d"/memory.min "$d"/memory.low "$d"/memory.high "$d"/memory.max
        for c in "$d"/*/; do
            [ -s "$c/cgroup.procs" ] || continue
            ls "$c"cpu.weight "$c"cpu.max "$c"memory.min "$c"memory.low "$c"memory.high "$c"memory.max
        done
    done
}

# The files every scenario samples for pods $@: theirs, the QoS cgroups'
# and kubepods'.
sample_files() {
    local d
    pod_files "$@"
    for d in /sys/fs/cgroup/kubepods /sys/fs/cgroup/kubepods/burstable /sys/fs/cgroup/kubepods/besteffort; do
        ls "$d"/cpu.weight "$d"/memory.min "$d"/memory.low "$d"/memory.max
    done
}

# Samples the files of pods $3... every second for $2 s: no value may change.
# $1: scenario (figures and checks). Counts the kubelet's QoS updates
# ("Updated QoS cgroup configuration", V4) in the window.
sample_window() {
    local scen="$1" secs="$2" files end n q0 q1 changed
    shift 2
    files="$(sample_files "$@" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    set -- $files
    if [ $# = 0 ]; then
        check "$scen.no_flaps" FAIL "no cgroup files to sample"
        rc=1
        return
    fi
    q0=$(grep -c 'Updated QoS cgroup configuration' /var/log/kubelet.log)
    grep -H . "$@" >/tmp/sample.prev
    : >/tmp/sample.changes
    end=$(($(now_s) + secs))
    n=0
    while [ "$(now_s)" -lt "$end" ]; do
        sleep 1
        grep -H . "$@" >/tmp/sample.cur
        if ! cmp -s /tmp/sample.prev /tmp/sample.cur; then
            diff /tmp/sample.prev /tmp/sample.cur | grep '^+/' | sed "s#^+#t=$(uptime_s)s #" >>/tmp/sample.changes
            mv /tmp/sample.cur /tmp/sample.prev
        fi
        n=$((n + 1))
        [ $((n % 30)) != 0 ] || progress
    done
    q1=$(grep -c 'Updated QoS cgroup configuration' /var/log/kubelet.log)
    changed=$(sed 's/^[^ ]* //; s/:.*//' /tmp/sample.changes | sort -u | wc -l)
    figure "$scen" "files changed while sampled each second" "$changed of $# files" "$n samples over $secs s; $((q1 - q0)) kubelet QoS updates in the window"
    if [ "$changed" = 0 ] && [ $((q1 - q0)) -ge 1 ]; then
        check "$scen.no_flaps" PASS "$# files, $n samples over $secs s, $((q1 - q0)) kubelet QoS updates: no value changed"
    else
        check "$scen.no_flaps" FAIL "$changed files changed ($((q1 - q0)) kubelet QoS updates): $(head -n 8 /tmp/sample.changes | tr '\n' ';' | cut -c1-900)"
        rc=1
    fi
}

# The kubelet's cpu.weight for $1 millicores: MilliCPUToShares, then its
# linear shares-to-weight conversion (pkg/kubelet/cm/cgroup_manager_linux.go).
linear_weight() {
    local shares=$(($1 * 1024 / 1000))
    [ "$shares" -ge 2 ] || shares=2
    echo $((1 + (shares - 2) * 9999 / 262142))
}

# The node is Ready.
node_ready() {
    [ "$(kc get node e2e-node -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# The DaemonSet's running (not terminating) pod.
ds_pod() {
    kc -n kube-system get pods -l app.kubernetes.io/name=nri-qos \
        -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' | awk 'NF == 1 { print $1; exit }'
}
# The DaemonSet's pod runs a plugin synchronized with the runtime (its log says so).
plugin_synced() {
    local p
    p="$(ds_pod)" && [ -n "$p" ] && kc -n kube-system logs "$p" 2>/dev/null | grep -q 'synchronized with the runtime'
}
ds_ready() { [ "$(kc -n kube-system get ds nri-qos -o jsonpath='{.status.numberReady}')" = 1 ]; }
# Waits until the DaemonSet's (new) pod runs a synchronized plugin; $1: why.
wait_plugin() {
    wait_for "the nri-qos DaemonSet pod Ready ($1)" 300 ds_ready &&
        wait_for "the plugin's log line 'synchronized with the runtime' ($1)" 120 plugin_synced
}


# Pod $1 (namespace $2, default default) no longer exists.
pod_gone() { ! kc get pod "$1" -n "${2:-default}" >/dev/null 2>&1; }
# No pod matches label selector $1 (namespace $2).
no_pods() { [ -z "$(kc get pods -n "${2:-default}" -l "$1" -o name 2>/dev/null)" ]; }
# The DaemonSet's running pod is not $1.
ds_pod_replaced() { local p; p="$(ds_pod)" && [ -n "$p" ] && [ "$p" != "$1" ]; }
# The cgroup of container $2 of Deployment $1's pod exists.
deploy_ctr_cgroup() { local p; p="$(kc get pods -l "app=$1" -o jsonpath='{.items[0].metadata.name}')" && [ -n "$p" ] && ctr_cgroup "$p" "$2" >/dev/null; }
