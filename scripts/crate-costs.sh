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
mkdir -p "$dir/src/qos"
cp "$here/src/qos/quantity.rs" "$here/src/qos/pod.rs" "$dir/src/qos/"
cd "$dir"
cargo build --release --quiet --bins
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

pbase=$(kib $bin/pod_ours)
for b in pod_ours pod_openapi; do
  printf '%-11s %6s KiB  %+6d KiB\n' "$b" "$(kib $bin/$b)" $(( $(kib $bin/$b) - pbase ))
done

echo "== RSS after $scrapes scrapes (median of 3 runs): VmRSS VmHWM KiB, reply bytes"
for b in hand promclient hyper hyperprom; do
  runs=$(for _ in 1 2 3; do $bin/$b "$scrapes"; done | sort -n)
  printf '%-11s %s\n' "$b" "$(sed -n 2p <<<"$runs")"
done

echo "== recording cost on the hook path (4 updates per touch)"
$bin/touch_cost

echo "== what the exposition looks like (first lines of one family each)"
for b in hand promclient; do
  echo "-- $b"
  CRATE_COSTS_DUMP=1 $bin/$b 1 2>&1 | grep -A3 'adjustments' | head -4
  CRATE_COSTS_DUMP=1 $bin/$b 1 2>&1 | tail -1
done

echo "== kube_quantity on our quantity unit tests (src/qos/quantity.rs)"
$bin/quant_check

echo "== explain's manifests through k8s-openapi's Pod"
$bin/pod_check

echo "== k8s-cri (the tests' CRI client candidate)"
if ! command -v protoc >/dev/null; then
  echo "k8s-cri's build script runs protoc (tonic-prost-build): not installed, so it cannot build here"
else
  # tonic and prost are what tests/e2e/cri-client already builds; time only k8s-cri on top
  cri=(--release --quiet --manifest-path cri/Cargo.toml --target-dir target)
  cargo build "${cri[@]}" -p tonic -p tonic-prost -p prost
  start=$(date +%s.%N)
  cargo build "${cri[@]}" -p k8s-cri
  end=$(date +%s.%N)
  printf 'k8s-cri build alone: %.0f s (protoc %s); generated Rust: %s lines (hand-written messages and client today: %s lines)\n' \
    "$(awk "BEGIN{print $end - $start}")" "$(protoc --version | cut -d' ' -f2)" \
    "$(cat target/release/build/k8s-cri-*/out/*.rs | wc -l)" "$(wc -l < "$here/tests/e2e/cri-client/cri.rs")"
fi
