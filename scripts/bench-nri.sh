#!/usr/bin/env bash
# The side-by-side NRI benchmark (README, Benchmarks): builds the Go stub on
# containerd/nri offline from Debian (benches/go-stub/build.sh), then runs
# nri-qos, the Go stub and a bare ping-pong in interleaved rounds.
# Extra arguments go to the bench; NRI_BENCH_ROUNDS etc. as in
# benches/nri_roundtrip.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash benches/go-stub/build.sh
cargo bench --bench nri_roundtrip "$@"
