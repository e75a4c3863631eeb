#!/usr/bin/env bash
# The side-by-side NRI benchmark (README, Benchmark): builds the Go stub on
# containerd/nri offline from Debian (benches/go-stub/build.sh) and the
# shipped nri-qos (`cargo build --release`), then runs nri-qos, the Go stub
# and a bare ping-pong in interleaved rounds (benches/nri_roundtrip.rs), once
# per placement: beside (every process on the peer's CPU), across (the
# subjects on another CPU; needs two) and free (where the scheduler puts
# them).
#
#   scripts/bench-nri.sh [bench arguments]
#
# NRI_BENCH_PLACEMENTS picks others ("beside" alone, say); NRI_BENCH_ROUNDS
# etc. as in benches/nri_roundtrip.rs; NRI_QOS_BIN measures another build.
# Each placement's output is also kept in $NRI_BENCH_OUT/<placement>.txt
# (default target/bench-nri), which scripts/bench-docs.sh renders.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${NRI_BENCH_OUT:-target/bench-nri}"
mkdir -p "$out"
bash benches/go-stub/build.sh
if [ -z "${NRI_QOS_BIN:-}" ]; then
  # The shipped build (release profile, default features), copied so a
  # rebuild during the run cannot change it.
  cargo build --release --locked --bin nri-qos
  cp target/release/nri-qos "$out/nri-qos"
  export NRI_QOS_BIN="$PWD/$out/nri-qos"
fi
export NRI_GO_STUB="${NRI_GO_STUB:-$PWD/target/go-stub/go-stub}"
cargo bench --locked --bench nri_roundtrip --no-run
# Both binaries start from disk, as after a node boots: written back and
# dropped from the page cache (a freshly written copy sits whole in the
# cache, and fault-around then maps more of it).
drop_cache() {
  python3 - "$@" <<'PY'
import os, sys
for path in sys.argv[1:]:
    if os.path.exists(path):
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
PY
}
placements=${NRI_BENCH_PLACEMENTS:-beside across free}
for placement in $placements; do
  if [ "$placement" = across ] && [ "$(nproc)" -lt 2 ]; then
    echo "placement across skipped: one CPU"
    continue
  fi
  drop_cache "$NRI_QOS_BIN" "$NRI_GO_STUB"
  NRI_BENCH_PLACEMENT=$placement cargo bench --locked --bench nri_roundtrip "$@" |
    tee "$out/$placement.txt"
done
