#!/usr/bin/env bash
# What a crate would cost nri-qos where we write the thing by hand today
# (README, "Dependencies"): builds tiny scratch binaries with the product's
# release settings (thin LTO, 4 codegen units, stripped), each using one
# choice, and prints their sizes, their RSS after N scrapes of the same
# metric families, and where kube_quantity disagrees with resource.Quantity
# on our quantity tests. Rerun: scripts/crate-costs.sh [scrapes]
# Needs cargo and crates.io; builds in $CRATE_COSTS_DIR (default a temp dir,
# removed at the end unless KEEP=1). Takes ~5-10 min on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
scrapes=${1:-1000}
dir=${CRATE_COSTS_DIR:-$(mktemp -d /tmp/crate-costs.XXXXXX)}
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir"
cp -r "$here/scripts/crate-costs/." "$dir/"
cp "$here/src/qos/quantity.rs" "$dir/src/quantity.rs"
cd "$dir"
cargo build --release --quiet --bins 2>&1 | grep -v '^warning' || true
bin=target/release
kib() { echo $(( $(stat -c %s "$1") / 1024 )); }

echo "== stripped release binaries (KiB), deltas against the hand-written baseline"
base=$(kib $bin/hand)
for b in hand promclient hyper hyperprom; do
  printf '%-11s %6s KiB  %+6d KiB\n' "$b" "$(kib $bin/$b)" $(( $(kib $bin/$b) - base ))
done
qbase=$(kib $bin/quant_ours)
for b in quant_ours quant_kube; do
  printf '%-11s %6s KiB  %+6d KiB\n' "$b" "$(kib $bin/$b)" $(( $(kib $bin/$b) - qbase ))
done

echo "== RSS after $scrapes scrapes (median of 3 runs): VmRSS VmHWM KiB, reply bytes"
for b in hand promclient hyper hyperprom; do
  runs=$(for _ in 1 2 3; do $bin/$b "$scrapes"; done | sort -n)
  printf '%-11s %s\n' "$b" "$(sed -n 2p <<<"$runs")"
done

echo "== kube_quantity against our quantity tests (resource.Quantity semantics)"
$bin/quant_check
