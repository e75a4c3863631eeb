#!/bin/sh
# Stage 2 of the e2e VM: set up a minimal node (cgroup v2, containerd, NRI),
# optionally install nri-qos, run the scenarios with the CRI client and report
# on the serial console. Everything the host parses starts with "E2E-".
# Settings come from /e2e/env (written by run.sh).
set -u
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
# shellcheck source=/dev/null
. /e2e/env
# The second containerd of a 2.2+2.3 boot (next_containerd in runtimes.sh);
# the resilience sequence runs with the last one.
[ -z "${E2E_PHASE2:-}" ] || { E2E_CONTAINERD="$E2E_NEXT_CONTAINERD" E2E_NEXT_CONTAINERD=""; }
[ -z "${E2E_NEXT_CONTAINERD:-}" ] || E2E_RESILIENCE=0
exec >/dev/console 2>&1
echo # the firmware leaves escape codes on the console line; start a clean one

uptime_s() { cut -d' ' -f1 /proc/uptime; }
info() { echo "E2E-INFO t=$(uptime_s)s $*"; }
check() { echo "E2E-CHECK $1 $2 ${3:-}"; }
finish() {
    info "done rc=$1"
    echo "E2E-DONE rc=$1"
    sync
    poweroff -f
    reboot -f
}

# The node is set up once per boot. A boot with two containerd versions
# (run.sh --containerd 2.2+2.3) runs this script a second time for the
# second one (E2E_PHASE2=1, see next_containerd), from the runtime on.
if [ -z "${E2E_PHASE2:-}" ]; then
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null || true
mkdir -p /dev/pts /dev/shm /run /tmp /var/log /var/lib /var/run
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup
[ -e /var/run ] || ln -s /run /var/run
hostname e2e-node
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
info "kernel $(uname -r), stage 2 up"

# run.sh E2E_TEST_FREEZE=1 (its first boot only): play a guest frozen after
# stage 2 whose kernel still reports stalls, to prove run.sh reboots it.
case " $(cat /proc/cmdline) " in
*" e2e.test_freeze=1 "*)
    info "test: playing a frozen guest"
    exec sh -c 'while sleep 20; do echo "<3>e2e test: a stalled kernel still speaking" >/dev/kmsg; done' >/dev/null 2>&1
    ;;
esac
# A sign of life every 60 s: run.sh takes a console silent for minutes
# (E2E_SILENCE_LIMIT) for a frozen guest or qemu, and boots again.
heartbeat() {
    while sleep 60; do echo "E2E-ALIVE t=$(uptime_s)s"; done
}
heartbeat &
# Under `quiet` the kernel's clock choice is not printed; a guest whose
# timers stop goes silent, so say it (TCG: hpet, the TSC is not offered).
cs=/sys/devices/system/clocksource/clocksource0
info "clocksource $(cat $cs/current_clocksource) (available: $(cat $cs/available_clocksource))"

# cgroup v2 as the kubelet's node has it: controllers delegated below the root.
controllers="$(cat /sys/fs/cgroup/cgroup.controllers)"
for c in $controllers; do echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true; done
check vm.cgroup2 "$([ -f /sys/fs/cgroup/cgroup.subtree_control ] && echo PASS || echo FAIL)" "controllers: $controllers"
check vm.psi "$([ -f /sys/fs/cgroup/memory.pressure ] || [ -f /proc/pressure/memory ] && echo PASS || echo FAIL)" ""
info "MemTotal $(awk '/MemTotal/ {print $2}' /proc/meminfo) kB"
fi # node set up

# A Kubernetes node (run.sh --kube-node): tests/e2e/kube/guest/node.sh runs
# the rest of this boot, its own runtime start and nri-qos install included.
if [ -f /e2e/kube/env ]; then
    # shellcheck source=tests/e2e/kube/guest/node.sh
    . /e2e/kube/node.sh
    finish "$rc"
fi

if [ "${E2E_THROTTLE_BENCH:-0}" = 1 ]; then
    # The monitor's memory.high throttle guard on hand-made pod cgroups.
    info "throttle bench"
    if NRI_QOS=/e2e/bin/nri-qos MEMHOG=/e2e/bin/memhog sh /e2e/throttle.sh /tmp/throttle 2>/tmp/throttle.err; then
        check throttle.bench PASS ""
    else
        check throttle.bench FAIL "$(tail -n 3 /tmp/throttle.err | tr '\n' ' ')"
    fi
    sed 's/^/E2E-INFO /' /tmp/throttle.err
    for f in /tmp/throttle/summary.txt /tmp/throttle/*.log; do
        [ -f "$f" ] && sed "s#^#E2E-RAW ${f##*/} #" "$f"
    done
    finish 0
fi

if [ "${E2E_PRESSURE_BENCH:-0}" = 1 ]; then
    # `nri-qos monitor` alone on hand-made pod cgroups (no runtime in the
    # timing): raw results go to the console, the host computes the figures.
    info "pressure bench: runs=$E2E_BENCH_RUNS idle=${E2E_BENCH_IDLE_S}s rate=${E2E_BENCH_RATE}MiB/s"
    if RUNS=$E2E_BENCH_RUNS IDLE_S=$E2E_BENCH_IDLE_S RATE=$E2E_BENCH_RATE NRI_QOS=/e2e/bin/nri-qos \
        MEMHOG=/e2e/bin/memhog sh /e2e/pressure.sh /tmp/bench 2>/tmp/bench.err; then
        check pressure.bench PASS ""
    else
        check pressure.bench FAIL "$(tail -n 3 /tmp/bench.err | tr '\n' ' ')"
    fi
    sed 's/^/E2E-INFO /' /tmp/bench.err
    for f in /tmp/bench/summary.txt /tmp/bench/monitor.log /tmp/bench/run*-hog.log /tmp/bench/run*-watch.log; do
        [ -f "$f" ] && sed "s#^#E2E-RAW ${f##*/} #" "$f"
    done
    finish 0
fi

if [ "$E2E_PLUGIN" != none ]; then
    # Both modes read /etc/nri-qos/nri-qos.toml. The runtime discards a
    # pre-launched plugin's stderr and there is no journal here: log to a file.
    # The memory-pressure monitor runs in the plugin process, fed its pods.
    mkdir -p /etc/nri-qos
    printf '[plugin]\nlog-file = "/var/log/nri-qos.log"\nlog-level = "nri_qos=debug"\nwith-monitor = true\n' >/etc/nri-qos/nri-qos.toml
    # containerd 2.2/2.3: nri_qos_events_total{event,path} says which RPC
    # each event came by (runtimes.sh, event_paths).
    case "${E2E_RUNTIME:-containerd}/$E2E_CONTAINERD" in
    containerd/2.2 | containerd/2.3) printf '[metrics]\nenabled = true\n' >>/etc/nri-qos/nri-qos.toml ;;
    esac
fi
# kubeapi: etcd and kube-apiserver on the guest's loopback, started before the
# runtime (which launches the pre-launched plugin), and the plugin configured
# with their kubeconfig: its pod facts and evictions come from the API.
kube_wanted=0
case " $E2E_SCENARIOS " in *" kubeapi "*) kube_wanted=1 ;; esac
export KUBECONFIG=/e2e/kube/kubeconfig
start_kube() {
    t0=$(uptime_s)
    mkdir -p /var/lib/etcd /var/lib/kube-apiserver
    etcd --name e2e --data-dir /var/lib/etcd \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster e2e=http://127.0.0.1:2380 >/var/log/etcd.log 2>&1 &
    kube-apiserver --etcd-servers=http://127.0.0.1:2379 --bind-address=127.0.0.1 \
        --advertise-address=127.0.0.1 --secure-port=6443 \
        --tls-cert-file=/e2e/kube/tls.crt --tls-private-key-file=/e2e/kube/tls.key \
        --token-auth-file=/e2e/kube/tokens.csv --authorization-mode=AlwaysAllow \
        --service-account-issuer=https://127.0.0.1:6443 --service-account-key-file=/e2e/kube/sa.pub \
        --service-account-signing-key-file=/e2e/kube/sa.key --service-cluster-ip-range=10.0.0.0/24 \
        --disable-admission-plugins=ServiceAccount --endpoint-reconciler-type=none \
        --cert-dir=/var/lib/kube-apiserver >/var/log/kube-apiserver.log 2>&1 &
    i=0
    # ready, and its bootstrap made the default namespace
    while ! kubectl get --raw /readyz >/dev/null 2>&1 || ! kubectl get namespace default >/dev/null 2>&1; do
        [ $i -lt 300 ] || break
        sleep 1
        i=$((i + 1))
    done
    t1=$(uptime_s)
    rss="etcd $(awk '/VmRSS/ {print $2}' /proc/"$(pid_of 'etcd --name')"/status 2>/dev/null) kB, kube-apiserver $(awk '/VmRSS/ {print $2}' /proc/"$(pid_of 'kube-apiserver --etcd')"/status 2>/dev/null) kB"
    if kubectl get namespace default >/dev/null 2>&1; then
        check kube.apiserver_ready PASS "ready $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s after start (t=${t1}s); RSS $rss"
    else
        check kube.apiserver_ready FAIL "not ready after 300 s: $(tail -n 5 /var/log/kube-apiserver.log | tr '\n' ' ')"
        tail -n 30 /var/log/etcd.log /var/log/kube-apiserver.log
        finish 1
    fi
}

# The kubelet's part after an Eviction, played for the monitor: a pod the API
# marks for deletion (deletionTimestamp) has its cgroup killed, as the
# kubelet terminates it (without its grace period: the scenario expects 137).
kube_kubelet_standin() {
    kubectl get pods -A --watch -o jsonpath='{.metadata.uid} {.metadata.name} {.metadata.deletionTimestamp}{"\n"}' 2>/dev/null |
        while read -r uid name deleted; do
            [ -n "$deleted" ] || continue
            for d in /sys/fs/cgroup/kubepods/pod"$uid" /sys/fs/cgroup/kubepods/*/pod"$uid"; do
                # the pod cgroup's processes are in its containers' cgroups
                grep -q '^populated 1' "$d/cgroup.events" 2>/dev/null || continue
                echo 1 >"$d/cgroup.kill"
                info "kubelet stand-in: pod $name marked for deletion at $deleted; killed its cgroup"
            done
        done
}

case "$E2E_PLUGIN" in
prelaunched)
    mkdir -p /opt/nri/plugins
    cp /e2e/bin/nri-qos /opt/nri/plugins/10-nri-qos
    chmod 755 /opt/nri/plugins/10-nri-qos
    ;;
esac

# The runtime under test: containerd or CRI-O (E2E_RUNTIME, from run.sh).
E2E_RUNTIME="${E2E_RUNTIME:-containerd}"
if [ "$E2E_RUNTIME" = crio ]; then
    CRI_SOCKET=/var/run/crio/crio.sock
    RUNTIME_MATCH='crio --config'
    RUNTIME_LOG=/var/log/crio.log
    start_runtime() { crio --config /etc/crio/crio.conf >>"$RUNTIME_LOG" 2>&1 & }
else
    CRI_SOCKET=/run/containerd/containerd.sock
    RUNTIME_MATCH='containerd --config'
    RUNTIME_LOG=/var/log/containerd.log
    start_runtime() { containerd --config /etc/containerd/config.toml >>"$RUNTIME_LOG" 2>&1 & }
fi

# The pid of a process whose command line contains $1 (busybox has no pgrep -f).
pid_of() {
    for d in /proc/[0-9]*; do
        case "$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null)" in
        *"$1"*) echo "${d#/proc/}"; return 0 ;;
        esac
    done
    return 1
}

# Lines of our log matching $1 (0 when there is no log yet).
log_count() {
    n="$(grep -c "$1" /var/log/nri-qos.log 2>/dev/null)"
    echo "${n:-0}"
}

# Waits (at most 60 s) until our log holds more than $2 lines saying the
# plugin (pid $1, still alive) was synchronized; $waited_s says how long.
wait_synced() {
    i=0
    while [ "$(log_count 'synchronized with the runtime')" -le "$2" ] && kill -0 "$1" 2>/dev/null && [ $i -lt 300 ]; do
        sleep 0.2
        i=$((i + 1))
    done
    waited_s="$((i / 5)).$((i % 5 * 2))"
    [ "$(log_count 'synchronized with the runtime')" -gt "$2" ]
}

# The tails of the runtime's and the plugin's logs.
dump_logs() {
    echo "---- ${RUNTIME_LOG##*/} (tail) ----"
    tail -n 60 "$RUNTIME_LOG"
    [ -f /var/log/nri-qos.log ] && { echo "---- nri-qos.log (tail) ----"; tail -n 40 /var/log/nri-qos.log; }
}

# Runs in the background: shortly before the host's VM timeout would kill a
# hung run without a word, says what the runtime and the plugin were doing,
# containerd's goroutines included (SIGUSR1 dumps them into its log), so a
# hang in CI can be diagnosed from the console alone.
watchdog() {
    left=$(( ${E2E_VM_TIMEOUT:-600} - 60 - $(cut -d. -f1 /proc/uptime) ))
    [ "$left" -gt 0 ] || return 0
    sleep "$left"
    # No FAIL of its own: a run that still finishes in time passes.
    info "watchdog: the guest is still running 60 s before the VM timeout; hung? state follows"
    ps | grep -v ' \[' # without kernel threads
    if [ "$E2E_RUNTIME" = containerd ] && pid="$(pid_of "$RUNTIME_MATCH")"; then
        kill -USR1 "$pid"
        sleep 5
        echo "---- containerd goroutines in NRI or waiting on a lock ----"
        # containerd writes the dump to a file in /tmp and into its log (one
        # logrus line with escaped newlines); the file when it is there.
        f="$(ls -t /tmp/containerd.*.stacks.log 2>/dev/null | head -n 1)"
        if [ -n "$f" ]; then cat "$f"; else
            grep -a 'goroutine stack dump' "$RUNTIME_LOG" | tail -n 1 | awk '{ gsub(/\\n/, "\n"); gsub(/\\t/, "  "); print }'
        fi | awk 'BEGIN { RS = ""; ORS = "\n\n" } /nri|sync\.\(\*(RW)?Mutex\)/' | head -n 300
    fi
    dump_logs
}

[ -n "${E2E_PHASE2:-}" ] || watchdog &

# CPU time of every thread of process $1 in ns (schedstat).
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }

# nri-qos audit: the runtime's pods, our policy and the kernel's values must agree.
audit() {
    if out="$(/e2e/bin/nri-qos audit --socket /var/run/nri/nri.sock --timeout-seconds 20 2>&1)"; then
        check "$1.audit" PASS "$(echo "$out" | tail -n 1)"
    else
        check "$1.audit" FAIL "$(echo "$out" | grep -E 'DRIFT|skipped|rror' | head -n 12 | tr '\n' ';') $(echo "$out" | tail -n 1)"
        echo "$out"
        rc=1
    fi
}

if [ "${E2E_DISK:-0}" = 1 ] && [ -z "${E2E_PHASE2:-}" ]; then
    # /data: ext2 over a loop device. Unlike tmpfs, page cache of its files can
    # be reclaimed without swap (the loop's tmpfs backing is charged to whoever
    # wrote it: the node, before the pods start).
    if insmod /e2e/loop.ko 2>/dev/null || [ -e /dev/loop0 ]; then
        mkdir -p /data
        if dd if=/dev/zero of=/disk.img bs=1M count=0 seek=1024 2>/dev/null &&
            losetup /dev/loop0 /disk.img && mke2fs -q /dev/loop0 >/dev/null &&
            mount -t ext4 /dev/loop0 /data; then
            check vm.disk PASS "/data on ext2 over /dev/loop0"
        else
            check vm.disk FAIL "could not set up the loop filesystem"
        fi
    else
        check vm.disk FAIL "insmod loop.ko failed"
    fi
fi

if [ "$kube_wanted" = 1 ]; then
    start_kube
    printf '[kubernetes]\nkubeconfig = "%s"\nnode-name = "e2e-node"\n' "$KUBECONFIG" >>/etc/nri-qos/nri-qos.toml
    kube_kubelet_standin &
    # every 15 s: the guest is alive, and what eats its CPU and memory
    (while sleep 15; do
        info "kube heartbeat: load $(cut -d' ' -f1-3 /proc/loadavg), MemAvailable $(awk '/MemAvailable/ {print $2}' /proc/meminfo) kB; $(top -b -n 1 2>/dev/null | sed -n '5,9p' | awk '{print $7, $8, $NF}' | tr '\n' ';')"
    done) &
fi

# crictl (and the CRI client) find the runtime through these.
printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 120\n' "$CRI_SOCKET" "$CRI_SOCKET" >/etc/crictl.yaml
export E2E_CRI_SOCKET="$CRI_SOCKET"

if [ "$E2E_RUNTIME" = crio ]; then
    # CRI-O pulls through containers/image: the image comes from a registry
    # on the guest's loopback (registries.conf maps both names there).
    mkdir -p /var/tmp # containers/image stages pulls there
    /e2e/bin/oci-registry /e2e/images/oci 127.0.0.1:5000 >/var/log/oci-registry.log 2>&1 &
    crio --version | head -n 1
    info "starting CRI-O"
    start_runtime
    i=0
    # the socket appears before CRI-O's last start-up checks: ask it
    while ! crictl --timeout 5s version >/dev/null 2>&1 && [ $i -lt 120 ]; do sleep 0.5; i=$((i + 1)); done
    if ! crictl --timeout 5s version >/dev/null 2>&1; then
        check crio.start FAIL "no CRI answer after 120 s"
        tail -n 50 "$RUNTIME_LOG"
        finish 1
    fi
    check crio.start PASS "socket up at t=$(uptime_s)s"
    for img in e2e.local/busybox:latest registry.k8s.io/pause:3.10; do
        out="$(crictl pull "$img" 2>&1)" || { check image.pull FAIL "$img: $out"; tail -n 20 "$RUNTIME_LOG"; finish 1; }
    done
    info "images: $(crictl images -q | tr '\n' ' ')"
else
    containerd --version
    info "starting containerd"
    start_runtime
    i=0
    while [ ! -S /run/containerd/containerd.sock ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    if [ ! -S /run/containerd/containerd.sock ]; then
        check containerd.start FAIL "no socket after 60 s"
        tail -n 50 /var/log/containerd.log
        finish 1
    fi
    check containerd.start PASS "socket up at t=$(uptime_s)s"

    for img in /e2e/images/*.tar; do
        if ! out="$(ctr -n k8s.io images import --local --snapshotter native "$img" 2>&1)"; then
            # ctr 1.7 may not know --local
            out="$(ctr -n k8s.io images import --snapshotter native "$img" 2>&1)" ||
                { check "image.import" FAIL "$img: $out"; finish 1; }
        fi
    done
    info "images: $(ctr -n k8s.io images ls -q | tr '\n' ' ')"
fi

i=0
while [ ! -S /var/run/nri/nri.sock ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
if [ -S /var/run/nri/nri.sock ]; then
    info "NRI socket up"
else
    info "no NRI socket (NRI disabled?)"
fi

rc="${E2E_PHASE1_RC:-0}"
plugin_pid=""
case "$E2E_PLUGIN" in
external)
    if [ ! -S /var/run/nri/nri.sock ]; then
        check plugin.external FAIL "no NRI socket to connect to"
        finish 1
    fi
    if [ "${E2E_OVERHEAD_PODS:-0}" -gt 0 ]; then
        # Startup overhead: the same pods without and with the plugin in one
        # VM, in alternating rounds so warm-up and drift hit both alike.
        rounds=${E2E_OVERHEAD_ROUNDS:-4}
        per=$(( (E2E_OVERHEAD_PODS + rounds - 1) / rounds ))
        r=1
        while [ $r -le "$rounds" ]; do
            /e2e/bin/cri-client timing --pods "$per" --label without
            # info, as a node runs it (the scenarios log at debug)
            /e2e/bin/nri-qos run --socket /var/run/nri/nri.sock --log-level info 2>/dev/null &
            bench_pid=$!
            i=0
            while ! grep -q 'synchronized with the runtime' /var/log/nri-qos.log 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
            # The plugin's own CPU time (all threads, ns) while those pods
            # came and went: what it can add to their start, resolved far
            # finer than the seconds-wide spread of the pod timings.
            cpu0=$(cpu_ns "$bench_pid")
            /e2e/bin/cri-client timing --pods "$per" --label with
            cpu1=$(cpu_ns "$bench_pid")
            echo "E2E-TIMING {\"label\":\"plugin_cpu\",\"pods\":$per,\"cpu_ns\":$((cpu1 - cpu0))}"
            kill "$bench_pid"; wait "$bench_pid" 2>/dev/null
            : >/var/log/nri-qos.log
            r=$((r + 1))
        done
    fi
    syncs_before="$(log_count 'synchronized with the runtime')"
    /e2e/bin/nri-qos run --socket /var/run/nri/nri.sock 2>/dev/null &
    plugin_pid=$!
    # No pod before the plugin is synchronized: containerd 1.7 (NRI v0.6.1)
    # takes its two NRI locks in one order to sync a new external plugin and
    # in the other to pass on pod and container events, so a registration
    # that overlaps pod creation can deadlock it for good (containerd#10085,
    # fixed in 1.7.26). A fixed 2 s wait here let a slow machine's first pods
    # meet the sync: the CI run that hung in its first pod creation.
    if wait_synced "$plugin_pid" "$syncs_before"; then
        check plugin.external PASS "pid $plugin_pid synchronized after $waited_s s"
    elif kill -0 "$plugin_pid" 2>/dev/null; then
        check plugin.external FAIL "pid $plugin_pid not synchronized after $waited_s s: $(tail -n 5 /var/log/nri-qos.log | tr '\n' ' ')"
        rc=1
    else
        code=0
        wait "$plugin_pid" || code=$?
        check plugin.external FAIL "exited early with status $code: $(tail -n 5 /var/log/nri-qos.log | tr '\n' ' ')"
        rc=1
    fi
    ;;
prelaunched)
    sleep 2
    if pid="$(pid_of /opt/nri/plugins/10-nri-qos)"; then
        check plugin.prelaunched PASS "running as pid $pid"
    else
        check plugin.prelaunched FAIL "not running; containerd log: $(grep -i nri /var/log/containerd.log | tail -n 3 | tr '\n' ' ')"
        # how far the plugin got before containerd gave up on it
        grep -ai 'nri' /var/log/containerd.log | tail -n 15
        tail -n 15 /var/log/nri-qos.log 2>/dev/null
        rc=1
    fi
    ;;
esac

# What the pressure monitor did since log line $1: one E2E-INFO line per
# decision, kill and emptied cgroup.
monitor_actions() {
    [ -f /var/log/nri-qos.log ] || return 0
    tail -n +"$1" /var/log/nri-qos.log | grep -E 'memory pressure decision|memory.reclaim|killing pod|killed pod|cgroup is empty|recheck|throttle|memory.high relaxed|unified map' |
        sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^/E2E-INFO monitor: /' | cut -c1-400
}

# kubeletqos: the kubelet's pod, QoS and kubepods protection (TieredReservation,
# the scenario's numbers) rewritten every 3 s as its QoS reconcile does, for
# E2E_KUBELET_QOS_SECONDS (60). Every 0.5 s each of those files and the
# Burstable container's memory.low/high must read the kubelet's value: nri-qos
# (its keeper resyncs every 30 s) must never write them. The audit must then
# name the kubelet as their owner. At the end the kubelet's rollback (0) leaves
# the tree to nri-qos again for what follows.
kubelet_qos_window() {
    secs=${E2E_KUBELET_QOS_SECONDS:-60}
    cg=/sys/fs/cgroup/kubepods
    bpod=$cg/burstable/podaaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa
    gpod=$cg/podbbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb
    owned="$cg/memory.min 201326592 $cg/burstable/memory.low 67108864 $bpod/memory.low 67108864 $gpod/memory.min 134217728"
    end=$(( $(date +%s) + secs ))
    (
        while [ "$(date +%s)" -lt "$end" ]; do
            set -- $owned
            while [ $# -gt 0 ]; do echo "$2" >"$1"; shift 2; done
            sleep 3
        done
    ) &
    writer=$!
    samples=0 bad=0 first_bad=""
    while [ "$(date +%s)" -lt "$end" ]; do
        set -- $owned
        while [ $# -gt 0 ]; do
            v="$(cat "$1" 2>/dev/null)"
            samples=$((samples + 1))
            if [ "$v" != "$2" ]; then
                bad=$((bad + 1))
                [ -n "$first_bad" ] || first_bad="t=$(uptime_s)s $1=$v (kubelet: $2)"
            fi
            shift 2
        done
        app=0
        for d in "$bpod"/*/; do
            [ "$(cat "$d/memory.low" 2>/dev/null)" = 67108864 ] && [ "$(cat "$d/memory.high" 2>/dev/null)" = 248299520 ] && app=1
        done
        samples=$((samples + 1))
        if [ $app = 0 ]; then
            bad=$((bad + 1))
            [ -n "$first_bad" ] || first_bad="t=$(uptime_s)s container memory.low/high: $(cat "$bpod"/*/memory.low "$bpod"/*/memory.high 2>/dev/null | tr '\n' ' ')"
        fi
        sleep 0.5
    done
    wait "$writer"
    if [ $bad -eq 0 ]; then
        check kubeletqos.kubelet_values_kept PASS "$samples samples over ${secs} s: pod, QoS, kubepods and container values always the kubelet's"
    else
        check kubeletqos.kubelet_values_kept FAIL "$bad of $samples samples differ; first: $first_bad"
        rc=1
    fi
    out="$(/e2e/bin/nri-qos audit --socket /var/run/nri/nri.sock --timeout-seconds 20 2>&1)"
    owners="$(echo "$out" | grep -cE '^kubepods(/burstable)?(/pod(aaaaaaaa|bbbbbbbb)[-0-9a-f]*)? .* kubelet ')"
    if echo "$out" | tail -n 1 | grep -q ' 0 drifting' && [ "$owners" -ge 6 ]; then
        check kubeletqos.audit_owners PASS "$owners kubelet-owned hierarchy values; $(echo "$out" | tail -n 1)"
    else
        check kubeletqos.audit_owners FAIL "$owners kubelet-owned hierarchy values (want at least 6: kubepods, burstable and the Burstable pod); $(echo "$out" | tail -n 1)"
        echo "$out"
        rc=1
    fi
    echo 0 >"$cg/memory.min"; echo 0 >"$cg/burstable/memory.low"
}

# throttle, PSI-only phase: thr-podhigh stalls at its pod's memory.high (not
# ours) with no event in its own cgroup. From our log since line $1: the
# guard evicted that pod naming PSI, never relaxed it, and the node-pressure
# path (memory.available) took no decision while node PSI was up.
throttle_psi_only() {
    uid=88888888-0024-4888-8888-888888888888
    log="$(tail -n +"$1" /var/log/nri-qos.log 2>/dev/null | sed -e 's/\x1b\[[0-9;]*m//g')"
    kill="$(echo "$log" | grep 'throttle persists' | grep "$uid" | head -n 1)"
    relax="$(echo "$log" | grep 'memory.high throttle decision' | grep "$uid" | grep -c 'action="\{0,1\}relax')"
    if echo "$kill" | grep -qE 'signal="?psi'; then
        check throttle.psi_only_evicted PASS "$(echo "$kill" | grep -oE '^[^ ]+|signal="?[a-z]+"?' | tr '\n' ' ')"
    else
        check throttle.psi_only_evicted FAIL "no throttle kill of thr-podhigh with signal psi: ${kill:-none}"
        rc=1
    fi
    if [ "$relax" -eq 0 ]; then
        check throttle.psi_only_not_relaxed PASS "no relax decision for thr-podhigh"
    else
        check throttle.psi_only_not_relaxed FAIL "$relax relax decisions for thr-podhigh"
        rc=1
    fi
    node="$(echo "$log" | grep -c 'memory pressure decision')"
    calm="$(echo "$log" | grep 'without node shortage' | tail -n 1 | grep -oE 'available=[0-9]+|psi_node=[^ ]+ [^ ]+' | tr '\n' ' ')"
    if [ "$node" -eq 0 ]; then
        check throttle.psi_only_node_path_idle PASS "no node-pressure decision; last PSI wake: ${calm:-none}"
    else
        check throttle.psi_only_node_path_idle FAIL "$node node-pressure decisions during the scenario"
        rc=1
    fi
}

# throttle, relax phase: the guard relaxed thr-burstable by writing its
# cgroup file (the default `[throttle] relax-via`), never through NRI
# UpdateContainers, which can deadlock containerd (containerd#13733). The
# value itself is checked by the scenario's memory step.
throttle_relax_route() {
    uid=88888888-0021-4888-8888-888888888888
    log="$(tail -n +"$1" /var/log/nri-qos.log 2>/dev/null | sed -e 's/\x1b\[[0-9;]*m//g')"
    relax="$(echo "$log" | grep 'memory.high throttle decision' | grep "$uid" | grep 'action="\{0,1\}relax[" ]' | head -n 1)"
    if echo "$relax" | grep -qE 'route="?cgroup-file("| |$)' && ! echo "$log" | grep -q 'UpdateContainers'; then
        check throttle.relax_via_cgroup_file PASS "$(echo "$relax" | grep -oE '^[^ ]+|route="?[a-z-]+"?' | tr '\n' ' ')"
    else
        check throttle.relax_via_cgroup_file FAIL "relax of thr-burstable: ${relax:-none}"
        rc=1
    fi
}

# kubeapi, before its pods: each pod of the scenario created in the API bound
# to this node, and its API UID put into the scenario (for the sandbox).
kube_pods() {
    pods="ev-guaranteed ev-within ev-over ev-be1 ev-be2"
    for p in $pods; do
        echo ---
        grep -v '^  uid:' "/e2e/scenarios/pods/$p.yaml" | awk '{ print } /^spec:$/ { print "  nodeName: e2e-node" }'
    done >/tmp/kube-pods.yaml
    if ! out="$(kubectl create -f /tmp/kube-pods.yaml 2>&1)"; then
        check kubeapi.pods_created FAIL "$(echo "$out" | tr '\n' ' ')"
        rc=1
        return
    fi
    kubectl get pods -n default -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid}{"\n"}{end}' >/tmp/kube-uids
    cp /e2e/scenarios/kubeapi.json /tmp/kubeapi.json
    while read -r name uid; do
        sed -i "s/@$name@/$uid/" /tmp/kubeapi.json
    done </tmp/kube-uids
    if grep -q '"@' /tmp/kubeapi.json; then
        check kubeapi.pods_created FAIL "no API UID for: $(grep -o '"@[^"]*' /tmp/kubeapi.json | tr '\n' ' ')"
        rc=1
    else
        check kubeapi.pods_created PASS "$(tr '\n' ' ' </tmp/kube-uids)"
    fi
    cp /tmp/kubeapi.json /e2e/scenarios/kubeapi.json
    # the plugin's watch delivers them before the first sandbox
    sleep 2
}

# kubeapi, after its steps (pods kept): the source of the requests and the
# evictions as the API server holds them. $1: first line of our log.
kube_checks() {
    log="$(tail -n +"$1" /var/log/nri-qos.log 2>/dev/null | sed -e 's/\x1b\[[0-9;]*m//g')"
    if echo "$log" | grep -q 'listed this node.s pods from the API server'; then
        check kubeapi.watch PASS "$(echo "$log" | grep 'listed this node.s pods' | tail -n 1 | grep -oE 'pods=[0-9]+')"
    elif grep -q 'listed this node.s pods from the API server' /var/log/nri-qos.log; then
        check kubeapi.watch PASS "listed before the scenario"
    else
        check kubeapi.watch FAIL "no list from the API server in the plugin's log"
        rc=1
    fi
    # the policy's source for each Burstable container with a request
    for pc in ev-within/app ev-over/app; do
        line="$(echo "$log" | grep 'policy decision' | grep "pod=default/${pc%/*} " | grep "container=${pc#*/} " | tail -n 1)"
        src="$(echo "$line" | grep -oE 'request_source=[A-Za-z]+')"
        if [ "$src" = request_source=ApiServer ]; then
            check "kubeapi.$pc.request_source" PASS "$(echo "$line" | grep -oE '(memory_request|request_source)=[^ ]+' | tr '\n' ' ')"
        else
            check "kubeapi.$pc.request_source" FAIL "${src:-no policy decision}"
            rc=1
        fi
    done
    # the monitor's decision on ev-over names the API server as the request's source
    line="$(echo "$log" | grep -E 'killing pod|evicted pod through the API server' | grep -E 'name="?ev-over' | head -n 1)"
    if echo "$line" | grep -q 'request_source=api-server'; then
        check kubeapi.monitor_request_source PASS "$(echo "$line" | grep -oE '(request|request_source|priority|signal)=[^ ]+' | tr '\n' ' ')"
    else
        check kubeapi.monitor_request_source FAIL "${line:-no kill or eviction of ev-over in the log}"
        rc=1
    fi
    kubectl get pods -n default -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} {.status.conditions[?(@.type=="DisruptionTarget")].reason}{"\n"}{end}' >/tmp/kube-state
    kubectl get events -n default --field-selector reason=Evicted -o jsonpath='{range .items[*]}{.involvedObject.name}|{.message}{"\n"}{end}' >/tmp/kube-events
    for name in ev-guaranteed ev-within ev-over ev-be1 ev-be2; do
        st="$(grep "^$name " /tmp/kube-state)"
        if [ -n "$st" ]; then
            # shellcheck disable=SC2086
            set -- $st
            deleted="${2:-}" reason="${3:-}"
        else
            # a hard eviction (grace 0) deletes the pod object at once
            deleted=gone reason=deleted
        fi
        case "$name" in
        ev-be1 | ev-be2 | ev-over)
            if [ -n "$deleted" ] && [ -n "$reason" ]; then
                check "kubeapi.$name.evicted" PASS "deletionTimestamp $deleted, DisruptionTarget $reason"
            else
                check "kubeapi.$name.evicted" FAIL "deletionTimestamp '${deleted}', DisruptionTarget '${reason}'"
                rc=1
            fi
            ev="$(grep "^$name|" /tmp/kube-events | head -n 1 | cut -d'|' -f2- | cut -c1-240)"
            if [ -n "$ev" ]; then
                check "kubeapi.$name.event" PASS "Evicted: $ev"
            else
                check "kubeapi.$name.event" FAIL "no Event with reason Evicted"
                rc=1
            fi
            ;;
        *)
            if [ -z "$deleted" ] && ! grep -q "^$name|" /tmp/kube-events; then
                check "kubeapi.$name.not_evicted" PASS ""
            else
                check "kubeapi.$name.not_evicted" FAIL "deletionTimestamp '${deleted}' $(grep "^$name|" /tmp/kube-events | head -n 1)"
                rc=1
            fi
            ;;
        esac
    done
    # audit lists the node's pods from the API once: ev-within's request
    # comes from the API server and its pod cgroup's protection is checked
    # as ours (before, it read as the kubelet's and went unchecked)
    # (a debug binary under emulation: TLS set-up alone can take seconds)
    out="$(/e2e/bin/nri-qos audit --socket /var/run/nri/nri.sock --timeout-seconds 20 --api-timeout-seconds 30 2>&1)"
    echo "$out" | grep -E 'ev-within|ev-over|^(pod|kubepods)|^api-server' | head -n 24 | sed 's/^/E2E-INFO kubeapi audit: /'
    within_uid="$(awk '$1 == "ev-within" { print $2 }' /tmp/kube-uids)"
    pod_rows="$(echo "$out" | grep "^kubepods/burstable/pod$within_uid " | grep -E 'memory\.(min|low)')"
    if echo "$out" | grep 'default/ev-within/app' | grep -q ' api-server ' &&
        echo "$out" | grep -q '^api-server: .* matched by UID' &&
        [ -n "$pod_rows" ] && ! echo "$pod_rows" | grep -q kubelet; then
        check kubeapi.audit_source PASS "$(echo "$out" | grep '^api-server:' | cut -c1-160); $(echo "$out" | tail -n 1)"
    else
        check kubeapi.audit_source FAIL "$(echo "$out" | grep -E '^api-server:|default/ev-within/app|pod'"$within_uid" | head -n 4 | tr '\n' ';' | cut -c1-400)"
        rc=1
    fi
}

# Stops the runtime (containerd's shims or CRI-O's conmons and the containers
# keep running, as on a node) and starts it again; returns once its NRI
# socket is back.
restart_containerd() {
    kill "$(pid_of "$RUNTIME_MATCH")" 2>/dev/null
    i=0
    while pid_of "$RUNTIME_MATCH" >/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    rm -f /var/run/nri/nri.sock
    start_runtime
    i=0
    while [ ! -S /var/run/nri/nri.sock ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
}

# Restarts containerd and waits (at most 60 s: containerd 2.3 on a busy
# machine took 20 s to start the plugin) until our log gains a line
# matching $1, written by the pre-launched plugin process it starts. Sets
# $new (that pid, or empty), $before (matching lines before) and $waited_s;
# true when a process other than $2 is running and the line came.
relaunch_plugin() {
    before="$(log_count "$1")"
    restart_containerd
    i=0
    while [ "$(log_count "$1")" -le "$before" ] && [ $i -lt 300 ]; do sleep 0.2; i=$((i + 1)); done
    waited_s="$((i / 5)).$((i % 5 * 2))"
    new="$(pid_of /opt/nri/plugins/10-nri-qos || true)"
    [ -n "$new" ] && [ "$new" != "$2" ] && [ "$(log_count "$1")" -gt "$before" ]
}

# memoryqos, pre-launched on NRI >= v0.7: a restarted plugin must reach the
# same owners from Synchronize (the pod cgroup protected before the sandbox;
# the started container holding the kubelet's memory.min in the pod nobody
# protected first), so its updates leave every container as it was.
memoryqos_restart() {
    [ "$E2E_PLUGIN" = prelaunched ] && [ "$E2E_CONTAINERD" != 1.7 ] || return 0
    files() { cat /sys/fs/cgroup/kubepods/burstable/pod*dddd*/*/memory.[hlm]* /sys/fs/cgroup/kubepods/burstable/pod*cccc*/*/memory.[hlm]* 2>&1 | tr '\n' ' '; }
    was="$(files)"
    old="$(pid_of /opt/nri/plugins/10-nri-qos || true)"
    if ! relaunch_plugin 'synchronized with the runtime' "$old"; then
        check memoryqos.restart_keeps_kubelet_values FAIL "old pid ${old:-none}, new pid ${new:-none}: not relaunched and synchronized"
        rc=1
        return
    fi
    sleep 1
    now="$(files)"
    if [ "$was" = "$now" ]; then
        check memoryqos.restart_keeps_kubelet_values PASS "pid $new synchronized after $waited_s s; memory.high/low/max/min of both pods' containers unchanged: $now"
    else
        check memoryqos.restart_keeps_kubelet_values FAIL "before: $was after: $now"
        rc=1
    fi
}

# guarded: a default install is guarded. nri-qos is started each way the
# install docs give, from the shipped files: pre-launched (binary and
# config/nri/10-nri-qos.conf) without /etc/nri-qos/nri-qos.toml and with
# config/nri-qos.toml; the DaemonSet's command line with its ConfigMap's
# nri-qos.toml and its host mounts; the systemd unit's ExecStart with
# config/nri-qos.toml (as the guest's process: the guest has no systemd). For
# each, the pod gd-N's container ref churns 240 MiB unthrottled (no limit,
# so memory.high near allocatable) for 12 s, then its container app does at
# the memory.high nri-qos sets (limit 256Mi): the guard must relax it within
# its grace period + 1 s of detecting it (from the plugin's log) and the
# allocator's rate must recover to >= 0.7x ref's.
GD_GRACE_MS=10000

# ms of a log line: a journal-sink line's receive time (epoch ms), else the
# RFC 3339 timestamp's time of day (text and json formats).
gd_ms() {
    echo "$1" | awk '
        /^[0-9]+ / { print $1; exit }
        match($0, /[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9](\.[0-9]+)?/) {
            split(substr($0, RSTART + 11, RLENGTH - 11), t, ":")
            printf "%d\n", (t[1] * 3600 + t[2] * 60 + t[3]) * 1000
        }'
}

# The median of the numbers on stdin (0 when none).
gd_median() { sort -n | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }'; }

# The allocator's MiB/s lines of container $1 of pod gd-$2 with epoch ms
# in [$3, $4).
gd_rates() {
    cat /var/log/pods/default_gd-"$2"_99999999-00c"$2"-4999-8999-999999999990/"$1"/0.log 2>/dev/null |
        awk -v from="$3" -v to="$4" '$4 == "churn" && $6 ~ /^[0-9.]+$/ && $5 >= from && $5 < to { print $6 }'
}

# Lines of log $1 saying the plugin was synchronized (0 without a log).
gd_synced() {
    n="$(grep -ac 'synchronized with the runtime' "$1" 2>/dev/null)"
    echo "${n:-0}"
}

# Waits (at most 60 s) until log $1 holds more than $2 such lines.
gd_wait_synced() {
    i=0
    while [ "$(gd_synced "$1")" -le "$2" ] && [ $i -lt 300 ]; do
        sleep 0.2
        i=$((i + 1))
    done
    [ "$(gd_synced "$1")" -gt "$2" ]
}

# Configuration $1 (number $2), the plugin logging to $3: the pod, the wait
# for the relax, the checks; its app is killed once measured (every pod is
# removed at the end of the scenario).
gd_measure() {
    label=$1 n=$2 log=$3
    pod=99999999-00c$n-4999-8999-999999999990
    sed "s/@N@/$n/g" /e2e/scenarios/guarded.json >/e2e/scenarios/guarded-$n.json
    if ! /e2e/bin/cri-client run /e2e/scenarios/guarded-$n.json --keep >/tmp/gd-$n.out 2>&1; then
        check "guarded.$label.pods" FAIL "$(grep 'FAIL' /tmp/gd-$n.out | head -n 3 | tr '\n' ';')"
        rc=1
        return
    fi
    started=$(date +%s)
    cg=""
    for d in /sys/fs/cgroup/kubepods/burstable/pod$pod/*/; do
        [ "$(cat "$d/memory.max" 2>/dev/null)" = 268435456 ] && cg=${d%/}
    done
    high_before="$(cat "$cg/memory.high" 2>/dev/null)"
    relaxed_at=""
    while [ -n "$cg" ] && [ $(($(date +%s) - started)) -lt 60 ]; do
        if [ "$(cat "$cg/memory.high")" = "$(cat "$cg/memory.max")" ]; then
            relaxed_at=$(date +%s)
            break
        fi
        sleep 0.2
    done
    # The rate after the relax, from 2 s on (the kernel's penalty sleeps end),
    # over 12 s: under emulation on a shared host single seconds vary 5x.
    [ -z "$relaxed_at" ] || sleep 14
    high_events="$(awk '$1 == "high" { print $2 }' "$cg/memory.events" 2>/dev/null)"
    high_after="$(cat "$cg/memory.high" 2>/dev/null)"
    echo 1 >"$cg/cgroup.kill" 2>/dev/null
    grep -a "$pod" "$log" | grep -aE 'throttle|relax' | head -n 4 | cut -c1-300 | sed "s/^/E2E-INFO guarded $label: /"
    detect="$(grep -a "$pod" "$log" | grep -a 'grace period starts' | head -n 1)"
    relax="$(grep -a "$pod" "$log" | grep -a 'throttle decision' | grep -aiE 'action"?[=:]"?relax([" ,]|$)' | head -n 1)"
    ref_rates="$(gd_rates ref "$n" 0 99999999999999 | tail -n +3)"
    ref_rate="$(echo "$ref_rates" | gd_median)"
    thr_rate="$(gd_rates app "$n" 0 "${relaxed_at:-99999999999}000" | tail -n +2 | gd_median)"
    after_rates="$(gd_rates app "$n" "$((${relaxed_at:-99999999999} + 2))000" 99999999999999)"
    after_rate="$(echo "$after_rates" | gd_median)"
    info "guarded $label: MiB/s unthrottled: $(echo $ref_rates); after the relax: $(echo $after_rates)"
    # Detection to relax by the guard's own clock (its relax line's
    # under_throttle_ms); the log lines' timestamps also hold the time each
    # look spent reading before it logged.
    latency="$(echo "$relax" | grep -aioE 'under_throttle_ms"?[=:]"?[0-9]+' | grep -oE '[0-9]+$')"
    stamps=""
    [ -n "$detect" ] && [ -n "$relax" ] && stamps=$(($(gd_ms "$relax") - $(gd_ms "$detect")))
    if [ -n "$relaxed_at" ] && [ -n "$latency" ] && [ "$latency" -le $((GD_GRACE_MS + 1000)) ]; then
        check "guarded.$label.relaxed" PASS "detect->relax ${latency} ms by the guard's clock, ${stamps:-?} ms between its log lines (grace ${GD_GRACE_MS} ms + 1 s); memory.high $high_before -> $high_after $((relaxed_at - started)) s after app started; high events $high_events"
    else
        check "guarded.$label.relaxed" FAIL "relaxed_at=${relaxed_at:-never} detect->relax=${latency:-?} ms (log lines ${stamps:-?} ms); detect: ${detect:-none}; relax: ${relax:-none}"
        rc=1
    fi
    ratio="$(awk -v a="$after_rate" -v r="$ref_rate" 'BEGIN { x = 0; if (r > 0) x = a / r; printf "%.2f", x }')"
    if awk -v x="$ratio" 'BEGIN { exit !(x >= 0.7) }'; then
        check "guarded.$label.rate" PASS "after relax ${after_rate} MiB/s = ${ratio}x the unthrottled ${ref_rate} MiB/s (throttled: ${thr_rate} MiB/s)"
    else
        check "guarded.$label.rate" FAIL "after relax ${after_rate:-?} MiB/s = ${ratio}x the unthrottled ${ref_rate:-?} MiB/s (throttled: ${thr_rate:-?} MiB/s)"
        rc=1
    fi
    echo "E2E-TIMING {\"label\":\"guarded-$label\",\"detect_to_relax_ms\":${latency:-null},\"log_lines_ms\":${stamps:-null},\"reference_mib_s\":${ref_rate:-0},\"throttled_mib_s\":${thr_rate:-0},\"relaxed_mib_s\":${after_rate:-0},\"ratio\":$ratio}"
}

# Pre-launched, $1 (number $2): containerd restarted launches the plugin,
# which logs to the journal.
gd_prelaunched() {
    before="$(gd_synced /var/log/journal.log)"
    restart_containerd
    if gd_wait_synced /var/log/journal.log "$before" && pid_of /opt/nri/plugins/10-nri-qos >/dev/null; then
        info "guarded: pre-launched ($1) synchronized"
        gd_measure "$1" "$2" /var/log/journal.log
    else
        check "guarded.$1.started" FAIL "no synchronized pre-launched plugin; containerd: $(grep -a 'nri\|NRI' "$RUNTIME_LOG" | tail -n 4 | cut -c1-160 | tr '\n' ' ')"
        tail -n 8 /var/log/journal.log | cut -c1-400 | sed 's/^/E2E-INFO guarded journal: /'
        if pid="$(pid_of /opt/nri/plugins/10-nri-qos)"; then
            for t in /proc/"$pid"/task/*; do
                info "guarded: plugin thread $(cat "$t/comm") state $(cut -d' ' -f3 "$t/stat") wchan $(cat "$t/wchan")"
            done
        fi
        rc=1
    fi
}

# External, $1 (number $2): the command line $3, logging to stderr ($1's
# log file), as the kubelet or systemd would collect it.
gd_external() {
    log=/var/log/nri-qos-$1.log
    # shellcheck disable=SC2086
    env NODE_NAME=e2e-node $3 2>"$log" &
    pid=$!
    if gd_wait_synced "$log" 0; then
        info "guarded: $1 ($3) synchronized as pid $pid"
        gd_measure "$1" "$2" "$log"
    else
        check "guarded.$1.started" FAIL "$3: $(tail -n 3 "$log" | tr '\n' ' ' | cut -c1-300)"
        rc=1
    fi
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

guarded_default() {
    cp /etc/nri-qos/nri-qos.toml /tmp/nri-qos.harness.toml
    mkdir -p /usr/local/bin /etc/nri/conf.d
    cp /e2e/bin/nri-qos /usr/local/bin/nri-qos
    cp /e2e/config/nri/10-nri-qos.conf /etc/nri/conf.d/10-nri-qos.conf
    /e2e/bin/journal-sink /run/systemd/journal/socket /var/log/journal.log &
    sink=$!
    rm -f /etc/nri-qos/nri-qos.toml
    gd_prelaunched prelaunched-no-config 1
    cp /e2e/config/nri-qos.toml /etc/nri-qos/nri-qos.toml
    gd_prelaunched prelaunched-shipped-config 2
    # memory.high without a guard: the pre-launched plugin refuses to start,
    # says why in the journal, and the runtime carries on without it.
    printf '[throttle]\nenabled = false\n' >/etc/nri-qos/nri-qos.toml
    restart_containerd
    i=0
    while ! grep -aq 'refuses to start' /var/log/journal.log && [ $i -lt 150 ]; do sleep 0.2; i=$((i + 1)); done
    line="$(grep -a 'refuses to start' /var/log/journal.log | tail -n 1 | cut -c1-400)"
    sleep 1
    if [ -n "$line" ] && echo "$line" | grep -q 'throttle.enabled = false' && ! pid_of /opt/nri/plugins/10-nri-qos >/dev/null; then
        check guarded.refusal_in_the_journal PASS "$line; containerd: $(grep -a '10-nri-qos' "$RUNTIME_LOG" | tail -n 1 | cut -c1-200)"
    else
        check guarded.refusal_in_the_journal FAIL "journal: ${line:-none}; plugin pid: $(pid_of /opt/nri/plugins/10-nri-qos || echo none)"
        rc=1
    fi
    kill "$sink"
    rm -f /run/systemd/journal/socket
    ds=/e2e/config/kubernetes/daemonset.yaml
    # The ConfigMap's nri-qos.toml, mounted at /etc/nri-qos in the pod.
    awk '/^  nri-qos.toml: \|/ { on = 1; next } on && /^    / { sub(/^    /, ""); print; next } on && /^$/ { print; next } on { exit }' "$ds" >/etc/nri-qos/nri-qos.toml
    mkdir -p /host/sys/fs/cgroup /host/proc
    mount --bind /sys/fs/cgroup /host/sys/fs/cgroup
    mount -t proc proc /host/proc
    # The container's command and args (the liveness probe's command follows).
    cmd="$(sed -n 's/^ *command: \[\(.*\)\]$/\1/p' "$ds" | head -n 1 | tr -d '",') $(sed -n 's/^ *args: \[\(.*\)\]$/\1/p' "$ds" | head -n 1 | tr -d '",')"
    gd_external daemonset 3 "$cmd"
    umount /host/proc /host/sys/fs/cgroup
    cp /e2e/config/nri-qos.toml /etc/nri-qos/nri-qos.toml
    gd_external systemd-unit 4 "$(sed -n 's/^ExecStart=//p' /e2e/config/systemd/nri-qos.service)"
    # Back to the harness's pre-launched plugin for what follows.
    /e2e/bin/cri-client cleanup >/dev/null 2>&1 || rc=1
    cp /tmp/nri-qos.harness.toml /etc/nri-qos/nri-qos.toml
    rm -f /etc/nri/conf.d/10-nri-qos.conf /e2e/scenarios/guarded-[0-9].json
    if relaunch_plugin 'synchronized with the runtime' ""; then
        check guarded.harness_plugin_back PASS "pid $new synchronized after $waited_s s"
    else
        check guarded.harness_plugin_back FAIL "new pid ${new:-none}"
        rc=1
    fi
}

# shellcheck source=tests/e2e/guest/runtimes.sh
. /e2e/runtimes.sh
# shellcheck source=tests/e2e/guest/swap.sh
. /e2e/swap.sh
if [ "$E2E_PLUGIN" != none ] && opens_trace_on; then opens_tracing=1; fi
for s in $E2E_SCENARIOS; do
    # NAME@VERSION: on that containerd only
    case "$s" in
    *@*) [ "${s#*@}" = "$E2E_CONTAINERD" ] || continue; s="${s%@*}" ;;
    esac
    info "scenario $s: start"
    if [ "$s" = guarded ]; then
        guarded_default
        info "scenario $s: end"
        continue
    fi
    opens_start "$s"
    scenario_pids="$(pid_of /opt/nri/plugins/10-nri-qos) $plugin_pid"
    wants_swap "$s" && swap_on
    [ "$s" = kubeapi ] && kube_pods
    log_from=$(( $(wc -l </var/log/nri-qos.log 2>/dev/null || echo 0) + 1 ))
    set -- run "/e2e/scenarios/$s.json"
    if [ "$E2E_PLUGIN" = none ]; then
        # Without a plugin the runtime must apply the CRI request unchanged.
        set -- "$@" --expect-cri
    else
        # With nri-qos every value must be what `nri-qos explain` predicts;
        # an expected-values file (per-version first, then for runtimes that
        # show plugins the unified map) overrides single values.
        set -- "$@" --expect-explain
        unified="/e2e/scenarios/$s.expected-unified.json"
        shows_unified || unified=""
        for f in "/e2e/scenarios/$s.expected-$E2E_CONTAINERD.json" $unified "/e2e/scenarios/$s.expected.json"; do
            if [ -f "$f" ]; then set -- "$@" --expect "$f"; break; fi
        done
    fi
    if [ "$E2E_PLUGIN" = none ]; then
        /e2e/bin/cri-client "$@" || rc=1
    else
        # Keep the pods for the audit, then clean up.
        /e2e/bin/cri-client "$@" --keep || rc=1
        [ "$s" = restart ] && restart_keeps_ours "$log_from"
        [ "$s" = memoryqos ] && memoryqos_restart
        [ "$s" = kubeletqos ] && kubelet_qos_window
        [ "$s" = throttle ] && { throttle_relax_route "$log_from"; throttle_psi_only "$log_from"; }
        [ "$s" = kubeapi ] && kube_checks "$log_from"
        [ "$s" = swap ] && swap_checks "$log_from" "$scenario_pids $(pid_of /opt/nri/plugins/10-nri-qos)"
        opens_stop
        ownership_reads "$s" "$scenario_pids $(pid_of /opt/nri/plugins/10-nri-qos) ${new:-}"
        audit "$s"
        /e2e/bin/cri-client cleanup || rc=1
        monitor_actions "$log_from"
    fi
    opens_stop
    wants_swap "$s" && swap_off
    info "scenario $s: end"
done
dedicated_rpcs

# Pods created while no plugin runs must still start, with the runtime's own
# values (our policy never stands between the kubelet and a pod). $1: the
# scenario (default basic).
pods_without_plugin() {
    /e2e/bin/cri-client run "/e2e/scenarios/${1:-basic}.json" --keep --expect-cri >/tmp/res1.out 2>&1
    if grep -q "E2E-CHECK .* FAIL" /tmp/res1.out; then
        check resilience.pods_without_plugin FAIL "$(grep 'FAIL' /tmp/res1.out | head -n 3 | tr '\n' ';')"
        rc=1
    else
        check resilience.pods_without_plugin PASS "pods started with the runtime's own values"
    fi
}

# Resilience (external plugin): pods created while the plugin is down still
# start and are brought into line when it comes back; a containerd restart
# under a running plugin ends in a reconnect and a new sync.
if [ "$E2E_PLUGIN" = external ] && [ "${E2E_RESILIENCE:-0}" = 1 ] && [ -n "$plugin_pid" ]; then
    kill -9 "$plugin_pid" 2>/dev/null
    wait "$plugin_pid" 2>/dev/null
    info "resilience: plugin killed; creating pods without it"
    pods_without_plugin
    syncs_before="$(log_count 'synchronized with the runtime')"
    /e2e/bin/nri-qos run --socket /var/run/nri/nri.sock 2>/dev/null &
    plugin_pid=$!
    # adjust-existing: the new session's Synchronize updates the running containers.
    wait_synced "$plugin_pid" "$syncs_before" || info "resilience: restarted plugin not synchronized after $waited_s s"
    audit resilience.plugin_restarted
    info "resilience: restarting containerd under the running plugin"
    syncs_before="$(log_count 'synchronized with the runtime')"
    restart_containerd
    # Synchronized, not only connected, before pods come (see plugin.external).
    if wait_synced "$plugin_pid" "$syncs_before"; then
        check resilience.reconnected PASS "same plugin process reconnected and synchronized after $waited_s s"
    else
        check resilience.reconnected FAIL "syncs=$(log_count 'synchronized with the runtime') (before $syncs_before) alive=$(kill -0 "$plugin_pid" 2>/dev/null && echo yes || echo no)"
        rc=1
    fi
    /e2e/bin/cri-client cleanup >/dev/null 2>&1
    /e2e/bin/cri-client run /e2e/scenarios/basic.json --keep >/tmp/res2.out 2>&1 || true
    audit resilience.after_containerd_restart
    /e2e/bin/cri-client cleanup || rc=1
fi

# Resilience (pre-launched plugin on containerd 1.7): NRI v0.6.1 never
# synchronizes a pre-launched plugin, so after a containerd restart the new
# plugin process knows only the pods created from then on. The pods from
# before keep their own values, and the hierarchy keeper must not lower
# their QoS and kubepods parents below them: `nri-qos audit`, which gets the
# runtime's full list, checks every sum.
if [ "$E2E_PLUGIN" = prelaunched ] && [ "${E2E_RESILIENCE:-0}" = 1 ] && [ "$E2E_CONTAINERD" = 1.7 ]; then
    /e2e/bin/cri-client run /e2e/scenarios/basic.json --keep --expect-explain >/tmp/res1.out 2>&1 || rc=1
    grep "E2E-CHECK .* FAIL" /tmp/res1.out
    old="$(pid_of /opt/nri/plugins/10-nri-qos || true)"
    info "resilience: restarting containerd; its new plugin will not be synchronized (NRI v0.6.1)"
    if relaunch_plugin 'configured by the runtime' "$old"; then
        check resilience.relaunched PASS "containerd launched pid $new (was ${old:-none}); synchronized: $(log_count 'synchronized with the runtime') times in all"
    else
        check resilience.relaunched FAIL "old pid ${old:-none}, new pid ${new:-none}"
        rc=1
    fi
    /e2e/bin/cri-client run /e2e/scenarios/late.json --keep --expect-explain || rc=1
    # Give the keeper its pass after the late pod's events.
    sleep 1
    audit resilience.unsynchronized_plugin_keeps_parents
    /e2e/bin/cri-client cleanup || rc=1
fi

# Resilience (pre-launched plugin, NRI >= v0.7): the runtime owns the
# plugin's life. A plugin that dies stays gone until containerd restarts;
# pods created meanwhile still start. The restarted containerd launches a
# new plugin process, which registers, is synchronized and brings the pods
# made without it into line.
if [ "$E2E_PLUGIN" = prelaunched ] && [ "${E2E_RESILIENCE:-0}" = 1 ] && [ "$E2E_CONTAINERD" != 1.7 ]; then
    if old="$(pid_of /opt/nri/plugins/10-nri-qos)"; then
        kill -9 "$old"
        i=0
        while kill -0 "$old" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
        info "resilience: pre-launched plugin (pid $old) killed; creating pods without it"
        # basic resizes its Burstable app in place. CRI-O 1.37 forgets that
        # resize when it restarts (its Synchronize reports the pre-resize
        # resources; the kernel keeps the resized ones): the plugin and the
        # audit must decide from the kernel's limits, or memory.high drifts.
        pods_without_plugin
        info "resilience: restarting containerd; it launches the plugin again"
        if relaunch_plugin 'synchronized with the runtime' "$old"; then
            check resilience.relaunched PASS "containerd launched pid $new, synchronized after $waited_s s: $(grep 'synchronized with the runtime' /var/log/nri-qos.log | tail -n 1 | sed -e 's/\x1b\[[0-9;]*m//g' -e 's/.*synchronized with the runtime *//')"
        else
            check resilience.relaunched FAIL "old pid $old, new pid ${new:-none}, syncs $(log_count 'synchronized with the runtime') (before $before)"
            rc=1
        fi
        # The pods created without the plugin, updated through Synchronize.
        audit resilience.after_containerd_restart
        /e2e/bin/cri-client cleanup >/dev/null 2>&1
        /e2e/bin/cri-client run /e2e/scenarios/basic.json --keep >/tmp/res2.out 2>&1 || true
        audit resilience.new_pods_after_restart
        /e2e/bin/cri-client cleanup || rc=1
    else
        check resilience.relaunched FAIL "no pre-launched plugin running before the sequence"
        rc=1
    fi
fi

# crictl as the client (tests/e2e/guest/crictl.sh), as operators drive a node.
if [ "${E2E_CRICTL:-0}" = 1 ] && [ "$E2E_PLUGIN" != none ]; then
    # shellcheck source=tests/e2e/guest/crictl.sh
    . /e2e/crictl.sh
fi

if [ "${E2E_TIMING_PODS:-0}" -gt 0 ]; then
    /e2e/bin/cri-client timing --pods "$E2E_TIMING_PODS" || rc=1
fi

if [ -n "$plugin_pid" ]; then
    if kill -0 "$plugin_pid" 2>/dev/null; then
        check plugin.alive PASS ""
    else
        check plugin.alive FAIL "plugin exited"
        rc=1
    fi
fi
next_containerd
if [ $rc -ne 0 ] || [ "${E2E_VERBOSE:-0}" = 1 ]; then
    dump_logs
fi
finish $rc
