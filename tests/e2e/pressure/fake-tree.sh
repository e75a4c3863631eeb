#!/bin/sh
# Builds a fake cgroup v2 + procfs tree for smoke-testing `nri-qos monitor`
# without a VM. Writes only below $1.
#   fake-tree.sh DIR [available_MiB]
# then: nri-qos monitor --cgroup-root DIR/cgroup --proc-root DIR/proc --once
set -eu
dir=${1:?usage: fake-tree.sh DIR [available_MiB]}
avail_mib=${2:-4096}
extra_pods=${3:-0}
total_kb=$((16 * 1024 * 1024))
ws=$(( (total_kb - avail_mib * 1024) * 1024 ))
cg=$dir/cgroup
kp=$cg/kubepods.slice
mkdir -p "$dir/proc/pressure" "$kp"
cat >"$dir/proc/meminfo" <<EOM
MemTotal:       $total_kb kB
MemFree:        $((avail_mib * 1024)) kB
MemAvailable:   $((avail_mib * 1024)) kB
Inactive(file): 0 kB
EOM
psi='some avg10=0.00 avg60=0.00 avg300=0.00 total=0
full avg10=0.00 avg60=0.00 avg300=0.00 total=0'
echo "$psi" >"$dir/proc/pressure/memory"
echo "$psi" >"$kp/memory.pressure"
events='low 0
high 0
max 0
oom 0
oom_kill 0'
for q in burstable besteffort; do
  mkdir -p "$kp/kubepods-$q.slice"
  echo "$events" >"$kp/kubepods-$q.slice/memory.events"
  echo "$psi" >"$kp/kubepods-$q.slice/memory.pressure"
done
printf 'anon %s\nfile 0\ninactive_file 0\n' "$ws" >"$cg/memory.stat"
pid=40000
# pod CLASS UID WS_MiB REQUEST_MiB COMM
pod() {
  uid_=$(echo "$2" | tr - _)
  case $1 in
    guaranteed) p=$kp/kubepods-pod$uid_.slice ;;
    *) p=$kp/kubepods-$1.slice/kubepods-$1-pod$uid_.slice ;;
  esac
  mkdir -p "$p/pause" "$p/app"
  echo $(( ($3 + 10) * 1048576 )) >"$p/memory.current"
  printf 'anon %s\nfile 10485760\ninactive_file 10485760\n' $(( $3 * 1048576 )) >"$p/memory.stat"
  echo max >"$p/memory.max"; echo max >"$p/memory.high"; echo 0 >"$p/memory.min"
  printf 'populated 1\nfrozen 0\n' >"$p/cgroup.events"
  : >"$p/cgroup.kill"; : >"$p/memory.reclaim"; : >"$p/cgroup.procs"
  printf 'low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n' >"$p/memory.events.local"
  echo "$events" >"$p/memory.events"; echo "$psi" >"$p/memory.pressure"
  for c in pause app; do
    pid=$((pid + 1))
    mkdir -p "$dir/proc/$pid"
    echo "$pid" >"$p/$c/cgroup.procs"
    if [ $c = pause ]; then echo pause >"$dir/proc/$pid/comm"; echo 0 >"$p/$c/memory.min"
    else echo "$5" >"$dir/proc/$pid/comm"; echo $(( $4 * 1048576 )) >"$p/$c/memory.min"; fi
    echo "$events" >"$p/$c/memory.events"; echo "$psi" >"$p/$c/memory.pressure"
    echo max >"$p/$c/memory.max"; echo $(( ($3 + 64) * 1048576 )) >"$p/$c/memory.high"
  done
}
pod guaranteed  0000-g1 1024 1024 db
pod burstable   0000-b1 100  200  api
pod burstable   0000-b2 900  200  batch
pod besteffort  0000-e1 300  0    web
i=0
while [ "$i" -lt "$extra_pods" ]; do
  i=$((i + 1))
  if [ $((i % 2)) = 0 ]; then pod burstable "1000-b$i" 50 64 app; else pod besteffort "1000-e$i" 20 0 app; fi
done
echo "fake tree in $dir (available ${avail_mib}MiB)"
