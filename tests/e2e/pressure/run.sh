#!/bin/sh
# In-VM measurement of `nri-qos monitor` (issue 7). Run as root inside the
# test VM (cgroup v2, kernel >= 5.19 for every feature). Never run this on a
# shared machine: it creates cgroups under $CGROUP_ROOT and eats memory.
#
#   NRI_QOS=/path/nri-qos MEMHOG=/path/memhog tests/e2e/pressure/run.sh [OUT]
#
# Builds pod cgroups by hand under kubepods.slice (no kubelet needed), then:
#   1. idle:       monitor CPU over IDLE_S seconds and RSS
#   2. self-limit: one pod thrashing against its own memory.max; must evict nothing
#   3. node:       RUNS x a BestEffort hog ramping at RATE MiB/s past the hard
#                  threshold; records victim, detection->kill latency, kill->empty,
#                  and whether the kernel OOM killer fired (must not)
# Results: $OUT/summary.txt (key=value lines), raw logs next to it.
set -eu

NRI_QOS=${NRI_QOS:-target/release/nri-qos}
MEMHOG=${MEMHOG:-target/release/examples/memhog}
OUT=${1:-/tmp/nri-qos-pressure.$$}
CG=${CGROUP_ROOT:-/sys/fs/cgroup}
IDLE_S=${IDLE_S:-60}
RUNS=${RUNS:-5}
RATE=${RATE:-2048}          # MiB/s of the hog
HARD=${HARD:-100Mi}
SOFT=${SOFT:-300Mi}
KP=$CG/kubepods.slice
mkdir -p "$OUT"
SUM=$OUT/summary.txt
: >"$SUM"

log() { echo "[$(date +%T.%3N)] $*" >&2; }
put() { echo "$1=$2" | tee -a "$SUM"; }
now_ms() { date +%s%3N; }

[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
[ -f "$CG/cgroup.controllers" ] || { echo "$CG is not cgroup v2" >&2; exit 1; }
put kernel "$(uname -r)"
put mem_total_kb "$(awk '/^MemTotal/ {print $2}' /proc/meminfo)"
put swap_total_kb "$(awk '/^SwapTotal/ {print $2}' /proc/meminfo)"
put has_cgroup_kill "$( [ -e "$CG/init.scope/cgroup.kill" ] || [ -e "$CG/system.slice/cgroup.kill" ] && echo yes || echo no)"
put has_memory_reclaim "$( [ -e "$CG/system.slice/memory.reclaim" ] && echo yes || echo no)"
put has_root_memory_stat "$( [ -e "$CG/memory.stat" ] && echo yes || echo no)"

# --- cgroup helpers -------------------------------------------------------
created_kp=no
enable_memory() { grep -qw memory "$1/cgroup.subtree_control" || echo +memory >"$1/cgroup.subtree_control"; }
setup_kubepods() {
  if [ ! -d "$KP" ]; then mkdir "$KP"; created_kp=yes; fi
  enable_memory "$CG"; enable_memory "$KP"
  for q in burstable besteffort; do
    mkdir -p "$KP/kubepods-$q.slice"; enable_memory "$KP/kubepods-$q.slice"
  done
}
# pod_path CLASS UID
pod_path() {
  u=$(echo "$2" | tr - _)
  case $1 in
    guaranteed) echo "$KP/kubepods-pod$u.slice" ;;
    *) echo "$KP/kubepods-$1.slice/kubepods-$1-pod$u.slice" ;;
  esac
}
# mkpod CLASS UID [memory.max] [memory.low of the app container]
mkpod() {
  p=$(pod_path "$1" "$2")
  mkdir -p "$p"; enable_memory "$p"; mkdir -p "$p/app"
  [ -n "${3:-}" ] && echo "$3" >"$p/memory.max"
  [ -n "${4:-}" ] && echo "$4" >"$p/app/memory.low"
  [ -e "$p/memory.swap.max" ] && echo 0 >"$p/memory.swap.max"
  echo "$p"
}
# run_in CGROUP LOGFILE CMD...: start CMD inside CGROUP as a child of this
# shell (so `wait` works); its pid lands in LAST_PID.
run_in() {
  cgp=$1; lf=$2; shift 2
  sh -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$cgp" "$@" >"$lf" 2>&1 &
  LAST_PID=$!
}
rmpod() {
  p=$1
  [ -d "$p" ] || return 0
  [ -e "$p/cgroup.kill" ] && echo 1 >"$p/cgroup.kill" 2>/dev/null || true
  i=0; while grep -q 'populated 1' "$p/cgroup.events" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
  rmdir "$p/app" "$p" 2>/dev/null || true
}
cleanup() {
  [ -n "${MPID:-}" ] && kill "$MPID" 2>/dev/null || true
  find "$KP" -mindepth 1 -maxdepth 2 -type d -name '*-pode2e*' 2>/dev/null | while read -r p; do rmpod "$p"; done
  if [ "$created_kp" = yes ]; then
    rmdir "$KP"/kubepods-*.slice "$KP" 2>/dev/null || true
  fi
}
trap cleanup EXIT INT TERM

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
vmstat() { awk -v k="$1" '$1 == k {print $2}' /proc/vmstat; }
# Node available the monitor's way: MemTotal - (anon + file - inactive_file).
node_avail_mib() {
  total=$(awk '/^MemTotal/ {print $2 * 1024}' /proc/meminfo)
  if [ -e "$CG/memory.stat" ]; then
    ws=$(awk '$1=="anon"{a=$2} $1=="file"{f=$2} $1=="inactive_file"{i=$2} END{print a+f-i}' "$CG/memory.stat")
  else
    ws=$(( total - $(awk '/^MemFree/{print $2*1024}' /proc/meminfo) - $(awk '/^Inactive\(file\)/{print $2*1024}' /proc/meminfo) ))
  fi
  echo $(( (total - ws) / 1048576 ))
}
# json_field FIELD < lines: value of "FIELD":<value> in tracing JSON lines
json_field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p"; }

# --- start ----------------------------------------------------------------
setup_kubepods
cat >"$OUT/monitor.toml" <<EOC
[monitor]
hard-threshold = "$HARD"
soft-threshold = "$SOFT"
EOC
log "starting monitor"
RUST_LOG=${RUST_LOG:-info} "$NRI_QOS" monitor --cgroup-root "$CG" --proc-root /proc \
  -c "$OUT/monitor.toml" --log-format json 2>"$OUT/monitor.log" &
MPID=$!
sleep 2
kill -0 "$MPID" || { cat "$OUT/monitor.log"; exit 1; }
put psi_armed "$(grep -c 'psi triggers armed' "$OUT/monitor.log" || true)"

# --- 1. idle --------------------------------------------------------------
log "idle ${IDLE_S}s"
hz=$(getconf CLK_TCK)
c0=$(cpu_ticks $MPID); sleep "$IDLE_S"; c1=$(cpu_ticks $MPID)
put idle_cpu_ms $(( (c1 - c0) * 1000 / hz ))
put idle_cpu_pct_of_core "$(awk -v t=$((c1 - c0)) -v hz=$hz -v s=$IDLE_S 'BEGIN{printf "%.4f", 100 * t / hz / s}')"
put rss_kb "$(status_kb $MPID VmRSS)"
put rss_hwm_kb "$(status_kb $MPID VmHWM)"

# --- 2. one pod at its own limit -----------------------------------------
log "self-limit scenario"
kills0=$(grep -c '"killing pod"' "$OUT/monitor.log" || true)
p=$(mkpod burstable e2e-selflimit 128M 64M)
# Anon hog: the kernel OOM-kills it inside its own cgroup, repeatedly.
for i in 1 2 3; do
  run_in "$p/app" "$OUT/selflimit-hog.$i.log" "$MEMHOG" 512 0 5
  wait "$LAST_PID" 2>/dev/null || true
done
# Page-cache thrash: re-read a file 4x the limit for 20 s.
dd if=/dev/urandom of=/var/tmp/e2e-thrash bs=1M count=512 status=none
run_in "$p/app" "$OUT/selflimit-thrash.log" sh -c 'end=$(($(date +%s)+20)); while [ $(date +%s) -lt $end ]; do cat /var/tmp/e2e-thrash >/dev/null; done'
wait "$LAST_PID" 2>/dev/null || true
rm -f /var/tmp/e2e-thrash
put selflimit_pod_max_events "$(awk '$1=="max"{print $2}' "$p/app/memory.events.local")"
put selflimit_pod_oom_kills "$(awk '$1=="oom_kill"{print $2}' "$p/app/memory.events.local")"
put selflimit_kubepods_psi "$(head -1 "$KP/memory.pressure" | tr ' ' ',')"
put selflimit_not_acting_logs "$(grep -c 'without node shortage' "$OUT/monitor.log" || true)"
put selflimit_evictions $(( $(grep -c '"killing pod"' "$OUT/monitor.log" || true) - kills0 ))
rmpod "$p"

# --- 3. node pressure -----------------------------------------------------
run=1
while [ $run -le "$RUNS" ]; do
  log "node-pressure run $run/$RUNS"
  sleep 12   # let the previous run's pressure state and cooldown end
  gp=$(mkpod guaranteed e2e-g$run 256M)
  bp=$(mkpod burstable e2e-b$run "" 256M)
  ep=$(mkpod besteffort e2e-hog$run)
  run_in "$gp/app" "$OUT/run$run-g.log" "$MEMHOG" 128 0 600; g_pid=$LAST_PID
  run_in "$bp/app" "$OUT/run$run-b.log" "$MEMHOG" 64 0 600; b_pid=$LAST_PID
  sleep 1
  avail=$(node_avail_mib)
  hard_mib=$(echo "$HARD" | sed 's/Mi$//')
  target=$(( avail + 1024 ))           # more than the node has
  oom0=$(vmstat oom_kill)
  lines0=$(wc -l <"$OUT/monitor.log")
  c0=$(cpu_ticks $MPID); t0=$(now_ms)
  # timeout: with swap the hog may survive; do not hang the harness.
  run_in "$ep/app" "$OUT/run$run-hog.log" timeout 120 "$MEMHOG" "$target" "$RATE" 600
  wait "$LAST_PID" 2>/dev/null || true
  t1=$(now_ms); c1=$(cpu_ticks $MPID)
  sleep 2
  oom1=$(vmstat oom_kill)
  tail -n +"$((lines0 + 1))" "$OUT/monitor.log" >"$OUT/run$run-monitor.log"
  kline=$(grep '"killing pod"' "$OUT/run$run-monitor.log" | head -1 || true)
  dline=$(grep '"killed pod"' "$OUT/run$run-monitor.log" | head -1 || true)
  eline=$(grep 'cgroup is empty' "$OUT/run$run-monitor.log" | head -1 || true)
  victim=$(echo "$kline" | json_field victim)
  kill_ts=$(echo "$kline" | json_field timestamp)
  kill_ms=$( [ -n "$kill_ts" ] && date -d "$kill_ts" +%s%3N || echo 0)
  # When the hog crossed the hard threshold: first progress line with
  # touched MiB >= available-at-start - hard threshold.
  cross_ms=$(awk -v need=$((avail - hard_mib)) '$1=="memhog" && $3+0 >= need {print $2; exit}' "$OUT/run$run-hog.log")
  put run${run}_victim "${victim:-none}"
  put run${run}_victim_ok "$( [ "$victim" = "e2e-hog$run" ] && echo yes || echo no)"
  put run${run}_kernel_oom_kills $((oom1 - oom0))
  put run${run}_hog_mib_at_death "$(awk '$1=="memhog" && $3 ~ /^[0-9]+$/ {m=$3} END{print m+0}' "$OUT/run$run-hog.log")"
  put run${run}_avail_at_start_mib "$avail"
  put run${run}_cross_to_kill_ms "$( [ -n "$cross_ms" ] && [ "$kill_ms" -gt 0 ] && echo $((kill_ms - cross_ms)) || echo n/a)"
  put run${run}_met_to_kill_ms "$(echo "$dline" | json_field met_to_kill_ms)"
  put run${run}_wake_to_kill_us "$(echo "$dline" | json_field wake_to_kill_us)"
  put run${run}_kill_method "$(echo "$dline" | json_field method)"
  put run${run}_wake "$(echo "$dline" | json_field wake)"
  put run${run}_kill_to_empty_ms "$(echo "$eline" | json_field took_ms)"
  put run${run}_start_to_hog_exit_ms $((t1 - t0))
  put run${run}_monitor_cpu_pct_under_pressure "$(awk -v t=$((c1 - c0)) -v hz=$hz -v ms=$((t1 - t0)) 'BEGIN{ if (ms > 0) printf "%.2f", 100 * t / hz / (ms / 1000); else print "n/a"}')"
  put run${run}_evictions "$(grep -c '"killed pod"' "$OUT/run$run-monitor.log" || true)"
  kill "$g_pid" "$b_pid" 2>/dev/null || true
  for p in "$ep" "$bp" "$gp"; do rmpod "$p"; done
  run=$((run + 1))
done
put rss_hwm_kb_end "$(status_kb $MPID VmHWM)"
log "done: $SUM"
