#!/bin/sh
# In-VM measurement of the monitor's memory.high throttle guard,
# run by the e2e guest when scripts/bench-throttle.sh boots the VM. Busybox
# sh; root; cgroup v2; no swap. Never run it on a shared machine: it creates
# cgroups under $CGROUP_ROOT.
#
#   NRI_QOS=/path/nri-qos MEMHOG=/path/memhog tests/e2e/pressure/throttle.sh OUT
#
# Pod cgroups are made by hand in the systemd layout; `nri-qos monitor` runs
# alone, so a relax writes the cgroup file (with the plugin it goes through
# NRI UpdateContainers). One allocator at a time (two share the emulated
# CPUs and hide the throttling):
#   1. reference (before each round): `memhog --churn 240` with no
#      memory.high and no limit
#   2. throttled (ROUNDS times): the same in a Burstable container with memory.max 256Mi and
#      memory.high 236Mi (request 64Mi, factor 0.9), beside a Guaranteed and
#      a BestEffort pod; the guard should relax it after the grace period
#   3. spike: 5 s of the same allocator (shorter than the grace): no relax
# Writes OUT/summary.txt (key=value), OUT/monitor.log (JSON lines) and
# OUT/<phase>.log (memhog churn lines: `churn <epoch_ms> <MiB/s>`).
set -eu

NRI_QOS=${NRI_QOS:?path of nri-qos}
MEMHOG=${MEMHOG:?path of memhog}
OUT=${1:?output directory}
CG=${CGROUP_ROOT:-/sys/fs/cgroup}
REF_S=${REF_S:-15}
THROTTLED_S=${THROTTLED_S:-30}
ROUNDS=${ROUNDS:-3}
KP=$CG/kubepods.slice
HIGH=247463936 # 64Mi + 0.9 * (256Mi - 64Mi), what the policy sets
MAX=268435456
TAG=throttle
. "$(dirname "$0")/pressure-lib.sh"
# mkpod CLASS UID: a pod cgroup with one container cgroup named like
# containerd's systemd scopes
mkpod() {
  p=$(pod_path "$1" "$2")
  mkdir -p "$p"
  enable_memory "$p"
  mkdir -p "$p/cri-containerd-$2.scope"
  echo "$p/cri-containerd-$2.scope"
}

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

# Neighbours: a Guaranteed pod at its limit's edge and a BestEffort pod.
g=$(mkpod guaranteed g1)
echo $MAX >"$g/memory.max"
echo $MAX >"$(dirname "$g")/memory.max"
run_in "$g" "$OUT/g.log" "$MEMHOG" 200 0 3600
g_pid=$LAST_PID
e=$(mkpod besteffort e1)
run_in "$e" "$OUT/e.log" "$MEMHOG" 64 0 3600
e_pid=$LAST_PID

# 2. throttled, then relaxed by the guard; ROUNDS fresh pods.
i=1
while [ "$i" -le "$ROUNDS" ]; do
  # The reference right before each round: the emulated CPU's speed varies
  # with what else runs on the host.
  log "reference $i/$ROUNDS ${REF_S}s"
  ref=$(mkpod burstable ref$i)
  run_in "$ref" "$OUT/reference$i.log" "$MEMHOG" --churn 240 "$REF_S"
  wait "$LAST_PID" || true
  log "throttled round $i/$ROUNDS ${THROTTLED_S}s"
  b=$(mkpod burstable b$i)
  echo $MAX >"$b/memory.max"
  echo $HIGH >"$b/memory.high"
  run_in "$b" "$OUT/throttled$i.log" "$MEMHOG" --churn 240 "$THROTTLED_S"
  wait "$LAST_PID" || true
  put throttled${i}_memory_high_after "$(cat "$b/memory.high")"
  put throttled${i}_high_events "$(awk '$1=="high"{print $2}' "$b/memory.events")"
  put throttled${i}_oom_kills "$(awk '$1=="oom_kill"{print $2}' "$b/memory.events")"
  i=$((i + 1))
  sleep 2
done

# 3. a 5 s spike above memory.high: never relaxed.
sleep 12
log "spike 5s"
s=$(mkpod burstable s1)
echo $MAX >"$s/memory.max"
echo $HIGH >"$s/memory.high"
run_in "$s" "$OUT/spike.log" "$MEMHOG" --churn 240 5
wait "$LAST_PID" || true
sleep 15 # past the grace period
put spike_memory_high_after "$(cat "$s/memory.high")"
put spike_high_events "$(awk '$1=="high"{print $2}' "$s/memory.events")"

put relaxes "$(count '"action":"relax"')"
put evictions "$(count 'killing pod')"
put guaranteed_alive "$(kill -0 $g_pid 2>/dev/null && echo yes || echo no)"
put besteffort_alive "$(kill -0 $e_pid 2>/dev/null && echo yes || echo no)"
put guaranteed_memory_high "$(cat "$g/memory.high")"
kill "$g_pid" "$e_pid" 2>/dev/null || true
log "done: $SUM"
