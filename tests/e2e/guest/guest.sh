#!/bin/sh
# Stage 2 of the e2e VM: set up a minimal node (cgroup v2, containerd, NRI),
# optionally install nri-qos, run the scenarios with the CRI client and report
# on the serial console. Everything the host parses starts with "E2E-".
# Settings come from /e2e/env (written by run.sh).
set -u
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
# shellcheck source=/dev/null
. /e2e/env
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

# cgroup v2 as the kubelet's node has it: controllers delegated below the root.
controllers="$(cat /sys/fs/cgroup/cgroup.controllers)"
for c in $controllers; do echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true; done
check vm.cgroup2 "$([ -f /sys/fs/cgroup/cgroup.subtree_control ] && echo PASS || echo FAIL)" "controllers: $controllers"
check vm.psi "$([ -f /sys/fs/cgroup/memory.pressure ] || [ -f /proc/pressure/memory ] && echo PASS || echo FAIL)" ""
info "MemTotal $(awk '/MemTotal/ {print $2}' /proc/meminfo) kB"

case "$E2E_PLUGIN" in
prelaunched)
    mkdir -p /opt/nri/plugins
    cp /e2e/bin/nri-qos /opt/nri/plugins/10-nri-qos
    chmod 755 /opt/nri/plugins/10-nri-qos
    ;;
esac

if [ "${E2E_DISK:-0}" = 1 ]; then
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

containerd --version
info "starting containerd"
containerd --config /etc/containerd/config.toml >/var/log/containerd.log 2>&1 &
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

i=0
while [ ! -S /var/run/nri/nri.sock ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
if [ -S /var/run/nri/nri.sock ]; then
    info "NRI socket up"
else
    info "no NRI socket (NRI disabled?)"
fi

rc=0
plugin_pid=""
case "$E2E_PLUGIN" in
external)
    if [ ! -S /var/run/nri/nri.sock ]; then
        check plugin.external FAIL "no NRI socket to connect to"
        finish 1
    fi
    /e2e/bin/nri-qos run --socket /var/run/nri/nri.sock >/var/log/nri-qos.log 2>&1 &
    plugin_pid=$!
    sleep 2
    if kill -0 "$plugin_pid" 2>/dev/null; then
        check plugin.external PASS "pid $plugin_pid running"
    else
        code=0
        wait "$plugin_pid" || code=$?
        check plugin.external FAIL "exited early with status $code: $(tail -n 5 /var/log/nri-qos.log | tr '\n' ' ')"
        rc=1
    fi
    ;;
prelaunched)
    sleep 2
    if pgrep -f /opt/nri/plugins/10-nri-qos >/dev/null 2>&1 || pgrep 10-nri-qos >/dev/null 2>&1; then
        check plugin.prelaunched PASS "running"
    else
        check plugin.prelaunched FAIL "not running; containerd log: $(grep -i nri /var/log/containerd.log | tail -n 3 | tr '\n' ' ')"
        rc=1
    fi
    ;;
esac

for s in $E2E_SCENARIOS; do
    info "scenario $s: start"
    set -- run "/e2e/scenarios/$s.json"
    if [ "$E2E_PLUGIN" = none ]; then
        # Without a plugin the runtime must apply the CRI request unchanged.
        set -- "$@" --expect-cri
    elif [ -f "/e2e/scenarios/$s.expected-$E2E_CONTAINERD.json" ]; then
        # per-version expectations win over the common ones
        set -- "$@" --expect "/e2e/scenarios/$s.expected-$E2E_CONTAINERD.json"
    elif [ -f "/e2e/scenarios/$s.expected.json" ]; then
        set -- "$@" --expect "/e2e/scenarios/$s.expected.json"
    fi
    /e2e/bin/cri-client "$@" || rc=1
    info "scenario $s: end"
done

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
if [ $rc -ne 0 ] || [ "${E2E_VERBOSE:-0}" = 1 ]; then
    echo "---- containerd.log (tail) ----"
    tail -n 60 /var/log/containerd.log
    [ -f /var/log/nri-qos.log ] && { echo "---- nri-qos.log (tail) ----"; tail -n 40 /var/log/nri-qos.log; }
fi
finish $rc
