#!/usr/bin/env bash
# Lays out the nri-qos image's whole filesystem in ROOTFS: the binary at
# /usr/local/bin/nri-qos, every shared library it links (ldd: the loader,
# glibc, libgcc_s) at the path the loader looks for it, and /etc/passwd and
# /etc/group with root. Nothing else: no shell, no package manager (the
# liveness probe execs the binary itself).
#
#   scripts/image-rootfs.sh BINARY ROOTFS
#
# Both image builds use it: scripts/build-image.sh (no Docker, an OCI
# archive) and config/kubernetes/Dockerfile (its build stage), so both
# images hold the same files.
set -euo pipefail

bin="${1:?usage: image-rootfs.sh BINARY ROOTFS}"
root="${2:?usage: image-rootfs.sh BINARY ROOTFS}"
[ -x "$bin" ] || { echo "image-rootfs: $bin is not an executable" >&2; exit 1; }
[ ! -e "$root" ] || [ -z "$(ls -A "$root")" ] || { echo "image-rootfs: $root is not empty" >&2; exit 1; }

install -D -m 0755 "$bin" "$root/usr/local/bin/nri-qos"
# "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and the loader's
# "/lib64/ld-linux-x86-64.so.2 (0x...)": the path on the left of the address.
libs="$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')"
[ -n "$libs" ] || { echo "image-rootfs: ldd lists no libraries for $bin (a static binary needs none; refusing to guess)" >&2; exit 1; }
for lib in $libs; do
    install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
install -d -m 0755 "$root/etc"
printf 'root:x:0:0:root:/root:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
chmod 0644 "$root/etc/passwd" "$root/etc/group"
