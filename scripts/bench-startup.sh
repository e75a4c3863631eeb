#!/usr/bin/env bash
# Startup overhead of nri-qos on the real runtime: RunPodSandbox +
# CreateContainer + StartContainer for N pods without and N pods with the
# plugin (external mode, monitor on), in alternating rounds inside one VM.
#
#   scripts/bench-startup.sh [--containerd 2.1|1.7] [--pods 20] [--rounds 4]
#
# Prints per-pod mean and median for both arms, the ratio, and a 95 % interval
# of the difference: under qemu's software emulation a pod takes seconds and
# varies by about 20 %, so 20 pods per arm resolve only about +-10 %.
set -euo pipefail
cd "$(dirname "$0")/.."
containerd=2.1 pods=20 rounds=4
while [ $# -gt 0 ]; do
  case "$1" in
  --containerd) containerd="$2"; shift 2 ;;
  --pods) pods="$2"; shift 2 ;;
  --rounds) rounds="$2"; shift 2 ;;
  *) echo "usage: $0 [--containerd 2.1|1.7] [--pods N] [--rounds R]" >&2; exit 2 ;;
  esac
done
export E2E_WORK="${E2E_WORK:-$PWD/tests/e2e/work/bench}" E2E_OVERHEAD_ROUNDS="$rounds"
mkdir -p "$E2E_WORK"
bash tests/e2e/fetch.sh >&2
cargo build --locked --bins --examples >&2
bash tests/e2e/run.sh --containerd "$containerd" --plugin external --scenario "" \
  --timing-pods 0 --overhead-pods "$pods" >&2
python3 - "$E2E_WORK/console-$containerd-external.log" "$containerd" <<'PY'
import json, statistics, sys
per = {"with": [], "without": []}
cpu_ns = cpu_pods = 0
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("E2E-TIMING "):
        t = json.loads(line.split(" ", 1)[1])
        if t.get("label") in per:
            per[t["label"]] += t["per_pod_ms"]
        elif t.get("label") == "plugin_cpu":
            cpu_ns += t["cpu_ns"]
            cpu_pods += t["pods"]
if not per["with"] or not per["without"]:
    sys.exit("bench-startup: no timing lines in " + sys.argv[1])
for k in ("without", "with"):
    v = per[k]
    print(f"{k:8} nri-qos: {len(v)} pods, mean {statistics.mean(v):.0f} ms, median {statistics.median(v):.0f} ms, "
          f"min {min(v)} ms, max {max(v)} ms")
m0, m1 = statistics.mean(per["without"]), statistics.mean(per["with"])
d0, d1 = statistics.median(per["without"]), statistics.median(per["with"])
# Pods under emulation vary by seconds, so say how sure the difference is:
# Welch's 95 % interval (normal approximation) of the mean difference.
se = (statistics.variance(per["with"]) / len(per["with"])
      + statistics.variance(per["without"]) / len(per["without"])) ** 0.5
lo, hi = (m1 - m0 - 1.96 * se) / m0, (m1 - m0 + 1.96 * se) / m0
print(f"containerd {sys.argv[2]}: with/without = {m1 / m0:.3f} (mean), {d1 / d0:.3f} (median); "
      f"95 % interval of the mean difference: {lo:+.1%} .. {hi:+.1%}")
if cpu_pods:
    per_pod = cpu_ns / cpu_pods / 1e6
    print(f"nri-qos CPU time per pod (start and cleanup, all its threads): {per_pod:.1f} ms "
          f"= {per_pod / m1:.2%} of a pod start")
PY
