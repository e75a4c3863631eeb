# shellcheck shell=sh
# Scenario throttle: the memory.high throttle guard with the shipped
# defaults ([throttle] grace-period 10 s), through Deployments.
# 1. thr-ref churns 240 MiB far below its memory.high: the reference rate.
# 2. thr-app churns the same 240 MiB between its memory.high (236.8Mi) and
#    memory.max (256Mi): throttled from the first `high` event on; the guard
#    must raise memory.high to memory.max within its bound from that onset
#    (docs/pressure.md: grace 10 s + check-interval 2 s + the 2 s rate
#    window, + 1 s), and the churn recover to at least 0.7x the reference.
# 3. thr-psi stalls (memory PSI) at its pod's limit with no high or max
#    event of its own: the guard evicts it through the API (no relax); the
#    pod is marked by the API server, an Evicted Event names it, and its
#    ReplicaSet's replacement runs.
# Sourced by node.sh.

THR_GRACE_MS=10000
# onset to relax at most: grace + check-interval + rate window + 1 s
THR_RELAX_LIMIT_MS=$((THR_GRACE_MS + 2000 + 2000 + 1000))

# The single pod of Deployment $1 (not terminating).
deploy_pod() {
    kc get pods -l "app=$1" -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' | awk 'NF == 1 { print $1; exit }'
}

deploy_ready() { [ "$(kc get deploy "$1" -o jsonpath='{.status.readyReplicas}')" = 1 ]; }

# Mean churn rate (MiB/s) of the last $2 `churn` lines of pod $1's log.
churn_rate() {
    kc logs "$1" 2>/dev/null | awk '$1 == "churn" { r[n++] = $3 } END { s = 0; m = 0; for (i = n - k; i < n; i++) if (i >= 0) { s += r[i]; m++ } if (m) printf "%.1f", s / m; else print 0 }' k="$2"
}

# `high` events of cgroup $1.
high_events() { awk '$1 == "high" { print $2 }' "$1/memory.events"; }

throttle_relax() {
    local pod cg t0 t_on="" t_relax="" ref after limit deadline
    kc create -f /e2e/kube/workloads/thr-ref.yaml >/dev/null
    wait_for "Deployment thr-ref Ready" 300 deploy_ready thr-ref || return
    pod="$(deploy_pod thr-ref)"
    sleep 15
    ref="$(churn_rate "$pod" 10)"
    kc delete deploy thr-ref --wait=true >/dev/null
    wait_for "thr-ref's pod gone" 120 pod_gone "$pod"
    figure throttle "reference churn (unthrottled)" "$ref MiB/s" "thr-ref, 240 MiB, memory.high $(echo "928 MiB")"

    kc create -f /e2e/kube/workloads/thr-app.yaml >/dev/null
    wait_for "thr-app's container cgroup" 300 deploy_ctr_cgroup thr-app app || return
    pod="$(deploy_pod thr-app)"
    cg="$(ctr_cgroup "$pod" app)"
    limit="$(cat "$cg/memory.max")"
    info "thr-app: memory.high $(cat "$cg/memory.high"), memory.max $limit"
    deadline=$(($(now_ms) + 120000))
    while [ "$(now_ms)" -lt "$deadline" ]; do
        [ -n "$t_on" ] || { [ "$(high_events "$cg")" -gt 0 ] && t_on=$(now_ms); }
        if [ -n "$t_on" ] && [ "$(cat "$cg/memory.high")" = "$limit" ]; then
            t_relax=$(now_ms)
            break
        fi
        sleep 0.1
    done
    if [ -n "$t_relax" ]; then
        figure throttle "throttle onset to memory.high = memory.max" "$((t_relax - t_on)) ms" "grace 10 s; the guard's bound $((THR_RELAX_LIMIT_MS / 1000)) s"
        if [ $((t_relax - t_on)) -le "$THR_RELAX_LIMIT_MS" ]; then
            check throttle.relaxed_in_time PASS "$((t_relax - t_on)) ms after the first high event"
        else
            check throttle.relaxed_in_time FAIL "$((t_relax - t_on)) ms after the first high event (limit $THR_RELAX_LIMIT_MS)"
            rc=1
        fi
    else
        figure throttle "throttle onset to memory.high = memory.max" "never (120 s)" "first high event at ${t_on:-none}"
        check throttle.relaxed_in_time FAIL "memory.high $(cat "$cg/memory.high") after 120 s; high events $(high_events "$cg")"
        rc=1
        kc -n kube-system logs "$(ds_pod)" | grep -iE 'throttle|relax' | tail -n 10 | cut -c1-300
        return
    fi
    sleep 12
    after="$(churn_rate "$pod" 10)"
    figure throttle "churn after the relax / reference" "$after / $ref MiB/s" "$(awk -v a="$after" -v r="$ref" 'BEGIN { if (r > 0) printf "%.2fx", a / r }')"
    if awk -v a="$after" -v r="$ref" 'BEGIN { exit !(r > 0 && a >= 0.7 * r) }'; then
        check throttle.recovered PASS "$after MiB/s after the relax, reference $ref"
    else
        check throttle.recovered FAIL "$after MiB/s after the relax, reference $ref (want >= 0.7x)"
        rc=1
    fi
    ev="$(kc get events --field-selector "involvedObject.name=$pod" -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' | grep -i relax | head -n 1)"
    if [ -n "$ev" ]; then check throttle.relax_event PASS "$(echo "$ev" | cut -c1-200)"; else check throttle.relax_event FAIL "no MemoryHighRelaxed event on $pod"; rc=1; fi
    kc delete deploy thr-app --wait=true >/dev/null
}

throttle_psi_only() {
    local pod cg t0 st last="" gone=0 deadline ev repl t_ev="" line
    kc create -f /e2e/kube/workloads/thr-psi.yaml >/dev/null
    wait_for "Deployment thr-psi Ready" 300 deploy_ready thr-psi || return
    pod="$(deploy_pod thr-psi)"
    cg="$(ctr_cgroup "$pod" reader)"
    t0=$(now_s)
    deadline=$((t0 + 240))
    # its state as the API server holds it, until it is gone
    while [ "$(now_s)" -lt "$deadline" ]; do
        st="$(kc get pod "$pod" -o jsonpath='{.status.phase}|{.status.reason}|{.metadata.deletionTimestamp}|{.status.conditions[?(@.type=="DisruptionTarget")].reason}' 2>/dev/null)" || { gone=1; break; }
        [ -z "$st" ] || last="$st"
        # marked: Failed, a reason, a deletion time or a DisruptionTarget
        case "$st" in Failed\|* | *\|?*\|*\|* | *\|*\|?*\|* | *\|*\|*\|?*) [ -n "$t_ev" ] || t_ev=$(now_s) ;; esac
        [ -d "$cg" ] && info "thr-psi reader: $(grep some "$cg/memory.pressure" | cut -d' ' -f2) high $(high_events "$cg") max $(awk '$1 == "max" { print $2 }' "$cg/memory.events") pod max events $(awk '$1 == "max" { print $2 }' "$(dirname "$cg")/memory.events")"
        sleep 2
    done
    figure throttle "PSI-only stall: start to marked by the API" "$([ -n "$t_ev" ] && echo "$((t_ev - t0)) s" || echo never)" "last state phase/reason/deletion/DisruptionTarget: $(echo "$last" | tr '|' /)"
    ev="$(kc get events --field-selector "involvedObject.name=$pod,reason=Evicted" -o jsonpath='{range .items[*]}{.source.component}{.reportingComponent}: {.message}{"\n"}{end}' | head -n 1)"
    if [ "$gone" = 1 ] || [ -n "$t_ev" ]; then
        check throttle.psi_only_evicted PASS "$pod: $last; Event: $(echo "$ev" | cut -c1-200)"
    else
        check throttle.psi_only_evicted FAIL "$pod still there after 240 s: $last"
        rc=1
    fi
    if [ -n "$ev" ]; then check throttle.psi_only_event PASS "$(echo "$ev" | cut -c1-240)"; else check throttle.psi_only_event FAIL "no Evicted Event on $pod"; rc=1; fi
    line="$(kc -n kube-system logs "$(ds_pod)" | grep 'throttle persists' | grep "$pod" | head -n 1)"
    if echo "$line" | grep -q '"signal":"psi"'; then
        check throttle.psi_only_signal PASS "$(echo "$line" | cut -c1-300)"
    else
        check throttle.psi_only_signal FAIL "no throttle eviction naming signal psi: $(echo "$line" | cut -c1-300)"
        rc=1
    fi
    if wait_for "thr-psi's replacement pod Ready" 300 deploy_ready thr-psi; then
        repl="$(deploy_pod thr-psi)"
        figure throttle "PSI-only: replacement pod Ready" "$repl" "the ReplicaSet's"
        check throttle.psi_only_replaced PASS "$repl"
    fi
    kc delete deploy thr-psi --wait=true >/dev/null
}

throttle_relax
throttle_psi_only
