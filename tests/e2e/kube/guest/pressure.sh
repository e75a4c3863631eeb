# shellcheck shell=sh
# Scenario pressure: node memory pressure raced against the kubelet's own
# eviction (default hard threshold memory.available < 100Mi, checked every
# 10 s), twice in one boot with the same workload:
#   1. "nri-qos": the DaemonSet as shipped (its monitor and guard as the
#      shipped ConfigMap says);
#   2. "kubelet alone": the same with [plugin] with-monitor = false (policy
#      and keeper still on).
# nri-qos runs first: a node the kubelet saw under pressure keeps its
# MemoryPressure condition (and taint, which holds the evicted pods'
# replacements off it) for evictionPressureTransitionPeriod, 5 min; the
# kubelet is restarted after each run, which ends it.
# Workload: kn-ev-guaranteed and kn-ev-within (within their requests: must
# survive), ev-bu (Burstable, holds 0.6 x the headroom) and ev-be
# (BestEffort, grows at PRESS_RATE MiB/s) as Deployments. Measured from a
# sampler of the kubelet's signal (MemTotal - (anon + file - inactive_file)
# of the root cgroup, every 100 ms): onset (first below 100Mi) to relief
# (back above), kernel OOM kills, the victims in order and by whom, pods
# lost, and whether the evicted pods came back. Sourced by node.sh.

PRESS_THRESHOLD=104857600
PRESS_RATE="${PRESS_RATE:-12}"

# One sample: "uptime_ms memory.available" as the kubelet computes it
# (busybox awk's %d stops at 2^31: bytes need %.0f).
press_sample() {
    awk 'FILENAME == "/proc/uptime" { ms = int($1 * 1000); next }
        FILENAME == "/proc/meminfo" { if ($1 == "MemTotal:") t = $2 * 1024; next }
        $1 == "anon" { a = $2 } $1 == "file" { f = $2 } $1 == "inactive_file" { i = $2 }
        END { printf "%d %.0f\n", ms, t - (a + f - i) }' /proc/uptime /proc/meminfo /sys/fs/cgroup/memory.stat
}

# Samples every 100 ms into $1 until /tmp/press.stop exists.
press_watch() {
    rm -f /tmp/press.stop
    while [ ! -f /tmp/press.stop ]; do
        press_sample
        sleep 0.1
    done >"$1"
}

# Uptime minus wall-clock seconds, to 10 ms: the kubelet's and the plugin's
# logs carry wall-clock times, dmesg and the sampler uptime.
clock_offset() {
    local s0 s1
    s0=$(date +%s)
    while s1=$(date +%s) && [ "$s1" = "$s0" ]; do sleep 0.01; done
    awk -v s="$s1" '{ printf "%.2f", $1 - s }' /proc/uptime
}

# The kubelet saw pressure: its condition would hold pods off the node for
# evictionPressureTransitionPeriod (5 min). A restart of the kubelet
# forgets it, so what runs next starts alike without the wait.
kubelet_forget_pressure() {
    : >/tmp/restart-planned-kubelet
    kill "$(pidof kubelet)"
    sleep 2
    wait_for "node $NODE Ready after the kubelet's restart" 300 node_ready
    wait_for "node condition MemoryPressure False" 360 no_memory_pressure
}

# The ConfigMap's nri-qos.toml with [plugin] with-monitor set to $1.
nri_qos_monitor() {
    local toml json
    toml="$(kc -n kube-system get configmap nri-qos -o jsonpath='{.data.nri-qos\.toml}')"
    toml="$(echo "$toml" | awk -v v="$1" '
        /^\[/ { if (inplugin && !done) { print "with-monitor = " v; done = 1 } inplugin = ($0 == "[plugin]") }
        inplugin && /^with-monitor *=/ { if (!done) print "with-monitor = " v; done = 1; next }
        { print }
        END { if (inplugin && !done) print "with-monitor = " v }')"
    json="$(printf '%s\n' "$toml" | awk 'BEGIN { printf "{\"data\":{\"nri-qos.toml\":\"" }
        { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); printf "%s\\n", $0 } END { printf "\"}}" }')"
    kc -n kube-system patch configmap nri-qos -p "$json" >/dev/null
}

# Restarts the DaemonSet's pod (a new config takes effect at start) and
# waits for its plugin.
nri_qos_restart() {
    local old
    old="$(ds_pod)"
    kc -n kube-system rollout restart ds/nri-qos >/dev/null
    wait_for "the DaemonSet pod $old replaced" 300 ds_pod_replaced "$old"
    wait_plugin "$1"
}

# The workload manifest $1 with its sizes filled in, applied.
press_apply() {
    sed -e "s/@HOLD_MIB@/$press_hold/g" -e "s/@GROW_MIB@/$press_grow/g" -e "s/@RATE@/$PRESS_RATE/g" \
        "/e2e/kube/workloads/$1.yaml" | kc create -f - >/dev/null
}

# Pod names of Deployment $1, every one seen (also terminating or failed).
deploy_pods_all() { kc get pods -l "app=$1" -o jsonpath='{range .items[*]}{.metadata.name}{" "}{end}'; }

# "name uid" of every pod of the hogs, appended to $1 (the API forgets
# pods an Eviction deleted; the logs name them by UID).
press_uids() {
    kc get pods -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid}{"\n"}{end}' 2>/dev/null | grep '^ev-' >>"$1"
}

# Deployment $1's pod has touched $2 MiB (memhog prints every 16 MiB).
hog_holding() {
    local p
    p="$(kc get pods -l "app=$1" -o jsonpath='{.items[0].metadata.name}')" && [ -n "$p" ] &&
        kc logs "$p" 2>/dev/null | grep -q "^memhog [0-9]* $(($2 / 16 * 16))\$"
}

no_memory_pressure() {
    [ "$(kc get node e2e-node -o jsonpath='{.status.conditions[?(@.type=="MemoryPressure")].status}')" = False ]
}

# One run; $1: label.
press_run() {
    local label="$1" dir t_start off samples oom0 oom1 onset relief below t_be deadline v first n lost resched
    dir=/tmp/press-$(echo "$label" | tr ' ' _)
    rm -rf "$dir" && mkdir -p "$dir"
    off="$(clock_offset)"
    oom0=$(awk '$1 == "oom_kill" { print $2 }' /proc/vmstat)
    dmesg -c >/dev/null 2>&1
    log0=$(wc -l </var/log/kubelet.log)
    plog0=$(kc -n kube-system logs "$(ds_pod)" | wc -l)
    press_watch "$dir/samples" &
    t_start=$(now_ms)
    press_apply ev-bu
    wait_for "ev-bu holding $press_hold MiB" 300 hog_holding ev-bu "$press_hold" || return
    press_apply ev-be
    t_be=$(now_s)
    # until both first pods were victims (gone, failed or restarted), at most 180 s
    deadline=$((t_be + 180))
    first_bu="$(deploy_pods_all ev-bu | cut -d' ' -f1)"
    first_be=""
    while [ "$(now_s)" -lt "$deadline" ]; do
        press_uids "$dir/uids"
        [ -n "$first_be" ] || first_be="$(deploy_pods_all ev-be | cut -d' ' -f1)"
        n=0
        for p in $first_bu $first_be; do
            st="$(kc get pod "$p" -o jsonpath='{.status.phase}{.metadata.deletionTimestamp}{.status.containerStatuses[0].restartCount}' 2>/dev/null)" || { n=$((n + 1)); continue; }
            case "$st" in Running0 | Pending0 | Running | Pending) ;; *) n=$((n + 1)) ;; esac
        done
        [ "$n" -lt 2 ] || [ -z "$first_be" ] || break
        sleep 2
    done
    # replacements: up to 40 s to come back
    sleep 5
    resched=""
    for d in ev-bu ev-be; do
        i=0
        while [ $i -lt 40 ] && [ "$(kc get deploy "$d" -o jsonpath='{.status.readyReplicas}')" != 1 ]; do sleep 1; i=$((i + 1)); done
        if [ "$(kc get deploy "$d" -o jsonpath='{.status.readyReplicas}')" = 1 ]; then
            resched="$resched$d: a replacement Running;"
        else
            resched="$resched$d: $(kc get pods -l "app=$d" -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase} {.status.reason} {.status.conditions[?(@.type=="PodScheduled")].message}{";"}{end}' | cut -c1-200)"
        fi
    done
    press_uids "$dir/uids"
    kc get pods -o jsonpath='{range .items[*]}{.metadata.name}|{.status.phase}|{.status.reason}|{.metadata.deletionTimestamp}|{.status.containerStatuses[0].restartCount}|{.status.containerStatuses[0].lastState.terminated.reason}{"\n"}{end}' >"$dir/pods"
    : >/tmp/press.stop
    wait
    oom1=$(awk '$1 == "oom_kill" { print $2 }' /proc/vmstat)
    dmesg >"$dir/dmesg"
    tail -n +"$((log0 + 1))" /var/log/kubelet.log >"$dir/kubelet.log"
    kc -n kube-system logs "$(ds_pod)" | tail -n +"$((plog0 + 1))" >"$dir/plugin.log"

    # onset (first below 100Mi) and relief (first back at or above it)
    set -- $(awk -v th="$PRESS_THRESHOLD" '!on && $2 < th { on = $1; min = $2 } on && $2 < min { min = $2 } on && !off && $2 >= th { off = $1 } END { print on + 0, off + 0, min + 0 }' "$dir/samples")
    onset=$1 relief=$2 below=$3
    samples=$(wc -l <"$dir/samples")
    if [ "$onset" = 0 ]; then
        figure pressure "$label: onset to relief (below 100Mi)" "never below" "$samples samples; lowest $(awk 'NR == 1 || $2 < m { m = $2 } END { printf "%d MiB", m / 1048576 }' "$dir/samples")"
        press_relief_ms=0
    else
        press_relief_ms=$([ "$relief" != 0 ] && echo $((relief - onset)) || echo -)
        figure pressure "$label: onset to relief (below 100Mi)" "$press_relief_ms ms" "onset at t=$((onset / 1000))s; lowest $((below / 1048576)) MiB; $samples samples"
    fi
    # processes the kernel's OOM killer killed (its oom_kill counter and
    # dmesg count some twice)
    press_oom=$(grep -o 'Killed process [0-9]*' "$dir/dmesg" | sort -u | wc -l)
    figure pressure "$label: kernel OOM kills" "$press_oom" "oom_kill counter +$((oom1 - oom0)); $(grep -c 'Out of memory' "$dir/dmesg") global; $(grep -o 'task=[^,]*,pid=[0-9]*' "$dir/dmesg" | sort -u | tr '\n' ' ')"
    press_victims "$dir" "$off"
    figure pressure "$label: victims in order" "${press_order:-none}" "$press_detail"
    # from the BestEffort hog's start (uptime) to the first victim
    v="$(echo "$press_detail" | grep -oE 't=[0-9.]+s' | head -n 1 | tr -d 'ts=')"
    press_first_s="$([ -n "$v" ] && awk -v v="$v" -v b="$t_be" 'BEGIN { printf "%.1f", v - b }' || echo none)"
    figure pressure "$label: BestEffort hog started to first victim" "$press_first_s s" "lowest memory.available $(awk 'NR == 1 || $2 < m { m = $2 } END { printf "%d MiB", m / 1048576 }' "$dir/samples")"
    figure pressure "$label: pods lost" "$press_lost" "survivors: $(for p in kn-ev-guaranteed kn-ev-within; do printf '%s %s ' "$p" "$(pod_field "$p" '{.status.phase}/{.status.containerStatuses[0].restartCount}')"; done)"
    figure pressure "$label: evicted pods rescheduled" "$(echo "$resched" | cut -c1-60)" "$resched"
    kc delete deploy ev-bu ev-be --wait=true --timeout=120s >/dev/null 2>&1
    wait_for "the hogs' pods gone" 180 no_pods 'app in (ev-bu,ev-be)'
}

# Victims of the run in dir $1 (uptime offset $2), in time order, from the
# kubelet's log (its evictions), the plugin's log (kills and evictions) and
# dmesg (kernel OOM kills). Sets press_order, press_detail, press_lost.
press_victims() {
    local dir="$1" off="$2"
    {
        # I1127 14:40:01.123456 ... "Eviction manager: pod is evicted successfully" pod="default/ev-be-..."
        grep 'Eviction manager: pod is evicted successfully' "$dir/kubelet.log" |
            awk -v off="$off" '{ split($2, t, ":"); s = t[1] * 3600 + t[2] * 60 + t[3]; match($0, /pod="default\/[^"]*"/); p = substr($0, RSTART + 13, RLENGTH - 14); print s, p, "kubelet-eviction" }' |
            awk -v off="$off" -v day="$(($(date -u +%s) / 86400 * 86400))" '{ printf "%.2f %s %s\n", day + $1 + off, $2, $3 }'
        # the plugin: a kill of the pod's cgroup, an Eviction through the API
        grep -E 'killing pod|evicted pod through the API server|throttle persists' "$dir/plugin.log" |
            awk -v off="$off" '{ match($0, /"timestamp":"[^"]*"/); ts = substr($0, RSTART + 13, RLENGTH - 14);
                match($0, /"message":"[^"]*"/); m = substr($0, RSTART + 11, RLENGTH - 12);
                w = (m ~ /API/) ? "nri-qos-eviction" : "nri-qos-kill";
                if (match($0, /"name":"ev-[^"]*"/)) p = substr($0, RSTART + 8, RLENGTH - 9); else if (match($0, /ev-[a-z]+-[a-z0-9]+-[a-z0-9]+/)) p = substr($0, RSTART, RLENGTH); else p = "?";
                print ts, p, w }' |
            while read -r ts p w; do
                printf '%.2f %s %s\n' "$(awk -v e="$(date -u -D '%Y-%m-%dT%H:%M:%S' -d "${ts%.*}" +%s)" -v f="0.${ts#*.}" -v off="$off" 'BEGIN { sub(/Z$/, "", f); printf "%.2f", e + f + off }')" "$p" "$w"
            done
        # [  123.456789] oom-kill:...,task_memcg=/kubepods/besteffort/pod<uid>/<id>,task=memhog,pid=...
        grep 'oom-kill:' "$dir/dmesg" | while read -r line; do
            t="$(echo "$line" | sed 's/^\[ *\([0-9.]*\)\].*/\1/')"
            uid="$(echo "$line" | grep -o 'pod[0-9a-f-]\{36\}' | head -n 1 | cut -c4-)"
            p="$(awk -v u="$uid" '$2 == u { print $1; exit }' "$dir/uids")"
            echo "$t ${p:-${uid:-?}} kernel-oom-kill"
        done
    } | sort -n | awk '!seen[$2 " " $3]++' >"$dir/victims"
    press_order="$(awk '{ sub(/-[a-z0-9]+-[a-z0-9]+$/, "", $2); printf "%s%s(%s)", (NR > 1 ? " > " : ""), $2, $3 }' "$dir/victims")"
    press_detail="$(awk '{ printf "t=%.1fs %s %s; ", $1, $2, $3 }' "$dir/victims")"
    press_lost="$(awk '{ print $2 }' "$dir/victims" | sort -u | wc -l)"
}

press_run_checks() {
    local label="$1"
    if [ "$press_oom" = 0 ]; then
        check "pressure.$label.no_kernel_oom" PASS ""
    else
        check "pressure.$label.no_kernel_oom" FAIL "$press_oom kernel OOM kills"
        rc=1
    fi
    first="$(awk 'NR == 1 { sub(/-[a-z0-9]+-[a-z0-9]+$/, "", $2); print $2 }' "/tmp/press-$label/victims")"
    if [ "$first" = ev-bu ]; then
        check "pressure.$label.ranking" PASS "first victim ev-bu (Burstable far above its request) before ev-be, as the kubelet ranks"
    else
        check "pressure.$label.ranking" FAIL "first victim ${first:-none}; order: $press_order"
        rc=1
    fi
    if grep -q kernel-oom-kill "/tmp/press-$label/victims" || [ -z "$press_order" ]; then
        check "pressure.$label.marked_by_api" FAIL "victims: ${press_order:-none}"
        rc=1
    else
        check "pressure.$label.marked_by_api" PASS "$press_order"
    fi
}

if create_pods kn-ev-guaranteed kn-ev-within; then
    # headroom above the kubelet's threshold, in MiB
    avail=$(($(press_sample | cut -d' ' -f2) / 1048576))
    head=$((avail - 100))
    press_hold=$((head * 6 / 10))
    press_grow=$((head * 2))
    figure pressure "memory.available before the hogs" "$avail MiB" "ev-bu holds $press_hold MiB (128Mi requested), ev-be grows at $PRESS_RATE MiB/s"

    # PRESS_MONITOR: shipped (the ConfigMap as installed), or true/false to
    # force [plugin] with-monitor in this run
    if [ "${PRESS_MONITOR:-shipped}" != shipped ]; then
        nri_qos_monitor "$PRESS_MONITOR"
        nri_qos_restart "with-monitor = $PRESS_MONITOR"
    fi
    press_run nri-qos
    nri_qos_relief="$press_relief_ms" nri_qos_first="$press_first_s" nri_qos_oom="$press_oom"
    press_run_checks nri-qos
    kubelet_forget_pressure

    nri_qos_monitor false
    nri_qos_restart "the monitor off"
    press_run "kubelet alone"
    figure pressure "relief: kubelet alone / nri-qos" "$press_relief_ms / $nri_qos_relief ms" "below the kubelet's 100Mi, onset to back above (0: never below as sampled every 100 ms)"
    figure pressure "first victim: kubelet alone / nri-qos" "$press_first_s / $nri_qos_first s" "after the BestEffort hog started"
    figure pressure "kernel OOM kills: kubelet alone / nri-qos" "$press_oom / $nri_qos_oom" ""
    kubelet_forget_pressure
    # back to the shipped ConfigMap
    kc apply -k /e2e/kube/deploy >/dev/null
    nri_qos_restart "the shipped config again"
fi
delete_pods kn-ev-guaranteed kn-ev-within
