#!/usr/bin/env bash
# End-to-end harness: boots the real containerd (1.7.24, 2.1.9, 2.2.7, 2.3.4)
# or CRI-O with runc in a small qemu VM (cgroup v2), runs scenarios through the
# CRI, and checks what the kernel really holds. See tests/e2e/README.md.
#
#   tests/e2e/run.sh [--containerd 1.7|2.1|2.2|2.3|2.2+2.3|crio|all]
#                    [--scenario NAME[@VERSION][,NAME...]]
#                    [--plugin prelaunched|external|none] [--timing-pods N]
#                    [--crictl]            (also drive pods with crictl)
#                    [--overhead-pods N]   (external plugin: N pods without and N
#                                           with it, alternating rounds, one VM)
#                    [--pressure-bench]    (no runtime: tests/e2e/pressure/run.sh
#                                           measures `nri-qos monitor`)
#                    [--throttle-bench]    (no runtime: tests/e2e/pressure/throttle.sh
#                                           measures the memory.high throttle guard)
#                    [--kube-node LIST|all] (a Kubernetes node with nri-qos installed
#                                           by kubectl: tests/e2e/kube/README.md)
#
# Exit status: 0 when every E2E-CHECK passed on every VM, non-zero otherwise.
set -euo pipefail
{ # bash reads this whole group before running it, so editing run.sh mid-run is safe

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${E2E_CACHE:-$HERE/cache}"
WORK="${E2E_WORK:-$HERE/work}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
VM_TIMEOUT="${E2E_VM_TIMEOUT:-900}"
VM_MEM="${E2E_VM_MEM:-2048}"
VM_CPUS="${E2E_VM_CPUS:-2}"

versions=(1.7 2.1)
# memoryqos last: it hands the QoS and kubepods protection to the kubelet's
# Memory QoS until the plugin restarts (tests/e2e_vm.rs, OWN_SCENARIOS).
scenarios=(basic kubelet pagecache eviction memoryqos)
plugin=none
timing_pods=3
pressure_bench=0
throttle_bench=0
crictl=0
kube_node=0

usage() {
    sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while [ $# -gt 0 ]; do
    case "$1" in
    --containerd)
        case "${2:-}" in
        # 2.2+2.3: one boot, containerd 2.2 then 2.3 (guest.sh switches)
        1.7 | 2.1 | 2.2 | 2.3 | 2.2+2.3 | crio) versions=("$2") ;;
        all) versions=(1.7 2.1) ;;
        *) echo "run.sh: --containerd must be 1.7, 2.1, 2.2, 2.3, 2.2+2.3, crio or all" >&2; exit 2 ;;
        esac
        shift 2 ;;
    --scenario)
        IFS=, read -r -a scenarios <<<"${2?--scenario needs a list (may be empty)}"
        shift 2 ;;
    --plugin)
        case "${2:-}" in
        prelaunched | external | none) plugin="$2" ;;
        *) echo "run.sh: --plugin must be prelaunched, external or none" >&2; exit 2 ;;
        esac
        shift 2 ;;
    --crictl)
        crictl=1
        shift ;;
    --timing-pods)
        timing_pods="${2:?}"
        shift 2 ;;
    --overhead-pods)
        export E2E_OVERHEAD_PODS="${2:?}"
        shift 2 ;;
    --pressure-bench)
        pressure_bench=1
        scenarios=()
        shift ;;
    --throttle-bench)
        throttle_bench=1
        pressure_bench=1
        scenarios=()
        shift ;;
    --kube-node)
        # tests/e2e/kube/: its own cluster, install and scenarios, one boot
        kube_node=1
        KUBE_NODE_SCENARIOS="${2:?--kube-node needs a list of its scenarios, or all}"
        scenarios=()
        versions=(2.1)
        timing_pods=0
        shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; usage 2 ;;
    esac
done

log() { echo "e2e: $*" >&2; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# NAME@VERSION: the scenario runs on that containerd only (e.g. a pod-level
# resize, which needs 2.3, in a boot with 2.2 and 2.3).
scenario_files() {
    local s
    for s in "${scenarios[@]%@*}"; do echo "$s.json"; done
}
for s in "${scenarios[@]%@*}"; do
    [ -f "$HERE/scenarios/$s.json" ] || { log "no scenario file tests/e2e/scenarios/$s.json"; exit 2; }
done

"$HERE/fetch.sh"
if [ "$kube_node" = 1 ]; then
    # shellcheck source=tests/e2e/kube/host.sh
    . "$HERE/kube/host.sh"
fi
BUSYBOX="$CACHE/root-busybox-static/bin/busybox"
[ -x "$BUSYBOX" ] || BUSYBOX="$CACHE/root-busybox-static/usr/bin/busybox"
[ -x "$BUSYBOX" ] || { log "no static busybox in $CACHE/root-busybox-static"; exit 1; }

# --- binaries -----------------------------------------------------------------
log "building the CRI client example"
(cd "$ROOT" && cargo build --quiet --example cri-client)
CRI_CLIENT="$TARGET/debug/examples/cri-client"

NRI_QOS=""
if [ "$plugin" != none ] || [ "$pressure_bench" = 1 ]; then
    NRI_QOS="${NRI_QOS_BIN:-}"
    if [ -z "$NRI_QOS" ]; then
        for c in "$TARGET/release/nri-qos" "$TARGET/debug/nri-qos"; do
            if [ -x "$c" ] && { [ -z "$NRI_QOS" ] || [ "$c" -nt "$NRI_QOS" ]; }; then NRI_QOS="$c"; fi
        done
    fi
    if [ -z "$NRI_QOS" ]; then
        log "no nri-qos binary in $TARGET/{release,debug}: building a debug one"
        (cd "$ROOT" && cargo build --quiet --bin nri-qos)
        NRI_QOS="$TARGET/debug/nri-qos"
    fi
    log "nri-qos: $NRI_QOS (plugin $plugin, pressure bench $pressure_bench)"
fi

# memhog (examples/memhog.rs), linked statically so it runs in the busybox image.
log "building the static memhog example"
(cd "$ROOT" && cargo rustc --quiet --example memhog -- -C target-feature=+crt-static)
mkdir -p "$WORK"
# cargo test rebuilds it dynamically in place: keep our own copy.
cmp -s "$TARGET/debug/examples/memhog" "$WORK/memhog" || cp "$TARGET/debug/examples/memhog" "$WORK/memhog"

# --- tools Debian does not package (../shared/tools/README.md) --------------------
# Path of tool $1: the file named by variable $2 (a binary or its .xz), else
# the shared copy beside the repository; an .xz is unpacked into $WORK/tools.
# Prints nothing when neither exists.
tool() {
    local name="$1" src="${!2:-}" out="$WORK/tools/$1"
    [ -n "$src" ] || src="$ROOT/../shared/tools/bin/$name.xz"
    [ -f "$src" ] || return 0
    case "$src" in
    *.xz)
        mkdir -p "$WORK/tools"
        if ! [ "$out" -nt "$src" ]; then
            xz -dc "$src" >"$out.tmp" && chmod 755 "$out.tmp" && mv "$out.tmp" "$out"
        fi
        echo "$out" ;;
    *) echo "$src" ;;
    esac
}
# Why tool $1 is missing, for the skip notice.
missing() {
    if [ -n "${!2:-}" ]; then
        echo "$1 ($2=${!2} does not exist)"
    else
        echo "$1 (set $2 or provide $ROOT/../shared/tools/bin/$1.xz)"
    fi
}

CRICTL=""
has_crio=0
[[ " ${versions[*]} " != *" crio "* ]] || has_crio=1
if [ "$crictl" = 1 ] || [ "$has_crio" = 1 ]; then
    CRICTL="$(tool crictl NRI_QOS_CRICTL)"
    [ -n "$CRICTL" ] || [ "$crictl" = 0 ] || log "SKIP the crictl scenario: missing $(missing crictl NRI_QOS_CRICTL)"
fi
CRIO="" PINNS="" CRIO_MISSING=""
if [ "$has_crio" = 1 ]; then
    CRIO="$(tool crio NRI_QOS_CRIO)"
    PINNS="$(tool pinns NRI_QOS_PINNS)"
    [ -n "$CRIO" ] || CRIO_MISSING="$(missing crio NRI_QOS_CRIO)"
    [ -n "$PINNS" ] || CRIO_MISSING="${CRIO_MISSING:+$CRIO_MISSING; }$(missing pinns NRI_QOS_PINNS)"
    # the CRI-O guest pulls its images with crictl
    [ -n "$CRICTL" ] || CRIO_MISSING="${CRIO_MISSING:+$CRIO_MISSING; }$(missing crictl NRI_QOS_CRICTL)"
    # CRI-O has no image import: the guest serves the image from its loopback.
    log "building the oci-registry example (CRI-O pulls from it)"
    (cd "$ROOT" && cargo build --quiet --example oci-registry)
fi

JOURNAL_SINK=""
if [[ " ${scenarios[*]} " == *" guarded "* ]]; then
    # A pre-launched plugin logs to the journal; the guest has no systemd.
    log "building the journal-sink example (scenario guarded)"
    (cd "$ROOT" && cargo build --quiet --example journal-sink)
    JOURNAL_SINK="$TARGET/debug/examples/journal-sink"
fi
# containerd 2.2.7 and 2.3.4 are built from upstream (../shared/tools/README.md):
# a directory with containerd, containerd-shim-runc-v2 and ctr (each plain or
# .xz), from NRI_QOS_CONTAINERD_2_2 / NRI_QOS_CONTAINERD_2_3 or beside the
# repository. 1.7 and 2.1 are Debian's (fetch.sh). Sets CTRD_DIR[$ver] (the
# unpacked binaries) or CTRD_MISSING[$ver] (why not, for the skip notice).
declare -A CTRD_DIR=() CTRD_MISSING=() CTRD_UPSTREAM=([2.2]=2.2.7 [2.3]=2.3.4)
containerd_tools() {
    local ver="$1" var="NRI_QOS_CONTAINERD_${1/./_}" src out b
    if [ -z "${CTRD_UPSTREAM[$ver]:-}" ]; then
        CTRD_DIR[$ver]="$CACHE/root-containerd-$ver/usr/bin"
        return
    fi
    src="${!var:-$ROOT/../shared/tools/bin/containerd-${CTRD_UPSTREAM[$ver]}}"
    out="$WORK/tools/containerd-$ver"
    mkdir -p "$out"
    for b in containerd containerd-shim-runc-v2 ctr; do
        if [ -f "$src/$b.xz" ]; then
            [ "$out/$b" -nt "$src/$b.xz" ] ||
                { xz -dc "$src/$b.xz" >"$out/$b.tmp" && chmod 755 "$out/$b.tmp" && mv "$out/$b.tmp" "$out/$b"; }
        elif [ -f "$src/$b" ]; then
            cp "$src/$b" "$out/$b"
        else
            CTRD_MISSING[$ver]="containerd ${CTRD_UPSTREAM[$ver]}: no $b or $b.xz in $src (set $var to a directory holding containerd, containerd-shim-runc-v2 and ctr)"
            return
        fi
    done
    CTRD_DIR[$ver]="$out"
}
# The containerd versions of boot $1 ("2.2+2.3": both, one after the other).
boot_versions() { [ "$1" = crio ] || echo "${1//+/ }"; }
mkdir -p "$WORK"
for v in "${versions[@]}"; do
    for c in $(boot_versions "$v"); do containerd_tools "$c"; done
done

# --- the Kubernetes API in the guest (scenario kubeapi, opt-in) ---------------------
# etcd and kubectl from Debian (tests/kube/fetch.sh), kube-apiserver from
# ../shared/tools; the serving certificate, service-account key and a static
# token are made here, so the guest only starts the servers.
KUBE_APISERVER=""
if [[ " ${scenarios[*]} " == *" kubeapi "* ]]; then
    "$ROOT/tests/kube/fetch.sh"
    KUBE_APISERVER="$(tool kube-apiserver NRI_QOS_KUBE_APISERVER)"
    [ -n "$KUBE_APISERVER" ] || { log "scenario kubeapi: missing $(missing kube-apiserver NRI_QOS_KUBE_APISERVER)"; exit 2; }
    command -v openssl >/dev/null || { log "scenario kubeapi: needs openssl on the host (certificates)"; exit 2; }
    # etcd (~40 MiB) and kube-apiserver (~270 MiB) beside the eviction pods
    VM_MEM="${E2E_VM_MEM:-3072}"
    make_kube_certs() {
        local k="$WORK/kube" ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
        [ -s "$k/kubeconfig" ] && return
        rm -rf "$k" && mkdir -p "$k"
        openssl req -x509 "${ec[@]}" -keyout "$k/ca.key" -out "$k/ca.crt" -subj /CN=e2e-ca -days 3650 2>/dev/null
        openssl req "${ec[@]}" -keyout "$k/tls.key" -out "$k/tls.csr" -subj /CN=localhost 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$k/ext"
        openssl x509 -req -in "$k/tls.csr" -CA "$k/ca.crt" -CAkey "$k/ca.key" -CAcreateserial \
            -out "$k/tls.crt" -days 3650 -extfile "$k/ext" 2>/dev/null
        openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$k/sa.key" 2>/dev/null
        openssl pkey -in "$k/sa.key" -pubout -out "$k/sa.pub" 2>/dev/null
        printf 'e2e-admin-token,admin,admin-uid,"system:masters"\n' >"$k/tokens.csv"
        printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: %s\nusers:\n- name: admin\n  user:\n    token: e2e-admin-token\ncontexts:\n- name: e2e\n  context: {cluster: e2e, user: admin}\ncurrent-context: e2e\n' \
            "$(base64 -w0 "$k/ca.crt")" >"$k/kubeconfig"
        rm -f "$k/tls.csr" "$k/ext" "$k/ca.key" "$k/ca.srl"
    }
    make_kube_certs
    log "kubeapi: kube-apiserver $KUBE_APISERVER, etcd and kubectl from $CACHE, guest memory ${VM_MEM} MiB"
fi

# --- a Kubernetes node in the guest (--kube-node, tests/e2e/kube/) ---------------
if [ "$kube_node" = 1 ]; then
    kube_node_prepare
    trap kube_cp_stop EXIT
    VM_MEM="${E2E_VM_MEM:-3072}"
    VM_TIMEOUT="${E2E_VM_TIMEOUT:-3000}"
fi

# --- image: an OCI layout tar with one busybox layer ----------------------------
sha() { sha256sum "$1" | cut -d' ' -f1; }
build_image() {
    local out="$WORK/images/busybox.tar" d="$WORK/image"
    [ -s "$out" ] && [ -f "$d/oci/index.json" ] && [ "$out" -nt "$BUSYBOX" ] && [ "$out" -nt "${BASH_SOURCE[0]}" ] && [ "$out" -nt "$WORK/memhog" ] && return
    rm -rf "$d" && mkdir -p "$d/layer/bin" "$d/oci/blobs/sha256" "$WORK/images"
    cp "$BUSYBOX" "$d/layer/bin/busybox"
    cp "$WORK/memhog" "$d/layer/bin/memhog"
    for a in sh sleep cat ls true dd sync; do ln -s busybox "$d/layer/bin/$a"; done
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$d/layer" -cf "$d/layer.tar" .
    local layer lsize config csize manifest msize
    layer="$(sha "$d/layer.tar")"
    lsize="$(stat -c %s "$d/layer.tar")"
    mv "$d/layer.tar" "$d/oci/blobs/sha256/$layer"
    printf '{"architecture":"amd64","os":"linux","config":{"Cmd":["/bin/sleep","86400"],"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$layer" >"$d/config.json"
    config="$(sha "$d/config.json")"
    csize="$(stat -c %s "$d/config.json")"
    mv "$d/config.json" "$d/oci/blobs/sha256/$config"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
        "$config" "$csize" "$layer" "$lsize" >"$d/manifest.json"
    manifest="$(sha "$d/manifest.json")"
    msize="$(stat -c %s "$d/manifest.json")"
    mv "$d/manifest.json" "$d/oci/blobs/sha256/$manifest"
    # The same image under two names: the workload image and the sandbox (pause) image.
    local entry='{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}'
    # shellcheck disable=SC2059
    printf "{\"schemaVersion\":2,\"manifests\":[$entry,$entry]}" \
        "$manifest" "$msize" "e2e.local/busybox:latest" "latest" \
        "$manifest" "$msize" "registry.k8s.io/pause:3.10" "3.10" >"$d/oci/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$d/oci/oci-layout"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$d/oci" -cf "$out" .
}

# --- containerd configs ----------------------------------------------------------
config_17() {
    cat <<'EOF'
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  disable_apparmor = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/bin/runc"
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "/var/run/nri/nri.sock"
  plugin_path = "/opt/nri/plugins"
  plugin_config_path = "/etc/nri/conf.d"
EOF
}

config_21() {
    cat <<'EOF'
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "registry.k8s.io/pause:3.10"
[plugins."io.containerd.cri.v1.runtime"]
  disable_apparmor = true
  enable_cdi = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      snapshotter = "native"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/bin/runc"
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "/var/run/nri/nri.sock"
  plugin_path = "/opt/nri/plugins"
  plugin_config_path = "/etc/nri/conf.d"
EOF
}

# CRI-O: cgroupfs, vfs storage, runc with Debian's conmon, no infra container
# for host-network pods; [crio.nri] comes from config/crio/ as a drop-in.
config_crio() {
    cat <<'EOF'
[crio]
root = "/var/lib/containers/storage"
runroot = "/run/containers/storage"
storage_driver = "vfs"
log_dir = "/var/log/crio/pods"
[crio.api]
listen = "/var/run/crio/crio.sock"
[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
pinns_path = "/usr/bin/pinns"
apparmor_profile = "unconfined"
selinux = false
# no iptables/nft in the guest; host-network pods need no port mapping
disable_hostport_mapping = true
[crio.runtime.runtimes.runc]
runtime_path = "/usr/bin/runc"
runtime_type = "oci"
runtime_root = "/run/runc"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"
[crio.image]
pause_image = "registry.k8s.io/pause:3.10"
signature_policy = "/etc/crio/policy.json"
EOF
}

# Both image names the tests use resolve to the guest's own registry.
registries_conf() {
    cat <<'EOF'
unqualified-search-registries = []
[[registry]]
prefix = "e2e.local"
location = "127.0.0.1:5000"
insecure = true
[[registry]]
prefix = "registry.k8s.io"
location = "127.0.0.1:5000"
insecure = true
EOF
}

# --- initramfs ------------------------------------------------------------------
GUEST_LIBS=("$CACHE/root-libc6/usr/lib/x86_64-linux-gnu" "$CACHE/root-libseccomp2/usr/lib/x86_64-linux-gnu"
    "$CACHE/root-libglib2.0/usr/lib/x86_64-linux-gnu")
# Copy the shared libraries binary $1 needs into rootfs $2, preferring the guest
# (trixie) libc set; anything else (e.g. libgcc_s for Rust binaries) from the host.
copy_libs() {
    local bin="$1" r="$2" lib name src d
    while read -r lib; do
        name="$(basename "$lib")"
        [ -e "$r/lib/x86_64-linux-gnu/$name" ] && continue
        src=""
        for d in "${GUEST_LIBS[@]}"; do [ -e "$d/$name" ] && src="$d/$name" && break; done
        [ -n "$src" ] || src="$lib"
        cp -L "$src" "$r/lib/x86_64-linux-gnu/$name"
    done < <(LD_LIBRARY_PATH="${GUEST_LIBS[2]}" ldd "$bin" 2>/dev/null | awk '$3 ~ /^\// {print $3}')
}

build_initramfs() {
    local ver="$1" out="$2"
    local r="$WORK/rootfs-$ver" first next
    read -r first next <<<"$(boot_versions "$ver")"
    rm -rf "$r"
    mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,lib/x86_64-linux-gnu,lib64,etc/containerd,e2e/bin,e2e/scenarios,e2e/images,opt/nri/plugins,etc/nri/conf.d,root,var/log,var/lib,run}
    ln -s ../run "$r/var/run"
    cp "$BUSYBOX" "$r/bin/busybox"
    # busybox applets (sh, mount, ip, ...) as symlinks; skip ones we ship for real
    for a in $("$BUSYBOX" --list); do
        [ -e "$r/bin/$a" ] || ln -s busybox "$r/bin/$a"
    done
    cp "$HERE/guest/init" "$r/init"
    cp "$HERE/guest/guest.sh" "$r/e2e/guest.sh"
    cp "$HERE/guest/crictl.sh" "$r/e2e/crictl.sh"
    cp "$HERE/guest/runtimes.sh" "$HERE/guest/swap.sh" "$r/e2e/"
    chmod 755 "$r/init" "$r/e2e/guest.sh"
    if [ "$ver" = crio ]; then
        cp "$CRIO" "$r/usr/bin/crio"
        cp "$PINNS" "$r/usr/bin/pinns"
        cp "$CACHE/root-conmon/usr/bin/conmon" "$r/usr/bin/conmon"
        cp "$TARGET/debug/examples/oci-registry" "$r/e2e/bin/oci-registry"
        cp -r "$WORK/image/oci" "$r/e2e/images/oci"
        mkdir -p "$r/etc/crio/crio.conf.d" "$r/etc/containers"
        config_crio >"$r/etc/crio/crio.conf"
        cp "$ROOT/config/crio/10-nri-qos.conf" "$r/etc/crio/crio.conf.d/"
        echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$r/etc/crio/policy.json"
        registries_conf >"$r/etc/containers/registries.conf"
    else
        cp "${CTRD_DIR[$first]}"/{containerd,containerd-shim-runc-v2,ctr} "$r/usr/bin/"
        # the second containerd of a 2.2+2.3 boot: guest.sh puts it in place
        if [ -n "$next" ]; then
            mkdir -p "$r/opt/containerd-$next"
            cp "${CTRD_DIR[$next]}"/{containerd,containerd-shim-runc-v2,ctr} "$r/opt/containerd-$next/"
        fi
    fi
    [ -z "$CRICTL" ] || cp "$CRICTL" "$r/usr/bin/crictl"
    cp "$CACHE/root-runc/usr/sbin/runc" "$r/usr/bin/runc"
    # the guest's loader and libc come from trixie (runc needs GLIBC_2.38)
    cp -L "$CACHE/root-libc6/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$r/lib64/"
    ln -s ../lib64/ld-linux-x86-64.so.2 "$r/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    for so in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1; do
        cp -L "$CACHE/root-libc6/usr/lib/x86_64-linux-gnu/$so" "$r/lib/x86_64-linux-gnu/"
    done
    cp -L "$CACHE/root-libseccomp2/usr/lib/x86_64-linux-gnu/libseccomp.so.2" "$r/lib/x86_64-linux-gnu/"
    if [ -n "$KUBE_APISERVER" ]; then
        cp "$KUBE_APISERVER" "$r/usr/bin/kube-apiserver"
        cp "$CACHE/root-etcd-server/usr/bin/etcd" "$CACHE/root-kubectl/usr/bin/kubectl" "$r/usr/bin/"
        cp -r "$WORK/kube" "$r/e2e/kube"
    fi
    cp "$CRI_CLIENT" "$r/e2e/bin/cri-client"
    [ -z "$NRI_QOS" ] || cp "$NRI_QOS" "$r/e2e/bin/nri-qos"
    [ "$kube_node" = 0 ] || kube_node_rootfs "$r"
    [ -z "$JOURNAL_SINK" ] || cp "$JOURNAL_SINK" "$r/e2e/bin/journal-sink"
    for b in "$r"/usr/bin/* "$r"/e2e/bin/*; do copy_libs "$b" "$r"; done
    cp "$WORK/images/busybox.tar" "$r/e2e/images/"
    cp "$WORK/memhog" "$r/e2e/bin/memhog"
    # The debug binaries carry ~170 MB of debug info each, and the guest's root
    # is a tmpfs inside its 2 GiB: unstripped, they ate the headroom the
    # eviction scenario's pods are sized for. Symbols stay for backtraces.
    strip --strip-debug "$r"/e2e/bin/*
    cp "$HERE/pressure/run.sh" "$r/e2e/pressure.sh"
    cp "$HERE/pressure/throttle.sh" "$r/e2e/throttle.sh"
    cp "$HERE/pressure/pressure-lib.sh" "$r/e2e/pressure-lib.sh"
    cp "$CACHE"/{loop,zsmalloc,lzo-rle,zram}.ko "$r/e2e/"
    cp "$HERE"/scenarios/*.json "$r/e2e/scenarios/"
    cp -r "$HERE/scenarios/pods" "$r/e2e/scenarios/"
    # The shipped install files, as an operator copies them (scenario guarded).
    mkdir -p "$r/e2e/config/nri" "$r/e2e/config/kubernetes" "$r/e2e/config/systemd"
    cp "$ROOT/config/nri-qos.toml" "$r/e2e/config/"
    cp "$ROOT/config/nri/10-nri-qos.conf" "$r/e2e/config/nri/"
    cp "$ROOT/config/kubernetes/daemonset.yaml" "$r/e2e/config/kubernetes/"
    cp "$ROOT/config/systemd/nri-qos.service" "$r/e2e/config/systemd/"
    # 2.2 and 2.3 take 2.1's version 3 file (2.3 migrates it at start)
    case "$first" in
    1.7) config_17 ;;
    2.*) config_21 ;;
    esac >"$r/etc/containerd/config.toml"
    printf '127.0.0.1 localhost e2e-node\n::1 localhost\n' >"$r/etc/hosts"
    printf 'nameserver 127.0.0.1\n' >"$r/etc/resolv.conf"
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
    printf 'root:x:0:\n' >"$r/etc/group"
    {
        echo "E2E_CONTAINERD=$first"
        echo "E2E_NEXT_CONTAINERD=$next"
        echo "E2E_RUNTIME=$([ "$ver" = crio ] && echo crio || echo containerd)"
        echo "E2E_CRICTL=$([ -n "$CRICTL" ] && [ "$crictl" = 1 ] && echo 1 || echo 0)"
        echo "E2E_PLUGIN=$plugin"
        echo "E2E_RESILIENCE=${E2E_RESILIENCE:-0}"
        echo "E2E_OVERHEAD_PODS=${E2E_OVERHEAD_PODS:-0}"
        echo "E2E_OVERHEAD_ROUNDS=${E2E_OVERHEAD_ROUNDS:-4}"
        echo "E2E_SCENARIOS=\"${scenarios[*]}\""
        echo "E2E_TIMING_PODS=$timing_pods"
        echo "E2E_VERBOSE=${E2E_VERBOSE:-0}"
        echo "E2E_VM_TIMEOUT=$boot_timeout"
        echo "E2E_PRESSURE_BENCH=$pressure_bench"
        echo "E2E_THROTTLE_BENCH=$throttle_bench"
        echo "E2E_BENCH_RUNS=${E2E_BENCH_RUNS:-10}"
        echo "E2E_BENCH_IDLE_S=${E2E_BENCH_IDLE_S:-60}"
        echo "E2E_BENCH_RATE=${E2E_BENCH_RATE:-256}"
        # scenarios that need reclaimable page cache get /data on a real
        # (ext2 on loop) filesystem
        if [ ${#scenarios[@]} -gt 0 ] && (cd "$HERE/scenarios" && scenario_files | xargs grep -lE '"(reclaim|sparse_files|files)"' >/dev/null 2>&1); then
            echo "E2E_DISK=1"
        fi
    } >"$r/e2e/env"
    # uncompressed: the guest unpacks it faster than it could gunzip under TCG
    (cd "$r" && find . -print0 | cpio --null -o -H newc --quiet) >"$out"
}

# --- run -----------------------------------------------------------------------
# qemu's software emulation has, rarely, hung in early boot before the guest
# printed anything (seen once in a 2-CPU boot of the 6.1 cloud kernel): the
# whole VM timeout was lost on it. Stage 2 normally starts within 5-20 s.
BOOT_TIMEOUT="${E2E_BOOT_TIMEOUT:-180}"
# A command qemu runs under, and its network (the Kubernetes node's only;
# every other guest has no network device).
QEMU_WRAP=()
QEMU_NET=()
BOOT_HUNG=86
# It has also frozen after stage 2: once not a line more (CI, containerd 1.7
# at its first pod), once both vCPUs in a soft lockup while the kernel went
# on printing RCU stall reports (CI, containerd 1.7, 809 s until the VM
# timeout). The guest prints E2E-ALIVE every 60 s (the longest gap between
# E2E lines in passing runs is under 50 s), so no E2E line this long (two
# E2E-ALIVE beats missed) means the guest's user space or qemu stopped,
# whatever the kernel still says; each second waited past that is lost to
# the whole suite's time.
SILENCE_LIMIT="${E2E_SILENCE_LIMIT:-150}"
GUEST_FROZE=87

# Kills the qemu whose pid file is $1 (a frozen one may not handle SIGTERM).
kill_qemu() {
    kill -KILL "$(cat "$1" 2>/dev/null)" 2>/dev/null || true
}

# What qemu $1 and its guest were doing when the console fell silent, through
# the monitor on the FIFOs $2.in/$2.out: does qemu's main loop still answer,
# are the vCPUs running, halted or spinning (their registers twice), is the
# local APIC timer armed; the host's view of qemu's threads; then SysRq
# (blocked tasks, CPU backtraces) lands on the console if the kernel lives.
qemu_state() {
    local pid="$1" mon="$2" t
    echo "---- qemu threads: state, CPU ticks (utime+stime), wchan; 5 s apart ----"
    for _ in 1 2; do
        for t in /proc/"$pid"/task/*; do
            printf '%-16s %s %s\n' "$(cat "$t/comm" 2>/dev/null)" \
                "$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{ print $1, $12 + $13 }')" "$(cat "$t/wchan" 2>/dev/null)"
        done
        sleep 5
    done
    echo "---- qemu monitor (no answer: qemu's main loop is stuck) ----"
    # <> opens a FIFO without waiting for a reader; qemu holds both ends open.
    printf '%s\n' 'info status' 'info cpus' 'info registers -a' 'info lapic 0' 'info lapic 1' 'info pic' \
        'info registers -a' 'sendkey alt-sysrq-9' 'sendkey alt-sysrq-w' 'sendkey alt-sysrq-l' 1<>"$mon.in"
    # The monitor echoes each keystroke: keep the command; drop the registers
    # nobody reads in a hang (segments, debug, FPU, vector).
    timeout 10 cat "$mon.out" | tr -d '\r' |
        sed 's/^(qemu) .*\x1b\[D\([^\x1b]*\)\x1b\[K$/(qemu) \1/' |
        grep -avE '^(YMM|FPR|FCW|DR[0-9]|[ECSDFG]S =|LDT=|TR =|GDT=|IDT=)'
    echo # after the last prompt
}

# Boots the VM on $1, console to $2 (live, \r stripped), the E2E lines to
# stderr. Returns $BOOT_HUNG when stage 2 did not start in time, and
# $GUEST_FROZE (qemu's state written to $3) when no E2E line then came for
# $SILENCE_LIMIT s (that console kept as *.frozen.log). $4=1 plays such a
# freeze: after stage 2 only the kernel speaks (tests of run.sh).
boot_vm() {
    local initrd="$1" consolef="$2" statef="$3" test_freeze="${4:-0}"
    local pidfile="$WORK/qemu.pid" mon="$WORK/qemu-monitor" progressf="${2%.log}.e2e-lines" pipe
    local start=$SECONDS stage2=0 size=0 console_size last_output=$SECONDS append="console=ttyS0 quiet panic=-1 rdinit=/init"
    rm -f "$pidfile" "$mon.in" "$mon.out"
    mkfifo "$mon.in" "$mon.out"
    : >"$consolef"
    : >"$progressf"
    # SysRq from the host's keyboard (qemu_state) needs it enabled.
    append="$append sysrq_always_enabled"
    [ "$test_freeze" != 1 ] || append="$append e2e.test_freeze=1"
    # (|| true: a qemu killed here is reported by the caller, not by bash's job notices)
    { timeout --kill-after=10 "$boot_timeout" "${QEMU_WRAP[@]}" qemu-system-x86_64 \
        -accel tcg -cpu max -m "$VM_MEM" -smp "$VM_CPUS" \
        -nographic -no-reboot -nodefaults -serial stdio -display none \
        -name e2e,debug-threads=on \
        -chardev pipe,id=mon0,path="$mon" -mon chardev=mon0,mode=readline \
        -pidfile "$pidfile" \
        -kernel "$CACHE/vmlinuz" -initrd "$initrd" "${QEMU_NET[@]}" \
        -append "$append" </dev/null || true; } |
        sed -u 's/\r$//' | tee "$consolef" | grep -a --line-buffered -E '^(E2E-|Error)' | tee "$progressf" |
        grep -a --line-buffered -E '^(E2E-(CHECK|INFO|TIMING|DONE)|Error)' | sed -u "s/^/    /" &
    pipe=$!
    while kill -0 "$pipe" 2>/dev/null; do
        if [ "$stage2" = 0 ]; then
            if grep -aq '^E2E-INFO .*stage 2 up' "$consolef"; then
                stage2=1
            elif [ $((SECONDS - start)) -ge "$BOOT_TIMEOUT" ]; then
                kill_qemu "$pidfile"
                wait "$pipe"
                return "$BOOT_HUNG"
            fi
        elif [ "$(stat -c %s "$progressf")" != "$size" ]; then
            size="$(stat -c %s "$progressf")"
            last_output=$SECONDS
        elif [ $((SECONDS - last_output)) -ge "$SILENCE_LIMIT" ]; then
            cp "$consolef" "${consolef%.log}.frozen.log"
            console_size="$(stat -c %s "$consolef")"
            qemu_state "$(cat "$pidfile")" "$mon" >"$statef" 2>&1
            sleep 10
            echo "---- console after SysRq 9, w, l (empty: the guest kernel takes no interrupts) ----" >>"$statef"
            tail -c +$((console_size + 1)) "$consolef" >>"$statef"
            kill_qemu "$pidfile"
            wait "$pipe"
            return "$GUEST_FROZE"
        fi
        sleep 1
    done
    wait "$pipe"
}

parse_console() {
    local logf="$1" name="$2"
    local pass fail done_line
    pass="$(grep -ac '^E2E-CHECK [^ ]* PASS' "$logf" || true)"
    fail="$(grep -ac '^E2E-CHECK [^ ]* FAIL' "$logf" || true)"
    done_line="$(grep -am1 '^E2E-DONE' "$logf" || true)"
    grep -a '^E2E-CHECK [^ ]* FAIL' "$logf" | sed "s#^#e2e: [$name] #" >&2 || true
    if [ -z "$done_line" ]; then
        log "[$name] FAIL: the VM did not finish (timeout ${boot_timeout}s or crash); last console lines:"
        if grep -aq '^E2E-INFO .*watchdog:' "$logf"; then
            # the guest's watchdog said what the runtime and plugin were doing
            awk '/^E2E-INFO .*watchdog:/ { on = 1 } on' "$logf" | head -n 500 | sed "s/^/    /" >&2
        else
            tail -n 25 "$logf" | sed "s/^/    /" >&2
        fi
        return 1
    fi
    log "[$name] $pass checks passed, $fail failed ($done_line)"
    [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ] && [ "$done_line" = "E2E-DONE rc=0" ]
}

mkdir -p "$WORK"
build_image
total_fail=0
summary=()
for ver in "${versions[@]}"; do
    name="containerd-$ver/${plugin}/$(IFS=,; echo "${scenarios[*]}")"
    [ "$ver" != crio ] || name="crio/${plugin}/$(IFS=,; echo "${scenarios[*]}")"
    if [ "$ver" = crio ] && [ -n "$CRIO_MISSING" ]; then
        log "[$name] SKIP: missing $CRIO_MISSING"
        summary+=("SKIP $name (missing $CRIO_MISSING)")
        continue
    fi
    missing_ctrd=""
    for c in $(boot_versions "$ver"); do
        [ -z "${CTRD_MISSING[$c]:-}" ] || missing_ctrd="${missing_ctrd:+$missing_ctrd; }${CTRD_MISSING[$c]}"
    done
    if [ -n "$missing_ctrd" ]; then
        log "[$name] SKIP: missing $missing_ctrd"
        summary+=("SKIP $name (missing $missing_ctrd)")
        continue
    fi
    # E2E_VM_TIMEOUT per containerd version of the boot (2.2+2.3: twice)
    boot_timeout=$((VM_TIMEOUT * $(boot_versions "$ver" | wc -w)))
    [ "$ver" != crio ] || boot_timeout=$VM_TIMEOUT
    initrd="$WORK/initramfs-$ver.cpio"
    consolef="$WORK/console-$ver-$plugin.log"
    t0=$(date +%s.%N)
    build_initramfs "$ver" "$initrd"
    t1=$(date +%s.%N)
    log "[$name] initramfs $(du -h "$initrd" | cut -f1) built in $(elapsed "$t0" "$t1") s; booting (timeout ${boot_timeout}s)"
    set +e
    # Once more after an early-boot hang or a freeze; a frozen boot's
    # results are discarded. E2E_TEST_FREEZE=1 plays a freeze in the first.
    statef="$WORK/qemu-state-$ver-$plugin.txt"
    rm -f "$statef" "${consolef%.log}.frozen.log"
    test_freeze="${E2E_TEST_FREEZE:-0}"
    for attempt in 1 2; do
        if [ "$kube_node" = 1 ]; then
            # a fresh control plane for each boot: the node registers anew
            kube_cp_start || { status=1; break; }
            QEMU_WRAP=(ip netns exec "$KUBE_CP_NS")
            read -ra QEMU_NET <<<"$(kube_cp_qemu_net)"
        fi
        boot_vm "$initrd" "$consolef" "$statef" "$test_freeze"
        status=$?
        test_freeze=0
        if [ "$status" = "$BOOT_HUNG" ]; then
            log "[$name] the guest did not reach stage 2 within ${BOOT_TIMEOUT}s (an early-boot hang under TCG; attempt $attempt)"
        elif [ "$status" = "$GUEST_FROZE" ]; then
            log "[$name] GUEST FROZE: no E2E line for ${SILENCE_LIMIT}s after stage 2 (attempt $attempt); last console lines:"
            tail -n 25 "${consolef%.log}.frozen.log" | sed "s/^/    /" >&2
            log "[$name] qemu's state when it froze ($statef):"
            sed "s/^/    /" "$statef" >&2
        else
            break
        fi
        [ "$attempt" = 1 ] && log "[$name] booting once more; this boot's results are discarded"
    done
    set -e
    t2=$(date +%s.%N)
    wall="$(elapsed "$t1" "$t2")"
    grep -a '^E2E-RESULT ' "$consolef" | sed 's/^E2E-RESULT //' >"$WORK/results-$ver-$plugin.jsonl" || true
    if [ "$kube_node" = 1 ]; then
        # the control plane's log tails when the node did not finish clean
        if grep -aq '^E2E-DONE rc=0' "$consolef"; then kube_cp_stop; else kube_cp_stop 30; fi
        kube_node_report "$consolef"
    fi
    log "[$name] VM wall time ${wall} s; console log: $consolef; values: $WORK/results-$ver-$plugin.jsonl"
    if parse_console "$consolef" "$name"; then
        summary+=("PASS $name (${wall} s)")
    else
        summary+=("FAIL $name (${wall} s)")
        total_fail=$((total_fail + 1))
    fi
done

echo "e2e summary:"
printf '  %s\n' "${summary[@]}"
if [ "$total_fail" -ne 0 ]; then exit 1; fi
exit 0
}
