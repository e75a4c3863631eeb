#!/usr/bin/env bash
# Fetch (once) everything the e2e VM needs and cache it under tests/e2e/cache/.
#
# Host tools come from the machine's own apt sources. The guest payload
# (kernel and its loop and zram modules, containerd 1.7.24 and 2.1.9, runc
# 1.1.15, conmon 2.1.x) comes from Debian through a
# PRIVATE apt configuration, so the machine's own sources and lists stay
# untouched. The mirror host is read from the machine's /etc/apt at run time.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${E2E_CACHE:-$HERE/cache}"
APT="$CACHE/apt"
DEBS="$CACHE/debs"
# Exact upstream versions under test; the Debian revision is whatever the suite has.
KERNEL_SUITE=bookworm
CTRD17_SUITE=trixie
CTRD17_VERSION=1.7.24
CTRD21_SUITE=forky
CTRD21_VERSION=2.1.9
RUNC_SUITE=trixie
RUNC_VERSION=1.1.15
# CRI-O's monitor (CRI-O itself is not packaged: ../shared/tools/bin/crio.xz)
CONMON_SUITE=trixie
CONMON_VERSION=2.1

log() { echo "fetch: $*" >&2; }

host_packages() {
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    command -v cpio >/dev/null || missing+=(cpio)
    command -v strip >/dev/null || missing+=(binutils)
    command -v timeout >/dev/null || missing+=(coreutils)
    # the Kubernetes node's control plane runs in a network namespace
    command -v ip >/dev/null || missing+=(iproute2)
    command -v openssl >/dev/null || missing+=(openssl)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing host packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# The Debian mirror the machine itself uses (first deb URI of the debian archive).
mirror() {
    local m
    m="$( (cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true) |
        awk '/^URIs:/ {print $2}' | grep -v -- '-security' | grep -m1 'debian' || true)"
    if [ -z "$m" ]; then
        m="$( (cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true) |
            awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; break}}' |
            grep -v -- '-security' | grep -m1 'debian' || true)"
    fi
    [ -n "$m" ] || { log "cannot find the Debian mirror in /etc/apt"; exit 1; }
    echo "${m%/}"
}

APT_OPTS=()
private_apt() {
    mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$DEBS"
    local m keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    m="$(mirror)"
    {
        for s in "$KERNEL_SUITE" "$CTRD17_SUITE" "$CTRD21_SUITE"; do
            echo "deb [arch=amd64 signed-by=$keyring] $m $s main"
        done
    } | sort -u >"$APT/sources.list"
    APT_OPTS=(
        -o "Dir::Etc::SourceList=$APT/sources.list"
        -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$APT/lists"
        -o "Dir::Cache=$APT/cache"
        -o "Dir::State::Status=/var/lib/dpkg/status"
        -o "APT::Get::List-Cleanup=0"
        -o "Debug::NoLocking=1"
        -o "APT::Sandbox::User=root"
        -o "Acquire::Languages=none"
    )
    # Refresh the private lists at most once a day.
    if [ -z "$(find "$APT/lists" -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
        log "updating private apt lists from $m"
        apt-get "${APT_OPTS[@]}" update -qq
    fi
}

# newest version of package $1 from suite $2 whose upstream version starts with $3
pick_version() {
    apt-cache "${APT_OPTS[@]}" madison "$1" |
        awk -F'|' -v s="$2" -v v="$3" '
            { gsub(/ /, "", $2); gsub(/ /, "", $3) }
            $3 ~ ("/" s "/") || $3 ~ (" " s "/") || index($3, s "/") { if (index($2, v) == 1 || index($2, "1:" v) == 1) print $2 }' |
        head -1
}

# download package $1 at a version picked from suite $2 / prefix $3 into $DEBS/$4.deb
get_deb() {
    local pkg="$1" suite="$2" prefix="$3" out="$DEBS/$4.deb" ver
    [ -s "$out" ] && { log "cached $4"; return; }
    ver="$(pick_version "$pkg" "$suite" "$prefix")"
    [ -n "$ver" ] || { log "no $pkg $prefix* in $suite"; apt-cache "${APT_OPTS[@]}" madison "$pkg" >&2; exit 1; }
    log "downloading $pkg=$ver ($suite)"
    local tmp
    tmp="$(mktemp -d)"
    (cd "$tmp" && apt-get "${APT_OPTS[@]}" download -qq "$pkg=$ver")
    mv "$tmp"/*.deb "$out"
    rmdir "$tmp"
}

# Modules of the cloud kernel the guest loads with insmod (no modprobe, no
# dependency resolution: each is listed after what it needs).
KERNEL_MODULES=(drivers/block/loop.ko mm/zsmalloc.ko crypto/lzo-rle.ko drivers/block/zram/zram.ko
    drivers/virtio/virtio.ko drivers/virtio/virtio_ring.ko drivers/virtio/virtio_pci_legacy_dev.ko
    drivers/virtio/virtio_pci_modern_dev.ko drivers/virtio/virtio_pci.ko net/core/failover.ko
    drivers/net/net_failover.ko drivers/net/virtio_net.ko)

kernel() {
    local m have=1
    for m in "${KERNEL_MODULES[@]}"; do [ -s "$CACHE/$(basename "$m")" ] || have=0; done
    [ -s "$CACHE/vmlinuz" ] && [ "$have" = 1 ] && { log "cached kernel"; return; }
    # linux-image-cloud-amd64 depends on the current 6.1 cloud image of bookworm.
    local pkg
    pkg="$(apt-cache "${APT_OPTS[@]}" depends "linux-image-cloud-amd64=$(pick_version linux-image-cloud-amd64 "$KERNEL_SUITE" 6.1)" |
        awk '/Depends: linux-image-6\.1\.0-.*-cloud-amd64$/ {print $2; exit}')"
    [ -n "$pkg" ] || { log "cannot resolve the bookworm cloud kernel"; exit 1; }
    get_deb "$pkg" "$KERNEL_SUITE" 6.1 kernel
    local tmp
    tmp="$(mktemp -d)"
    dpkg -x "$DEBS/kernel.deb" "$tmp"
    cp "$tmp"/boot/vmlinuz-* "$CACHE/vmlinuz"
    # loop gives the guest a real filesystem whose page cache is reclaimable
    # (scenario protection); zram (with zsmalloc and its lzo-rle compressor)
    # its swap (scenario swap); virtio-net (with virtio's PCI transport and
    # failover) the Kubernetes node's link to its control plane
    for m in "${KERNEL_MODULES[@]}"; do
        cp "$tmp"/lib/modules/*/kernel/"$m" "$CACHE/$(basename "$m")"
    done
    rm -rf "$tmp"
}

extract() {
    local name="$1" dir="$CACHE/root-$1"
    [ -d "$dir" ] && return
    dpkg -x "$DEBS/$name.deb" "$dir.tmp"
    mv "$dir.tmp" "$dir"
}

main() {
    mkdir -p "$CACHE"
    host_packages
    private_apt
    kernel
    get_deb containerd "$CTRD17_SUITE" "$CTRD17_VERSION" containerd-1.7
    get_deb containerd "$CTRD21_SUITE" "$CTRD21_VERSION" containerd-2.1
    get_deb runc "$RUNC_SUITE" "$RUNC_VERSION" runc
    # The guest's (and the test image's) static busybox is fetched, not installed:
    # busybox-static conflicts with the host's busybox package, if any.
    get_deb busybox-static "$KERNEL_SUITE" "" busybox-static
    # trixie's runc needs GLIBC_2.38 (bookworm has 2.36): the guest gets trixie's
    # libc and libseccomp, which also run the older-glibc binaries (containerd, ours).
    get_deb libc6 "$RUNC_SUITE" "" libc6
    get_deb libseccomp2 "$RUNC_SUITE" "" libseccomp2
    # conmon (CRI-O only) needs glib >= 2.78: trixie's, like the libc.
    get_deb conmon "$CONMON_SUITE" "$CONMON_VERSION" conmon
    get_deb libglib2.0-0t64 "$CONMON_SUITE" "" libglib2.0
    for n in containerd-1.7 containerd-2.1 runc libc6 libseccomp2 busybox-static conmon libglib2.0; do extract "$n"; done
    log "ok: $(cd "$CACHE" && ls -d vmlinuz root-*)"
}

# Sourced (tests/kube/fetch.sh) for its functions only.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
