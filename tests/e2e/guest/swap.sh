# shellcheck shell=sh
# Scenario swap, sourced by guest.sh (uses its check, $rc and runtimes.sh's
# opens_summary): swap on a zram device, the throttle guard and the monitor
# with swap, and the kubelet's memory.swap.max left as it is.

SWAP_DEV=/dev/zram0
SWAP_BYTES=$((1024 * 1024 * 1024))

# A scenario that says "swap" gets a zram swap device first (the cloud
# kernel's zram, zsmalloc and lzo-rle modules, from the kernel package).
wants_swap() {
    grep -q '"swap"' "/e2e/scenarios/$1.json"
}

swap_on() {
    for m in zsmalloc lzo-rle zram; do
        insmod "/e2e/$m.ko" 2>/dev/null
    done
    if [ -e /sys/block/zram0/disksize ] && echo lzo-rle >/sys/block/zram0/comp_algorithm &&
        echo "$SWAP_BYTES" >/sys/block/zram0/disksize && mkswap "$SWAP_DEV" >/dev/null && swapon "$SWAP_DEV"; then
        check vm.swap PASS "zram $SWAP_BYTES bytes (lzo-rle): $(grep -E '^Swap(Total|Free)' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
    else
        check vm.swap FAIL "no zram swap: $(ls /sys/block 2>&1 | tr '\n' ' ')"
        rc=1
    fi
}

swap_off() {
    swapoff "$SWAP_DEV" 2>/dev/null && echo 1 >/sys/block/zram0/reset
}

# A "key=value" field of a log line.
field() {
    echo "$2" | grep -oE "$1=\"?[^\" ]+" | head -n 1 | sed 's/.*=//; s/"//g'
}

# After the scenario's steps (its pods still running). $1: its first log
# line, $2: the plugin pids during it.
swap_checks() {
    log="$(tail -n +"$1" /var/log/nri-qos.log 2>/dev/null | sed -e 's/\x1b\[[0-9;]*m//g')"
    reclaim=88888888-0033-4888-8888-888888888888
    stall=88888888-0034-4888-8888-888888888888
    # Reclaimed into swap at memory.high, not stalled: left alone.
    acted="$(echo "$log" | grep "$reclaim" | grep -E 'memory.high throttle decision|throttle persists|killing pod' | grep -vE 'action="?(calm|throttled|settling)' | head -n 2 | cut -c1-300)"
    if [ -z "$acted" ]; then
        check swap.reclaiming_left_alone PASS "no relax, eviction or kill of sw-reclaim"
    else
        check swap.reclaiming_left_alone FAIL "$(echo "$acted" | tr '\n' ';')"
        rc=1
    fi
    # Stalled at memory.high with its swap full: relaxed (stage 1) or, if
    # the stall outlasts that or shows no `high` rate, evicted (stage 2).
    # The guard's grace starts when it first sees the stall, which a guest
    # busy compressing into zram can delay: wait for its action, bounded.
    acted=""
    for _ in $(seq 1 60); do
        acted="$(tail -n +"$1" /var/log/nri-qos.log 2>/dev/null | sed -e 's/\x1b\[[0-9;]*m//g' |
            grep "$stall" | grep -E 'action="?relax[" ]|evicting pod: memory.high throttle persists' | head -n 1)"
        [ -n "$acted" ] && break
        sleep 1
    done
    if [ -n "$acted" ]; then
        check swap.stalled_acted_on PASS "$(echo "$acted" | grep -oE '^[^ ]+|action="?[a-z-]+"?|signal="?[a-z]+"?|(high_rate|psi_some_avg10)=[0-9.]+' | tr '\n' ' ')"
    else
        # Not acted on: right only if it no longer stalls (the guard's
        # threshold is PSI some avg10 10 % with no `high` rate left).
        psi="$(awk -F'[ =]' '/^some/ {print $3}' "/sys/fs/cgroup/kubepods/burstable/pod$stall/memory.pressure" 2>/dev/null)"
        if [ -n "$psi" ] && awk -v p="$psi" 'BEGIN {exit !(p < 10)}'; then
            check swap.stalled_acted_on PASS "no longer stalled, nothing to act on: pod memory.pressure some avg10 $psi; $(tail -n +"$1" /var/log/nri-qos.log | grep "$stall" | tail -n 1 | cut -c1-200)"
        else
            check swap.stalled_acted_on FAIL "neither relaxed nor evicted in 60 s more, pod memory.pressure some avg10 ${psi:-unknown}: $(tail -n +"$1" /var/log/nri-qos.log | grep "$stall" | tail -n 2 | cut -c1-300 | tr '\n' ';')"
            rc=1
        fi
    fi
    # memory.swap.max is the kubelet's (as the client sent it; guarded and
    # relaxed containers alike): after all the guard did, each still holds
    # calcSwapForBurstablePods' value, in pages, or 0.
    swap_max_kept
    # And the kernel saw no open of one for writing by nri-qos's processes
    # ($2), its guard's relaxes and evictions included.
    if [ "$opens_traced" = 1 ]; then
        counts="$(opens_summary "$2")"
        case "$counts" in
        *" swap_max_writes=0"*) check swap.swap_max_not_written PASS "nri-qos (pids $2): $counts" ;;
        *) check swap.swap_max_not_written FAIL "nri-qos (pids $2) opened memory.swap.max for writing: $counts"; rc=1 ;;
        esac
    fi
    available_as_kubelet
}

# The monitor's memory.available is the kubelet's: MemTotal - working set
# (root memory.stat anon + file - inactive_file, as cAdvisor has it); swap
# is neither available (SwapFree) nor used (swapped-out pages leave anon).
# Measured with pages in swap: a process outside kubepods (nothing for the
# guard or the monitor to act on) holds 64 MiB under a 32 MiB memory.high.
available_as_kubelet() {
    holder=/sys/fs/cgroup/e2e-swap-holder
    mkdir -p "$holder" && echo $((32 << 20)) >"$holder/memory.high"
    sh -c "echo \$\$ >$holder/cgroup.procs && exec /e2e/bin/memhog 64 0 600" >/dev/null 2>&1 &
    hold=$!
    i=0
    while [ "$(cat "$holder/memory.swap.current" 2>/dev/null || echo 0)" -lt $((16 << 20)) ] && [ $i -lt 120 ]; do
        sleep 0.5
        i=$((i + 1))
    done
    once="$(/e2e/bin/nri-qos monitor --once 2>/dev/null | head -n 1)"
    ours="$(field available "$once")"
    kubelet="$(awk -v cap="$(awk '/^MemTotal/ { print $2 * 1024 }' /proc/meminfo)" '
        $1 == "anon" { a = $2 } $1 == "file" { f = $2 } $1 == "inactive_file" { i = $2 }
        END { printf "%d", cap - (a + f - i) }' /sys/fs/cgroup/memory.stat)"
    swap_used="$(awk '/^SwapTotal/ { t = $2 } /^SwapFree/ { f = $2 } END { printf "%d", (t - f) * 1024 }' /proc/meminfo)"
    swap_free="$(awk '/^SwapFree/ { printf "%d", $2 * 1024 }' /proc/meminfo)"
    kill "$hold" 2>/dev/null
    wait "$hold" 2>/dev/null
    rmdir "$holder" 2>/dev/null
    diff=$((${ours:-0} - ${kubelet:-0}))
    detail="monitor available=${ours:-none}, kubelet's MemTotal - (anon + file - inactive_file) $kubelet (diff $diff), swap used $swap_used, SwapFree $swap_free, MemAvailable $(awk '/^MemAvailable/ { print $2 * 1024 }' /proc/meminfo)"
    if [ -n "$ours" ] && [ "${diff#-}" -lt $((16 << 20)) ] && [ "$swap_used" -ge $((16 << 20)) ]; then
        check swap.available_as_kubelet PASS "$detail"
    else
        check swap.available_as_kubelet FAIL "$detail (want |diff| < 16Mi with >= 16Mi in swap)"
        rc=1
    fi
}

# Every container of the scenario's pods (their sandboxes aside):
# memory.swap.max as the kubelet sent it, request (64Mi) / MemTotal x SwapTotal for the Burstable ones, 0
# for the Guaranteed and BestEffort one.
swap_max_kept() {
    limited="$(awk '/^MemTotal/ { m = $2 * 1024 } /^SwapTotal/ { s = $2 * 1024 }
        END { b = int(67108864 / m * s); printf "%d", b - b % 4096 }' /proc/meminfo)"
    bad="" seen=""
    sandboxes="$(/e2e/bin/cri-client list 2>/dev/null | awk '$1 == "sandbox" { print $2 }' | tr '\n' ' ')"
    for d in /sys/fs/cgroup/kubepods/pod88888888-003?-* /sys/fs/cgroup/kubepods/*/pod88888888-003?-*; do
        for c in "$d"/*/; do
            [ -f "$c/memory.swap.max" ] || continue
            # a sandbox's container: no CRI resources, the runtime's values
            id="${c%/}"
            case " $sandboxes " in *" ${id##*/} "*) continue ;; esac
            case "$d" in */burstable/*) want=$limited ;; *) want=0 ;; esac
            got="$(cat "$c/memory.swap.max")"
            pod="${d##*/pod88888888-}"
            seen="$seen ${pod%%-*}=$got"
            [ "$got" = "$want" ] || bad="$bad ${c#/sys/fs/cgroup/}=$got(want $want)"
        done
    done
    if [ -n "$seen" ] && [ -z "$bad" ]; then
        check swap.swap_max_kept PASS "the kubelet's memory.swap.max in every running container:$seen"
    else
        check swap.swap_max_kept FAIL "${bad:-no container found}"
        rc=1
    fi
}
