#!/usr/bin/env bash
# Runs the benchmarks docs/benchmarks.md reports and rewrites its generated
# tables (and the README's one table) from their output.
#
#   scripts/bench-docs.sh [--vm] [--kube] [--only a,b] [--render-only]
#
# Each benchmark's output is kept in target/bench-docs/NAME.txt, with the
# command, the commit and the machine's load in NAME.meta;
# scripts/lib/bench_docs.py renders the blocks between
# `<!-- bench:NAME begin -->` and `<!-- bench:NAME end -->` from there, so
# --render-only redoes the documents without running anything. A block whose
# benchmark was not run keeps its figures. Native benchmarks always run (about
# 15-30 min on 2 cores, most of it the release builds); --vm adds the qemu
# ones (pressure, throttle, startup: another 30-60 min under emulation),
# --kube the API-source one (needs kube-apiserver, see tests/kube/fetch.sh).
#
# Run it on a quiet machine: the figures are only as good as the load allows,
# and each block says what the load was.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/bench-docs
vm=0 kube=0 only="" render_only=0
while [ $# -gt 0 ]; do
  case "$1" in
  --vm) vm=1; shift ;;
  --kube) kube=1; shift ;;
  --only) only="$2"; shift 2 ;;
  --render-only) render_only=1; shift ;;
  *) echo "usage: $0 [--vm] [--kube] [--only a,b] [--render-only]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"

wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

# run NAME COMMAND...: runs the command, keeps its stdout and stderr in
# $out/NAME.txt and what produced it in $out/NAME.meta ($DESC, when set,
# says what a shell function runs).
run() {
  local name="$1"; shift
  wanted "$name" || return 0
  echo "=== $name: $*" >&2
  {
    echo "command: ${DESC:-$*}"
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src benches tests Cargo.toml Cargo.lock build.rs || echo ' (with local changes)')"
    echo "machine: $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n1)), kernel $(uname -r)"
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg) at start"
  } >"$out/$name.meta.tmp"
  if "$@" >"$out/$name.txt.tmp" 2>&1; then
    mv "$out/$name.txt.tmp" "$out/$name.txt"
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg) at end" >>"$out/$name.meta.tmp"
    mv "$out/$name.meta.tmp" "$out/$name.meta"
  else
    echo "bench-docs: $name failed; its block keeps its figures. Output: $out/$name.txt.failed" >&2
    mv "$out/$name.txt.tmp" "$out/$name.txt.failed"
    rm -f "$out/$name.meta.tmp"
  fi
}

if [ "$render_only" = 0 ]; then
  # The shipped build, copied, for every benchmark that runs the binary.
  cargo build --release --locked --bin nri-qos
  cp target/release/nri-qos "$out/nri-qos"
  export NRI_QOS_BIN="$PWD/$out/nri-qos"
  cargo bench --locked --no-run

  # nri_roundtrip: the README's table (beside) and the other placements.
  for p in beside across free; do
    DESC="NRI_BENCH_PLACEMENTS=$p scripts/bench-nri.sh" \
      run "nri-$p" env NRI_BENCH_PLACEMENTS=$p NRI_BENCH_OUT="$out/nri-raw" scripts/bench-nri.sh
  done
  # The Synchronize with the ownership reads and without them, and as
  # containerd 2.2 reports containers (the CRI's unified map shown).
  printf '[policy]\nkubelet-memory-qos = "none"\n' >"$out/memory-qos-none.toml"
  sync_variants() {
    local common=(NRI_BENCH_PLACEMENT=beside NRI_GO_STUB=/nonexistent NRI_BENCH_ROUNDS=3)
    echo "### variant: default"
    env "${common[@]}" cargo bench --locked --bench nri_roundtrip
    echo "### variant: NRI_BENCH_UNIFIED=shown"
    env "${common[@]}" NRI_BENCH_UNIFIED=shown cargo bench --locked --bench nri_roundtrip
    echo "### variant: kubelet-memory-qos = \"none\""
    env "${common[@]}" NRI_QOS_CONFIG="$PWD/$out/memory-qos-none.toml" cargo bench --locked --bench nri_roundtrip
  }
  DESC='NRI_BENCH_PLACEMENT=beside NRI_BENCH_ROUNDS=3 cargo bench --bench nri_roundtrip, as is, with NRI_BENCH_UNIFIED=shown, and with NRI_QOS_CONFIG=<file: [policy] kubelet-memory-qos = "none">' \
    run nri-sync sync_variants
  # The build without the Kubernetes API client beside the default one.
  nokube() {
    cargo build --release --locked --no-default-features --bin nri-qos
    cp target/release/nri-qos "$out/nri-qos-nokube"
    # Put the default build back where later steps expect it.
    cargo build --release --locked --bin nri-qos
    local common=(NRI_BENCH_PLACEMENT=beside NRI_GO_STUB=/nonexistent NRI_BENCH_ROUNDS=3)
    echo "### variant: default features"
    env "${common[@]}" NRI_QOS_BIN="$PWD/$out/nri-qos" cargo bench --locked --bench nri_roundtrip
    echo "### variant: --no-default-features"
    env "${common[@]}" NRI_QOS_BIN="$PWD/$out/nri-qos-nokube" cargo bench --locked --bench nri_roundtrip
  }
  DESC='NRI_BENCH_PLACEMENT=beside NRI_BENCH_ROUNDS=3 NRI_QOS_BIN=<copy> cargo bench --bench nri_roundtrip, the copy of cargo build --release, then of cargo build --release --no-default-features' \
    run nri-nokube nokube
  run nri-hops cargo bench --locked --bench nri_hops
  run nri-soak env NRI_HOPS_SOAK=1000000 cargo bench --locked --bench nri_hops
  DESC='NRI_QOS_BIN=<cargo build --release --bin nri-qos> cargo test --locked --test wire_bounds -- --nocapture --test-threads 1' \
    run wire-bounds cargo test --locked --test wire_bounds -- --nocapture --test-threads 1
  run metrics-starvation cargo bench --locked --bench metrics_starvation
  run pressure-step cargo bench --locked --bench pressure_step
  run cgroup-reads cargo bench --locked --bench cgroup_reads
  if [ "$vm" = 1 ]; then
    # Its native part (the idle cost) runs after the VM part.
    run pressure scripts/bench-pressure.sh
    run throttle scripts/bench-throttle.sh
    run startup scripts/bench-startup.sh
  else
    run monitor-idle scripts/bench-pressure.sh --native-only
  fi
  if [ "$kube" = 1 ]; then
    run kube scripts/bench-kube.sh
  fi
fi

python3 scripts/lib/bench_docs.py "$out" docs/benchmarks.md README.md
