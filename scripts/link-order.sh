#!/usr/bin/env bash
# Regenerates link/hot-functions.txt: the functions of the nri-qos binary that
# a plugin run executes, hottest first, which build.rs hands to rust-lld
# (`--symbol-ordering-file`) so they sit together in few 64 KiB windows.
#
#   scripts/link-order.sh BINARY...
#
# Each BINARY (copies of `cargo build --release --bin nri-qos`, of
# `cargo build --profile bench --bin nri-qos` and of the target/release/nri-qos
# that `cargo bench --bench nri_roundtrip --no-run` leaves: the two profiles,
# and a build whose dependencies' features are unified with the
# dev-dependencies', mangle the same functions with different hashes) runs
# under callgrind as the plugin of
# one round of `cargo bench --bench nri_roundtrip` (start, Register,
# Configure, a Synchronize of 1k pods / 3k containers, 10k CreateContainer,
# the metrics endpoint scraped); every function callgrind saw executing in the
# binary is listed, the names of all binaries merged. Needs valgrind.
# NRI_ROUNDTRIP_BENCH=<path>: an already built bench executable to drive.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,17p' "$0"; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind not found" >&2; exit 1; }

# NRI_ROUNDTRIP_BENCH: an already built bench executable (else cargo builds it).
bench=${NRI_ROUNDTRIP_BENCH:-$(cargo bench --bench nri_roundtrip --no-run 2>&1 |
    sed -n 's/.*Executable .*(\(.*nri_roundtrip-[0-9a-f]*\))$/\1/p' | tail -1)}
[ -x "$bench" ] || { echo "no nri_roundtrip bench executable" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for bin in "$@"; do
    bin=$(realpath "$bin")
    # The bench SIGKILLs its plugin; callgrind writes its profile only when
    # the plugin exits, so valgrind runs as a child the kill does not reach,
    # and is stopped with SIGTERM once the bench is done.
    cat >"$work/plugin" <<EOF
#!/bin/sh
valgrind --tool=callgrind --demangle=no --compress-strings=no --compress-pos=no \
    --callgrind-out-file="$work/cg.%p" "$bin" "\$@" <&0 &
echo \$! >>"$work/pids"
wait
EOF
    chmod +x "$work/plugin"
    NRI_QOS_BIN="$work/plugin" NRI_GO_STUB=/nonexistent NRI_BENCH_ROUNDS=1 \
        NRI_BENCH_HOOK_TIME=1 "$bench" --bench >"$work/bench.log" 2>&1 || {
        tail -20 "$work/bench.log" >&2
        exit 1
    }
    while read -r pid; do kill -TERM "$pid" 2>/dev/null || true; done <"$work/pids"
    while read -r pid; do
        while kill -0 "$pid" 2>/dev/null; do sleep 1; done
    done <"$work/pids"
    : >"$work/pids"
done

mkdir -p link
{
    echo "# Functions of the nri-qos binary that a plugin run executes, hottest"
    echo "# first; build.rs passes this file to rust-lld for release links."
    echo "# Made by scripts/link-order.sh (callgrind over one round of"
    echo "# benches/nri_roundtrip.rs) on $(date -u +%F) from $(git rev-parse --short HEAD)."
    python3 scripts/lib/callgrind_functions.py "$@" -- "$work"/cg.*
} >link/hot-functions.txt
echo "link/hot-functions.txt: $(grep -vc '^#' link/hot-functions.txt) functions"
