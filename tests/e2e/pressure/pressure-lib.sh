# Shared setup of the in-VM monitor benches (run.sh, throttle.sh), sourced
# after they set TAG, OUT, CG and KP. Busybox sh.

mkdir -p "$OUT"
SUM=$OUT/summary.txt
: >"$SUM"

log() { echo "[$TAG $(cut -d' ' -f1 /proc/uptime)] $*" >&2; }
put() { echo "$1=$2" >>"$SUM"; log "$1=$2"; }
count() { grep -c "$1" "$OUT/monitor.log" || true; }

[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
[ -f "$CG/cgroup.controllers" ] || { echo "$CG is not cgroup v2" >&2; exit 1; }
put kernel "$(uname -r)"
put swap_total_kb "$(awk '/^SwapTotal/ {print $2}' /proc/meminfo)"

# kubepods and its QoS slices in the systemd layout, memory enabled down to them
enable_memory() { grep -qw memory "$1/cgroup.subtree_control" || echo +memory >"$1/cgroup.subtree_control"; }
mkdir -p "$KP"
enable_memory "$CG"
enable_memory "$KP"
for q in burstable besteffort; do
  mkdir -p "$KP/kubepods-$q.slice"
  enable_memory "$KP/kubepods-$q.slice"
done
# pod_path CLASS UID
pod_path() {
  case $1 in
  guaranteed) echo "$KP/kubepods-pod$2.slice" ;;
  *) echo "$KP/kubepods-$1.slice/kubepods-$1-pod$2.slice" ;;
  esac
}
# run_in CGROUP LOGFILE CMD...: CMD in CGROUP, as a child of this shell
run_in() {
  cgp=$1 lf=$2
  shift 2
  sh -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$cgp" "$@" >"$lf" 2>&1 &
  LAST_PID=$!
}
