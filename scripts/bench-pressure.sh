#!/usr/bin/env bash
# The node pressure monitor on a real kernel: boots the e2e VM (no runtime),
# runs tests/e2e/pressure/run.sh with the release `nri-qos monitor` and
# reports detection-to-kill latency, kill-to-free time, kernel OOM kills,
# idle CPU and RSS.
#
#   scripts/bench-pressure.sh [--runs 10] [--rate 256] [--idle 60] [--native-only]
#
# --native-only skips the VM and measures only the idle cost on this
# machine's own CPU: the plugin process as shipped (throttle guard and
# pressure monitor on) and with each of them off, on fake 110-pod trees in a
# temp directory, in about --idle s.
#
# rate: MiB/s the BestEffort hog allocates (each run ramps it past the
# thresholds). Under qemu's software emulation the VM is ~10-50x slower than
# hardware, so latencies here are upper bounds.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/vm-bench.sh
runs=10 rate=256 idle=60 vm=1
while [ $# -gt 0 ]; do
  case "$1" in
  --runs) runs="$2"; shift 2 ;;
  --rate) rate="$2"; shift 2 ;;
  --idle) idle="$2"; shift 2 ;;
  --native-only) vm=0; shift ;;
  *) echo "usage: $0 [--runs N] [--rate MiB/s] [--idle s] [--native-only]" >&2; exit 2 ;;
  esac
done
export E2E_WORK="${E2E_WORK:-$PWD/tests/e2e/work/bench}"
export E2E_BENCH_RUNS="$runs" E2E_BENCH_RATE="$rate" E2E_BENCH_IDLE_S="$idle"
export E2E_VM_TIMEOUT=$((300 + idle + runs * 60))
mkdir -p "$E2E_WORK"
cargo build --release --locked --bin nri-qos >&2
if [ "$vm" = 1 ]; then
vm_bench --pressure-bench
console_report bench-pressure "$E2E_WORK/console-2.1-none.log" <<'PY'
import re, statistics

def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]

runs = len([k for k in summary if re.fullmatch(r"run\d+_kernel_oom_kills", k)])
kill_at, wake_to_kill, met_to_kill, kill_to_empty, cross_to_kill, kill_call = {}, [], [], [], [], []
victims, oom = [], 0
for j in monitor:
    f = j.get("fields", {})
    msg, victim = f.get("message", ""), str(f.get("victim", ""))
    # pods are named hog<run>, g<run>, b<run>: the first kill of a run counts
    run = int(re.sub(r"\D", "", victim) or 0)
    if msg == "killing pod" and run not in kill_at:
        kill_at[run] = ms(j["timestamp"])
        victims.append(victim)
    elif msg == "killed pod" and run in kill_at and len(wake_to_kill) < len(kill_at):
        wake_to_kill.append(f.get("wake_to_kill_us", 0) / 1000)
        met_to_kill.append(f.get("met_to_kill_ms", 0))
        kill_call.append(f.get("kill_us", 0) / 1000)
    elif msg == "victim pod cgroup is empty" and len(kill_to_empty) < len(kill_at):
        kill_to_empty.append(f.get("took_ms", 0))
victims_ok = sum(v.startswith("hog") for v in victims)
killed_first = 0  # killed before MemAvailable reached the hard threshold
for r in range(1, runs + 1):
    oom += int(summary.get(f"run{r}_kernel_oom_kills", 0) or 0)
    # `memhog --watch` (every 10 ms, outside kubepods): when MemAvailable
    # really dropped below the hard threshold (100Mi = 102400 kB)
    crossed = next((int(l.split()[1]) for l in files.get(f"run{r}-watch.log", [])
                    if l.startswith("watch ") and l.split()[3] == "102400"), None)
    if r not in kill_at:
        continue
    if crossed is None or crossed > kill_at[r]:
        killed_first += 1
    else:
        cross_to_kill.append(kill_at[r] - crossed)

def show(name, v, unit="ms"):
    if v:
        print(f"{name:34} p50 {pct(v, 50):8.1f} {unit}  p99 {pct(v, 99):8.1f} {unit}  max {max(v):8.1f} {unit}  (n={len(v)})")
print(f"kernel {summary.get('kernel')}, MemTotal {summary.get('mem_total_kb')} kB, swap {summary.get('swap_total_kb')} kB")
show("MemAvailable < hard -> kill issued", cross_to_kill)
print(f"killed before MemAvailable fell below the hard threshold: {killed_first}/{len(kill_at)} "
      "(soft-threshold kills after the grace period)")
show("wake-up -> kill issued", wake_to_kill)
show("threshold first met -> kill", met_to_kill)
show("cgroup.kill + process_mrelease", kill_call)
show("kill -> pod cgroup empty", kill_to_empty)
print(f"victim was the BestEffort hog:    {victims_ok}/{runs} ({', '.join(victims)})")
print(f"Guaranteed / Burstable survived:   {sum(summary.get(f'run{r}_g_alive') == 'yes' and summary.get(f'run{r}_b_alive') == 'yes' for r in range(1, runs + 1))}/{runs}")
print(f"kernel OOM kills:                  {oom} over {runs} runs")
print(f"self-limit pod: evictions {summary.get('selflimit_evictions')}, its own OOM kills {summary.get('selflimit_pod_oom_kills')}")
print(f"idle: {summary.get('idle_cpu_pct_of_core')} % of one core over {summary.get('idle_s')} s; RSS {summary.get('rss_kb')} kB, peak {summary.get('rss_hwm_kb')} kB")
print(f"lock-memory: VmLck {summary.get('locked_kb')} kB (whole mappings, resident only as touched: see RSS); "
      f"monitor thread nice {summary.get('monitor_thread_nice')}")
PY
fi

# Idle cost on this machine's own CPU (no emulation): the plugin process
# (`nri-qos run`, external, its socket absent: it retries connecting every
# 5 s, otherwise idle as between NRI calls) on fake 110-pod trees (temp dirs
# shaped like cgroup v2 and procfs; no PSI triggers, nothing of the host's
# cgroups is touched) with 1.3 GiB and 8 GiB of a 16 GiB node free, for $idle
# s each: as shipped (throttle guard and pressure monitor on), and with one,
# the other and both off, so each one's cost is the difference.
tmp="$(mktemp -d)"
trap 'kill $(cat "$tmp"/*.pid 2>/dev/null) 2>/dev/null || true; rm -rf "$tmp"' EXIT
variants="default guard-only monitor-only plugin-only"
conf() { # variant free
  printf '[node]\ncgroup-root = "%s"\nproc-root = "%s"\n' "$tmp/t$2/cgroup" "$tmp/t$2/proc"
  case $1 in
  guard-only) printf '[plugin]\nwith-monitor = false\n' ;;
  monitor-only) printf '[throttle]\nenabled = false\nunguarded-memory-high = "accept"\n' ;;
  plugin-only) printf '[plugin]\nwith-monitor = false\n[throttle]\nenabled = false\nunguarded-memory-high = "accept"\n' ;;
  esac
}
for free in 1300 8192; do
  bash tests/e2e/pressure/fake-tree.sh "$tmp/t$free" "$free" 106 >/dev/null
  echo "cpu memory pids" >"$tmp/t$free/cgroup/cgroup.controllers"
  for v in $variants; do
    conf "$v" "$free" >"$tmp/$v-$free.toml"
    target/release/nri-qos run --config "$tmp/$v-$free.toml" --socket "$tmp/no-runtime.sock" 2>/dev/null &
    echo $! >"$tmp/$v-$free.pid"
  done
done
sleep 3
# CPU time of every thread in ns (schedstat), finer than the 10 ms ticks of stat.
cpu_ns() { cat /proc/"$(cat "$tmp/$1.pid")"/task/*/schedstat | awk '{ s += $1 } END { print s }'; }
for f in "$tmp"/*.pid; do r=$(basename "$f" .pid); eval "a_${r//-/_}=$(cpu_ns "$r")"; done
sleep "$idle"
for free in 1300 8192; do
  for v in $variants; do
    r="$v-$free"
    eval "a=\$a_${r//-/_}"
    t=$(($(cpu_ns "$r") - a))
    st="/proc/$(cat "$tmp/$r.pid")/status"
    awk -v t="$t" -v s="$idle" -v f="$free" -v v="$v" '
      /^VmRSS/ { rss = $2 } /^RssAnon/ { anon = $2 } /^VmHWM/ { hwm = $2 }
      END { printf "native idle, 110 pods, %5d MiB free of 16 GiB, %-12s: %.4f %% of one core over %d s (%.1f ms CPU), RSS %d kB (RssAnon %d kB), peak %d kB\n", f, v, t / s / 1e7, s, t / 1e6, rss, anon, hwm }' "$st"
  done
done
