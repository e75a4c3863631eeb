#!/bin/sh
# In-VM measurement of `nri-qos monitor`, run by the e2e guest when
# scripts/bench-pressure.sh boots the VM. Busybox sh; root; cgroup v2. Never
# run it on a shared machine: it creates cgroups under $CGROUP_ROOT and eats
# the node's memory.
#
#   NRI_QOS=/path/nri-qos MEMHOG=/path/memhog tests/e2e/pressure/run.sh OUT
#
# Pod cgroups are made by hand in the systemd layout (no kubelet or runtime
# in the way of the timing), then:
#   1. idle:       the monitor's CPU time over IDLE_S seconds and its RSS
#   2. self-limit: one pod thrashing against its own memory.max: no eviction
#   3. node:       RUNS x a BestEffort hog ramping at RATE MiB/s past the
#                  thresholds next to a Guaranteed and a Burstable pod
# Writes OUT/summary.txt (key=value), OUT/monitor.log (JSON lines),
# OUT/runN-hog.log (memhog progress, epoch ms) and OUT/runN-watch.log (when
# MemAvailable crossed the thresholds); the host turns them into latency
# figures (scripts/bench-pressure.sh).
set -eu

NRI_QOS=${NRI_QOS:?path of nri-qos}
MEMHOG=${MEMHOG:?path of memhog}
OUT=${1:?output directory}
CG=${CGROUP_ROOT:-/sys/fs/cgroup}
IDLE_S=${IDLE_S:-60}
RUNS=${RUNS:-10}
RATE=${RATE:-256} # MiB/s of the hog
HZ=100            # USER_HZ on Linux: /proc/<pid>/stat ticks
KP=$CG/kubepods.slice
TAG=pressure
. "$(dirname "$0")/pressure-lib.sh"
uptime_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
vmstat() { awk -v k="$1" '$1 == k {print $2}' /proc/vmstat; }
put mem_total_kb "$(awk '/^MemTotal/ {print $2}' /proc/meminfo)"

# mkpod CLASS UID [memory.max]: a pod cgroup with one container cgroup "app"
mkpod() {
  p=$(pod_path "$1" "$2")
  mkdir -p "$p"
  enable_memory "$p"
  mkdir -p "$p/app"
  if [ -n "${3:-}" ]; then echo "$3" >"$p/memory.max"; fi
  echo "$p"
}
rmpod() {
  p=$1
  [ -d "$p" ] || return 0
  echo 1 >"$p/cgroup.kill" 2>/dev/null || true
  i=0
  while grep -q 'populated 1' "$p/cgroup.events" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  rmdir "$p/app" "$p" 2>/dev/null || true
}

# --- the monitor -------------------------------------------------------------
cat >"$OUT/monitor.toml" <<EOC
[monitor]
kubepods = "kubepods.slice"
EOC
"$NRI_QOS" monitor --cgroup-root "$CG" --proc-root /proc -c "$OUT/monitor.toml" \
  --log-format json 2>>"$OUT/monitor.log" &
MPID=$!
trap 'kill $MPID 2>/dev/null || true' EXIT INT TERM
sleep 2
kill -0 "$MPID" || { cat "$OUT/monitor.log" >&2; exit 1; }
put psi_targets_armed "$(sed -n 's/.*"psi_targets_armed":\([0-9]*\).*/\1/p' "$OUT/monitor.log" | head -n 1)"

# --- 1. idle -----------------------------------------------------------------
log "idle ${IDLE_S}s"
c0=$(cpu_ticks $MPID)
sleep "$IDLE_S"
c1=$(cpu_ticks $MPID)
put idle_s "$IDLE_S"
put idle_cpu_ticks $((c1 - c0))
put idle_cpu_pct_of_core "$(awk -v t=$((c1 - c0)) -v hz=$HZ -v s="$IDLE_S" 'BEGIN{printf "%.4f", 100 * t / hz / s}')"
put rss_kb "$(status_kb $MPID VmRSS)"
# lock-memory and nice (defaults on): the locked share of RSS, the thread's nice
put locked_kb "$(status_kb $MPID VmLck)"
for t in /proc/$MPID/task/*; do
  if [ "$(cat "$t/comm")" = nri-qos-monitor ]; then
    put monitor_thread_nice "$(awk '{print $19}' "$t/stat")"
  fi
done

# --- 2. one pod at its own limit --------------------------------------------
log "self-limit"
kills0=$(count '"killing pod"')
p=$(mkpod burstable selflimit 128M)
for i in 1 2 3; do
  run_in "$p/app" "$OUT/selflimit-hog.$i.log" "$MEMHOG" 512 0 5
  wait "$LAST_PID" 2>/dev/null || true
done
put selflimit_pod_max_events "$(awk '$1=="max"{print $2}' "$p/memory.events")"
put selflimit_pod_oom_kills "$(awk '$1=="oom_kill"{print $2}' "$p/memory.events")"
put selflimit_evictions $(($(count '"killing pod"') - kills0))
rmpod "$p"

# --- 3. node pressure --------------------------------------------------------
run=1
while [ "$run" -le "$RUNS" ]; do
  sleep 12 # the previous run's pressure state (transition period) ends
  log "node-pressure run $run/$RUNS"
  gp=$(mkpod guaranteed g$run 256M)
  bp=$(mkpod burstable b$run)
  ep=$(mkpod besteffort hog$run)
  run_in "$gp/app" "$OUT/run$run-g.log" "$MEMHOG" 128 0 600
  g_pid=$LAST_PID
  run_in "$bp/app" "$OUT/run$run-b.log" "$MEMHOG" 64 0 600
  b_pid=$LAST_PID
  sleep 1
  avail_kb=$(awk '/^MemAvailable/ {print $2}' /proc/meminfo)
  oom0=$(vmstat oom_kill)
  c0=$(cpu_ticks $MPID)
  t0=$(uptime_ms)
  # An observer outside kubepods: when MemAvailable really drops below the
  # soft (300Mi) and hard (100Mi) thresholds, whatever the monitor saw.
  "$MEMHOG" --watch 307200 102400 >"$OUT/run$run-watch.log" 2>&1 &
  w_pid=$!
  # far more than the node has; timeout in case nothing kills it
  run_in "$ep/app" "$OUT/run$run-hog.log" timeout 120 "$MEMHOG" $((avail_kb / 1024 + 1024)) "$RATE" 600
  wait "$LAST_PID" 2>/dev/null || true
  kill "$w_pid" 2>/dev/null || true
  t1=$(uptime_ms)
  c1=$(cpu_ticks $MPID)
  sleep 2
  put run${run}_avail_at_start_kb "$avail_kb"
  put run${run}_kernel_oom_kills $(($(vmstat oom_kill) - oom0))
  put run${run}_hog_alive_ms $((t1 - t0))
  put run${run}_monitor_cpu_pct_under_pressure "$(awk -v t=$((c1 - c0)) -v hz=$HZ -v ms=$((t1 - t0)) 'BEGIN{ if (ms > 0) printf "%.2f", 100 * t / hz / (ms / 1000); else print "n/a"}')"
  put run${run}_g_alive "$(kill -0 $g_pid 2>/dev/null && echo yes || echo no)"
  put run${run}_b_alive "$(kill -0 $b_pid 2>/dev/null && echo yes || echo no)"
  kill "$g_pid" "$b_pid" 2>/dev/null || true
  for p in "$ep" "$bp" "$gp"; do rmpod "$p"; done
  run=$((run + 1))
done
put rss_hwm_kb "$(status_kb $MPID VmHWM)"
log "done: $SUM"
