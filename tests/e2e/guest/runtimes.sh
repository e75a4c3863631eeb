# shellcheck shell=sh
# containerd 2.2 and 2.3 (NRI v0.11, v0.12), sourced by guest.sh (uses its
# check, info, audit, pid_of, relaunch_plugin, dump_logs and $rc): how many
# cgroup reads nri-qos makes to learn who owns a pod's protection, whether a
# restart leaves its own values its own, whether it answers on the dedicated
# NRI v0.12 RPCs, and the switch to the second containerd of a 2.2+2.3 boot.

# The runtime shows plugins each container's CRI unified map (NRI v0.10 on).
shows_unified() {
    [ "$E2E_RUNTIME" = crio ] && return 0
    case "$E2E_CONTAINERD" in 2.2 | 2.3) return 0 ;; esac
    return 1
}

# --- cgroup reads, counted by the kernel ----------------------------------------
# Every open of a memory.min, memory.low, memory.high or memory.swap.max file
# under kubepods,
# with its opener and flags, from a kprobe on do_filp_open (tracefs; the
# cloud kernel has CONFIG_KPROBE_EVENTS): x86-64 passes the struct filename
# (its first member the name) in %si and the open_flags (open_flag first)
# in %dx. Nothing in nri-qos is asked: the kernel counts.
TRACE=/sys/kernel/tracing
opens_trace_on() {
    [ -f "$TRACE/kprobe_events" ] || mount -t tracefs tracefs "$TRACE" 2>/dev/null || return 1
    if [ ! -d "$TRACE/events/e2e_open" ]; then
        echo 'p:e2e_open/open do_filp_open path=+0(+0(%si)):string flags=+0(%dx):x32' >>"$TRACE/kprobe_events" || return 1
    fi
    echo 'path ~ "/sys/fs/cgroup/kubepods*/memory.min" || path ~ "/sys/fs/cgroup/kubepods*/memory.low" || path ~ "/sys/fs/cgroup/kubepods*/memory.high" || path ~ "/sys/fs/cgroup/kubepods*/memory.swap.max"' \
        >"$TRACE/events/e2e_open/open/filter" || return 1
    echo 1 >"$TRACE/options/record-tgid"
    echo 4096 >"$TRACE/buffer_size_kb"
    echo 1 >"$TRACE/tracing_on"
}
# Traced only during the scenarios that count them (every open in the node
# passes the probe: the monitor's many, under emulation), never while
# containerd starts (a pre-launched plugin must register within its
# timeout).
opens_tracing=0
opens_traced=0
opens_start() {
    opens_traced=0
    [ "$opens_tracing" = 1 ] || return 0
    case "$1" in basic | kubelet | restart | memoryqos | podresize | swap) ;; *) return 0 ;; esac
    : >"$TRACE/trace"
    echo 1 >"$TRACE/events/e2e_open/open/enable"
    opens_traced=1
}
opens_stop() {
    [ "$opens_tracing" = 1 ] && echo 0 >"$TRACE/events/e2e_open/open/enable"
}

# The opens since opens_start by the processes $1 (pids, space separated),
# the monitor's thread aside (its own reads, not ownership): reads of a
# container cgroup's memory.min/low (where the kubelet may have hidden a
# key: the ownership reads), of its memory.high, of pod and of QoS/kubepods
# cgroups, writes, and writes of memory.swap.max (the kubelet's alone).
opens_summary() {
    awk -v pids=" $1 " '
        /^ *#/ { next }
        match($0, /\( *[0-9]+\)/) {
            tgid = substr($0, RSTART + 1, RLENGTH - 2)
            gsub(/ /, "", tgid)
            if (index(pids, " " tgid " ") == 0) next
            thread = $1
            sub(/-[0-9]+$/, "", thread)
            if (thread == "nri-qos-monitor") { monitor++; next }
            path = $0; sub(/.*path="/, "", path); sub(/".*/, "", path)
            fl = $0; sub(/.*flags=0x/, "", fl); sub(/[^0-9a-f].*/, "", fl)
            # O_ACCMODE (flags & 3) != 0: opened for writing
            w = (index("0123456789abcdef", substr(fl, length(fl), 1)) - 1) % 4 != 0
            if (path ~ /memory\.swap\.max$/) { if (w) swapw++; next }
            if (w) { writes++; next }
            if (path ~ /\/pod[^\/]*\/[^\/]+\/memory\.(min|low)$/) ctr++
            else if (path ~ /\/pod[^\/]*\/[^\/]+\/memory\.high$/) high++
            else if (path ~ /\/pod[^\/]*\/memory\./) pod++
            else parents++
        }
        END {
            printf "container_min_low=%d container_high=%d pod=%d parents=%d writes=%d monitor=%d swap_max_writes=%d\n",
                ctr, high, pod, parents, writes, monitor, swapw
        }' "$TRACE/trace"
}

# After scenario $1 on a runtime that shows the unified map: the kubelet's
# keys are in what the runtime sends, so no container cgroup's memory.min or
# memory.low may be read to find them ($2: the plugin pids of the scenario).
ownership_reads() {
    [ "$opens_traced" = 1 ] && [ -n "$2" ] && [ "$E2E_RUNTIME" = containerd ] && shows_unified || return 0
    counts="$(opens_summary "$2")"
    case "$counts" in
    container_min_low=0\ *) check "$1.ownership_reads" PASS "no container cgroup read for the kubelet's keys (the unified map shows them); nri-qos pids $2: $counts" ;;
    *)
        check "$1.ownership_reads" FAIL "nri-qos (pids $2) read container memory.min/low although the runtime shows the unified map: $counts"
        rc=1
        ;;
    esac
}

# --- a restart must leave nri-qos's own values its own ------------------------------
# Every memory and cpu value of the kubepods tree, one "cgroup/file value" a line.
tree_values() {
    find /sys/fs/cgroup/kubepods -type f 2>/dev/null | grep -E '/(memory\.(min|low|high|max)|cpu\.(weight|max))$' | sort |
        while read -r f; do echo "${f#/sys/fs/cgroup/} $(cat "$f" 2>/dev/null)"; done
}

# "pod/container source" of each policy decision in the plugin's log lines
# from $1 on (one per container and source).
request_sources() {
    tail -n +"$1" /var/log/nri-qos.log 2>/dev/null | sed -e 's/\x1b\[[0-9;]*m//g' | grep 'policy decision' |
        sed -n 's/.*pod=\([^ ]*\) container=\([^ ]*\) .*request_source=\([A-Za-z]*\).*/\1\/\2 \3/p' | sort -u
}

# Every parent in kubepods (pod, QoS and kubepods cgroups) holds at least
# the memory.min and memory.low of its children together, which their
# protection needs (scenario protection). Prints what falls short.
parents_short() {
    for p in /sys/fs/cgroup/kubepods /sys/fs/cgroup/kubepods/*/ /sys/fs/cgroup/kubepods/*/pod*/; do
        p="${p%/}"
        [ -f "$p/memory.min" ] || continue
        for f in memory.min memory.low; do
            sum=0
            for c in "$p"/*/; do
                [ -f "$c$f" ] && sum=$((sum + $(cat "$c$f")))
            done
            have="$(cat "$p/$f")"
            [ "$have" -ge "$sum" ] || echo "${p#/sys/fs/cgroup/}/$f=$have<children $sum"
        done
    done
}

# Scenario restart (basic's pods), pre-launched on containerd 2.2/2.3 (it
# runs after the scenarios that check the keeper's sums, so that a plugin
# which fails it fails nothing else): from 2.2 on, the runtime's
# Synchronize after a restart reports each container's unified map with what
# nri-qos adjusted merged in. The relaunched plugin must still tell its own
# values from the kubelet's: owners, request sources and every kernel value
# stay as they were, and a pod created after the restart is protected in its
# parents like the ones before it. $1: the scenario's first log line.
restart_keeps_ours() {
    [ "$E2E_PLUGIN" = prelaunched ] && shows_unified && [ "$E2E_RUNTIME" = containerd ] || return 0
    sleep 1 # the keeper's pass after the last event
    tree_before="$(tree_values)"
    sources_before="$(request_sources "$1")"
    # The table alone (stdout), rows sorted: the runtime lists containers in
    # no fixed order.
    audit_before="$(/e2e/bin/nri-qos audit --socket /var/run/nri/nri.sock --timeout-seconds 20 2>/dev/null | grep -v 'drifting values' | sort)"
    short_before="$(parents_short)"
    info "nri_qos_events_total before the restart: $(metrics_events | tr '\n' ' ')"
    from=$(($(wc -l </var/log/nri-qos.log) + 1))
    old="$(pid_of /opt/nri/plugins/10-nri-qos || true)"
    if ! relaunch_plugin 'synchronized with the runtime' "$old"; then
        check restart.relaunched FAIL "old pid ${old:-none}, new pid ${new:-none}: not relaunched and synchronized after $waited_s s"
        grep -ai 'nri\|plugin' "$RUNTIME_LOG" | tail -n 40
        rc=1
        return
    fi
    restart_pids="$old $new"
    sleep 2 # the new keeper's first pass
    tree_after="$(tree_values)"
    if [ "$tree_before" = "$tree_after" ]; then
        check restart.kernel_values_kept PASS "$(echo "$tree_after" | wc -l) values of the kubepods tree unchanged after containerd $E2E_CONTAINERD restarted (pid $old -> $new)"
    else
        check restart.kernel_values_kept FAIL "changed: $(echo "$tree_before" >/tmp/tree.before; echo "$tree_after" | grep -vxF -f /tmp/tree.before | head -n 8 | tr '\n' ';') was: $(echo "$tree_after" >/tmp/tree.after; echo "$tree_before" | grep -vxF -f /tmp/tree.after | head -n 8 | tr '\n' ';')"
        rc=1
    fi
    sources_after="$(request_sources "$from")"
    if [ -n "$sources_after" ] && [ "$sources_before" = "$sources_after" ]; then
        check restart.request_sources_kept PASS "$(echo "$sources_after" | tr '\n' ';')"
    else
        check restart.request_sources_kept FAIL "before: $(echo "$sources_before" | tr '\n' ';') after: $(echo "$sources_after" | tr '\n' ';')"
        rc=1
    fi
    audit_after="$(/e2e/bin/nri-qos audit --socket /var/run/nri/nri.sock --timeout-seconds 20 2>/dev/null | grep -v 'drifting values' | sort)"
    kubelet_owned="$(tail -n +"$from" /var/log/nri-qos.log | sed -e 's/\x1b\[[0-9;]*m//g' | grep -E 'owner="?kubelet' | grep -oE 'cgroup=[^ ]+' | sort -u | tr '\n' ' ')"
    if [ -z "$kubelet_owned" ] && [ "$audit_before" = "$audit_after" ]; then
        check restart.owners_kept PASS "no cgroup handed to the kubelet; audit table (owners, request sources, values) unchanged"
    else
        check restart.owners_kept FAIL "handed to the kubelet: ${kubelet_owned:-none}; audit rows now: $(echo "$audit_before" >/tmp/audit.before; echo "$audit_after" | grep -vxF -f /tmp/audit.before | head -n 6 | tr -s ' ' | tr '\n' ';') were: $(echo "$audit_after" >/tmp/audit.after; echo "$audit_before" | grep -vxF -f /tmp/audit.after | head -n 6 | tr -s ' ' | tr '\n' ';')"
        rc=1
    fi
    # A pod created now must be protected in its parents like the others.
    /e2e/bin/cri-client run /e2e/scenarios/late.json --keep --expect-explain || rc=1
    i=0
    while [ -n "$(parents_short)" ] && [ $i -lt 20 ]; do sleep 0.5; i=$((i + 1)); done
    short="$(parents_short)"
    if [ -z "$short" ]; then
        check restart.new_pod_protected_in_parents PASS "pod, QoS and kubepods cgroups cover their children after a pod created after the restart: $(cat /sys/fs/cgroup/kubepods/burstable/memory.low) burstable memory.low, $(cat /sys/fs/cgroup/kubepods/memory.min) kubepods memory.min"
    else
        check restart.new_pod_protected_in_parents FAIL "$(echo "$short" | tr '\n' ' ') (before the restart: ${short_before:-all covered})"
        rc=1
    fi
}

# --- the NRI events and the RPC each came by --------------------------------------
# The plugin's own count, nri_qos_events_total{event,path} (metrics endpoint,
# on for 2.2/2.3 in guest.sh), one series a line; its process's alone.
metrics_events() {
    wget -q -O- http://127.0.0.1:9464/metrics 2>/dev/null | grep '^nri_qos_events_total' | sed 's/^nri_qos_events_total//'
}
# Every event of every plugin process of this containerd (a debug line each):
# "event/path=count ...".
events_logged() {
    sed -e 's/\x1b\[[0-9;]*m//g' /var/log/nri-qos.log 2>/dev/null |
        sed -n 's/.* event event="\{0,1\}\([a-z_]*\)"\{0,1\} path="\{0,1\}\([a-z_]*\).*/\1\/\2/p' |
        sort | uniq -c | awk '{ printf "%s=%s ", $2, $1 }'
}

# The event mask the plugin registered (its "configured by the runtime"
# line, each process of this containerd): 0xECD on NRI v0.10 and later, the
# seven events of every runtime and UpdatePodSandbox. Then the path of each
# event: containerd 2.3 (NRI v0.12) calls each event's own RPC and, when a
# plugin answers Unimplemented, falls back to the deprecated StateChange
# with a warning per event type: there must be none, and every event the
# plugin counted came by its own RPC. 2.2 (NRI v0.11) has StateChange only
# for the events without an answer: reported.
dedicated_rpcs() {
    [ "$E2E_PLUGIN" != none ] && [ "$E2E_RUNTIME" = containerd ] && shows_unified || return 0
    configured="$(sed -e 's/\x1b\[[0-9;]*m//g' /var/log/nri-qos.log 2>/dev/null | grep 'configured by the runtime')"
    masks="$(echo "$configured" | grep -oE 'events=0x[0-9a-f]+' | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
    nri="$(echo "$configured" | grep -oE 'nri_version(_from)?=[^ ]+' | sort -u | tr -d '"' | tr '\n' ' ')"
    if [ -n "$configured" ] && ! echo "$configured" | grep -qv 'events=0xecd'; then
        check nri.event_mask PASS "containerd $E2E_CONTAINERD: every plugin process registered events=0xecd ($masks $nri)"
    else
        check nri.event_mask FAIL "containerd $E2E_CONTAINERD: ${masks:-no configured line} $nri (want 0xecd)"
        rc=1
    fi
    logged="$(events_logged)"
    counted="$(metrics_events | tr '\n' ' ')"
    info "events on containerd $E2E_CONTAINERD, logged by every plugin process: ${logged:-none}; nri_qos_events_total of the running one: ${counted:-endpoint not answering}"
    [ "$E2E_CONTAINERD" = 2.3 ] || return 0
    registered="$(grep -a 'registered as' "$RUNTIME_LOG" | grep -v audit | tail -n 1 | sed 's/.*msg=//' | cut -c1-200)"
    deprecated="$(grep -a 'deprecated interface' "$RUNTIME_LOG" | sed -n 's/.*details=\(.*\)/\1/p' | sort | uniq -c | tr -s ' ' | tr '\n' ';' | cut -c1-600)"
    if [ -z "$deprecated" ] && [ -n "$logged" ] && ! echo "$logged $counted" | grep -q 'state_change' &&
        echo "$counted" | grep -q 'path="dedicated"'; then
        check nri.dedicated_rpcs PASS "no StateChange: none logged by containerd, none among the events nri-qos logged or counted; ${registered:-no registration line}"
    else
        check nri.dedicated_rpcs FAIL "containerd's StateChange fallbacks: ${deprecated:-none}; logged: ${logged:-none}; counted: ${counted:-none}; ${registered:-}"
        rc=1
    fi
}

# --- 2.2+2.3 in one boot ---------------------------------------------------------
# The node goes on with the second containerd, as after an upgrade of a
# drained node: every pod removed, the runtime stopped (its pre-launched
# plugin ends with it), the runtime's state and the kubepods tree gone, the
# first version's logs kept beside (containerd-2.2.log, nri-qos-2.2.log).
# guest.sh then runs again from the runtime on (E2E_PHASE2), keeping $rc.
next_containerd() {
    [ -n "${E2E_NEXT_CONTAINERD:-}" ] || return 0
    [ $rc -eq 0 ] || dump_logs
    info "containerd $E2E_CONTAINERD done; switching to containerd $E2E_NEXT_CONTAINERD"
    /e2e/bin/cri-client cleanup >/dev/null 2>&1
    [ -z "$plugin_pid" ] || kill "$plugin_pid" 2>/dev/null
    kill "$(pid_of "$RUNTIME_MATCH")" 2>/dev/null
    i=0
    while { pid_of "$RUNTIME_MATCH" || pid_of /opt/nri/plugins/10-nri-qos || pid_of containerd-shim; } >/dev/null && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    for m in "$RUNTIME_MATCH" /opt/nri/plugins/10-nri-qos containerd-shim; do
        while p="$(pid_of "$m")"; do kill -9 "$p" 2>/dev/null || break; sleep 0.1; done
    done
    rm -rf /var/lib/containerd /run/containerd /var/run/nri
    find /sys/fs/cgroup/kubepods -depth -type d -exec rmdir {} \; 2>/dev/null
    left="$(find /sys/fs/cgroup/kubepods -type d 2>/dev/null | wc -l)"
    for f in "$RUNTIME_LOG" /var/log/nri-qos.log; do
        [ -f "$f" ] && mv "$f" "${f%.log}-$E2E_CONTAINERD.log"
    done
    cp /opt/containerd-"$E2E_NEXT_CONTAINERD"/* /usr/bin/
    check "containerd.switch_to_$E2E_NEXT_CONTAINERD" "$([ "$left" = 0 ] && echo PASS || echo FAIL)" "containerd $E2E_CONTAINERD stopped after $((i * 100)) ms, its state and pods gone ($left kubepods cgroups left)"
    exec env E2E_PHASE2=1 E2E_PHASE1_RC="$rc" sh /e2e/guest.sh
}
