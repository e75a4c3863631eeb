# shellcheck shell=sh
# Scenario away: the DaemonSet's pod deleted mid-run. Pods created right
# after the delete have their containers created while no plugin is
# connected (the runtime goes on without it: its NRI timeout never fails a
# creation); the replacement pod's plugin synchronizes, brings them in
# line (adjust-existing), leaves the pods from before unchanged, and audit
# finds no drift. Sourced by node.sh.

AWAY_BEFORE="kn-guaranteed kn-burstable"
AWAY_DURING="kn-besteffort kn-sidecar"

# Epoch seconds of an RFC 3339 time from the API (YYYY-MM-DDTHH:MM:SSZ).
epoch_of() { date -u -D '%Y-%m-%dT%H:%M:%SZ' -d "$1" +%s 2>/dev/null; }

if create_pods $AWAY_BEFORE; then
    explain_check away.before none $AWAY_BEFORE
    # shellcheck disable=SC2046
    grep -H . $(pod_files $AWAY_BEFORE) >/tmp/away.before
    old="$(ds_pod)"
    t_delete=$(date +%s)
    kc -n kube-system delete pod "$old" --wait=false >/dev/null
    kc create -f /e2e/kube/pods/kn-besteffort.yaml -f /e2e/kube/pods/kn-sidecar.yaml >/dev/null
    # the old plugin is gone once its container stopped
    wait_for "the deleted DaemonSet pod $old gone" 120 pod_gone "$old" kube-system
    wait_for "pods Ready while nri-qos is away or back: $AWAY_DURING" 600 pods_ready $AWAY_DURING
    wait_plugin "the replacement pod"
    new="$(ds_pod)"
    # when the new plugin's Synchronize ended, by its log's own clock
    t_sync="$(kc -n kube-system logs "$new" | grep 'synchronized with the runtime' | head -n 1 | grep -oE '"timestamp":"[^"]*"' | cut -d'"' -f4 | cut -d. -f1)"
    t_sync="$(epoch_of "${t_sync}Z")"
    # containers started after the delete and before the new plugin's sync
    away=0 total=0 list=""
    for p in $AWAY_DURING; do
        for s in $(kc get pod "$p" -o jsonpath='{range .status.containerStatuses[*]}{.name}={.state.running.startedAt}{" "}{end}{range .status.initContainerStatuses[*]}{.name}={.state.terminated.startedAt}{.state.running.startedAt}{" "}{end}'); do
            total=$((total + 1))
            at="$(epoch_of "${s#*=}")"
            if [ -n "$at" ] && [ -n "$t_sync" ] && [ "$at" -ge "$t_delete" ] && [ "$at" -lt "$t_sync" ]; then
                away=$((away + 1))
                list="$list $p/${s%%=*}"
            fi
        done
    done
    figure away "containers started while nri-qos was away" "$away of $total" "delete at $t_delete, new plugin synchronized at ${t_sync:-?} (epoch s):$list"
    if [ "$away" -ge 1 ]; then
        check away.created_without_plugin PASS "$away of $total containers started between the delete and the new plugin's sync:$list"
    else
        check away.created_without_plugin FAIL "no container started in the window (delete $t_delete, sync ${t_sync:-?})"
        rc=1
    fi
    # shellcheck disable=SC2046
    grep -H . $(cut -d: -f1 /tmp/away.before) >/tmp/away.after
    if cmp -s /tmp/away.before /tmp/away.after; then
        check away.values_unchanged PASS "$(wc -l </tmp/away.before) values of $AWAY_BEFORE unchanged across the plugin's restart"
        figure away "values of the pods from before changed" "0 of $(wc -l </tmp/away.before)" ""
    else
        check away.values_unchanged FAIL "$(diff /tmp/away.before /tmp/away.after | grep '^[-+]/' | head -n 8 | tr '\n' ';')"
        figure away "values of the pods from before changed" "$(diff /tmp/away.before /tmp/away.after | grep -c '^+/') of $(wc -l </tmp/away.before)" ""
        rc=1
    fi
    explain_check away.after none $AWAY_BEFORE $AWAY_DURING
    figure away "values equal to explain after the return" "$explain_ok of $explain_all" ""
    if [ "$explain_ok" != "$explain_all" ]; then
        # what tells a container the plugin missed: when it started, the
        # plugin's Synchronize, the runtime's NRI lines
        info "away: sync at $t_sync; started: $(for p in $AWAY_DURING; do kc get pod "$p" -o jsonpath='{range .status.initContainerStatuses[*]}{.name}={.state.running.startedAt}{.state.terminated.startedAt} {end}{range .status.containerStatuses[*]}{.name}={.state.running.startedAt} {end}'; done)"
        kc -n kube-system logs "$new" | grep -E 'synchroniz|registered|configured|relaxed' | cut -c1-300
        grep -iE 'nri|plugin' /var/log/containerd.log | tail -n 25 | cut -c1-300
    fi
    kube_audit away.audit
    figure away "audit drift" "$(echo "$audit_out" | grep -oE '[0-9]+ drifting' | tail -n 1 || echo '?')" ""
fi
delete_pods $AWAY_BEFORE $AWAY_DURING
