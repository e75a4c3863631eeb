#!/usr/bin/env bash
# The memory.high throttle guard on a real kernel: boots the e2e VM (no
# runtime), runs tests/e2e/pressure/throttle.sh with the release
# `nri-qos monitor` and reports the allocator's throughput unthrottled,
# throttled and after the relax, detection -> relax latency, and that a
# 5 s spike is left alone and Guaranteed is never touched.
#
#   scripts/bench-throttle.sh
#
# Under qemu's software emulation the VM is ~10-50x slower than hardware;
# throughput figures are only comparable with each other, within one run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/vm-bench.sh
export E2E_WORK="${E2E_WORK:-$PWD/tests/e2e/work/throttle}"
export E2E_VM_TIMEOUT="${E2E_VM_TIMEOUT:-900}"
mkdir -p "$E2E_WORK"
cargo build --release --locked --bin nri-qos >&2
vm_bench --throttle-bench
console_report bench-throttle "$E2E_WORK/console-2.1-none.log" <<'PY'
import statistics

# the allocators' `churn <ms> <MiB/s>` lines, per pod (file name less .log)
churn = {}
for name, lines in files.items():
    for rest in lines:
        if rest.startswith("churn ") and len(rest.split()) == 3 and "holding" not in rest:
            _, t, rate = rest.split()
            churn.setdefault(name[:-4], []).append((int(t), float(rate)))

detect, relax = {}, {}
for j in monitor:
    f = j.get("fields", {})
    pod = str(f.get("pod", ""))
    if f.get("message", "").startswith("container under memory.high throttle"):
        detect.setdefault(pod, ms(j["timestamp"]))
    elif f.get("message") == "memory.high throttle decision" and f.get("action") == "relax":
        relax.setdefault(pod, ms(j["timestamp"]))

med = lambda v: statistics.median(v) if v else float("nan")
print(f"kernel {summary.get('kernel')}, swap {summary.get('swap_total_kb')} kB")
lat = []
for i in range(1, 10):
    lines = churn.get(f"throttled{i}")
    if not lines:
        break
    pod = f"b{i}"
    r = relax.get(pod)
    before = [x for t, x in lines[1:] if r is None or t < r]
    after = [x for t, x in lines if r is not None and t > r + 2000]
    if r is not None and pod in detect:
        lat.append(r - detect[pod])
    start = lines[0][0]
    # the reference run just before this round (no memory.high, no limit)
    ref = [x for _, x in churn.get(f"reference{i}", [])[2:]]
    print(f"round {i}: reference {med(ref):6.1f} MiB/s, throttled median {med(before):6.1f} MiB/s, after relax {med(after):6.1f} MiB/s "
          f"({100 * med(after) / med(ref):.0f} % of reference); "
          f"detect->relax {'%.0f ms' % (r - detect[pod]) if r and pod in detect else 'n/a'}, "
          f"allocator start->relax {'%.0f ms' % (r - start) if r else 'n/a'}; "
          f"memory.high after {summary.get(f'throttled{i}_memory_high_after')}, "
          f"high events {summary.get(f'throttled{i}_high_events')}, oom kills {summary.get(f'throttled{i}_oom_kills')}")
if lat:
    print(f"detect->relax: max {max(lat):.0f} ms over {len(lat)} rounds (grace period 10 s)")
print(f"spike (5 s): relaxed {'yes' if 's1' in relax else 'no'}, memory.high after {summary.get('spike_memory_high_after')}, "
      f"high events {summary.get('spike_high_events')}")
print(f"relaxes {summary.get('relaxes')}, evictions {summary.get('evictions')}, "
      f"Guaranteed alive {summary.get('guaranteed_alive')} (memory.high {summary.get('guaranteed_memory_high')}), "
      f"BestEffort alive {summary.get('besteffort_alive')}")
PY
