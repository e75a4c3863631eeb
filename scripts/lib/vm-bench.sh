# Sourced by the scripts/bench-*.sh that boot the e2e VM (no runtime) and
# report from its console log; run from the repository root.

# Boots the VM with the release binary for one scenario of tests/e2e/run.sh
# ($1, e.g. --pressure-bench). Its failures show as missing results.
vm_bench() {
  bash tests/e2e/fetch.sh >&2
  NRI_QOS_BIN="$PWD/target/release/nri-qos" bash tests/e2e/run.sh --containerd 2.1 "$1" >&2 || true
}

# Runs the Python report read from stdin over the console log $2 ($1 names
# the bench in errors). Before it runs, the guest's `E2E-RAW <file> <line>`
# lines are sorted into `summary` (summary.txt, key=value), `monitor` (the
# JSON lines of monitor.log, parsed) and `files` (every other file: name ->
# its lines), and `ms()` turns tracing's RFC 3339 UTC timestamps into ms.
console_report() {
  {
    cat <<'PY'
import json, sys
from datetime import datetime

summary, monitor, files = {}, [], {}
for line in open(sys.argv[2], errors="replace"):
    if not line.startswith("E2E-RAW "):
        continue
    _, name, rest = line.rstrip("\n").split(" ", 2)
    if name == "summary.txt":
        k, _, v = rest.partition("=")
        summary[k] = v
    elif name == "monitor.log":
        try:
            monitor.append(json.loads(rest))
        except ValueError:
            pass  # not one of the monitor's JSON log lines
    else:
        files.setdefault(name, []).append(rest)
if not summary:
    sys.exit(f"{sys.argv[1]}: no results in {sys.argv[2]}")

def ms(ts):  # RFC 3339 from tracing, UTC
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000

PY
    cat
  } | python3 - "$1" "$2"
}
