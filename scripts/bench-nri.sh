#!/usr/bin/env bash
# The side-by-side NRI benchmark (README, Benchmarks): builds the Go stub on
# containerd/nri offline from Debian (benches/go-stub/build.sh), then runs
# nri-qos, the Go stub and a bare ping-pong in interleaved rounds, once per
# placement: free (where the scheduler puts them), beside (every process on
# the peer's CPU) and across (the subjects on another CPU; needs two).
# NRI_BENCH_PLACEMENTS picks others ("beside" alone, say). Extra arguments
# go to the bench; NRI_BENCH_ROUNDS etc. as in benches/nri_roundtrip.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash benches/go-stub/build.sh
placements=${NRI_BENCH_PLACEMENTS:-free beside across}
cargo bench --bench nri_roundtrip --no-run
for placement in $placements; do
  if [ "$placement" = across ] && [ "$(nproc)" -lt 2 ]; then
    echo "placement across skipped: one CPU"
    continue
  fi
  NRI_BENCH_PLACEMENT=$placement cargo bench --bench nri_roundtrip "$@"
done
