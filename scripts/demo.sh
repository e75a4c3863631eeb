#!/usr/bin/env bash
# Shows nri-qos doing its job: boots containerd 2.1.9 in a small qemu VM twice,
# once without and once with nri-qos pre-launched, starts one pod of each QoS
# class the way the kubelet would, and prints the real kernel values side by side.
# Installs what it needs (Debian packages through a private apt list).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/toolchain.sh
bash tests/e2e/fetch.sh >&2
# Debug builds: the VM harness uses the debug CRI client anyway, and the
# values shown do not depend on the build.
cargo build --locked --bins --examples >&2
export E2E_WORK="${E2E_WORK:-$PWD/tests/e2e/work/demo}"
export NRI_QOS_BIN="$PWD/target/debug/nri-qos"
mkdir -p "$E2E_WORK"
for plugin in none prelaunched; do
  echo "demo: booting containerd 2.1.9 with plugin=$plugin (about 1-3 minutes under software emulation)" >&2
  bash tests/e2e/run.sh --containerd 2.1 --scenario basic --plugin "$plugin" --timing-pods 0 \
    >"$E2E_WORK/demo-$plugin.out" 2>&1 || true
done

python3 - "$E2E_WORK/console-2.1-none.log" "$E2E_WORK/console-2.1-prelaunched.log" <<'PY'
import json, sys

def results(path):
    out = {}
    try:
        for line in open(path, errors="replace"):
            if "E2E-RESULT " in line:
                r = json.loads(line.split("E2E-RESULT ", 1)[1])
                if r.get("phase") == "started":
                    out[r["key"]] = r["values"]
    except FileNotFoundError:
        pass
    return out

without, with_ = results(sys.argv[1]), results(sys.argv[2])
if not with_:
    sys.exit(f"demo: no results from the VM run with nri-qos; see {sys.argv[2]}")
keys = ["cpu.weight", "cpu.max", "memory.min", "memory.low", "memory.high", "memory.max",
        "oom_score_adj", "pod:memory.min", "pod:memory.low"]
classes = {"guaranteed": "Guaranteed", "burstable": "Burstable", "besteffort": "BestEffort"}
rows = [["pod/container", "class", "value", "without nri-qos", "with nri-qos"]]
for key in sorted(with_, key=lambda k: list(classes).index(k.split("/")[0]) if k.split("/")[0] in classes else 9):
    pod = key.split("/")[0]
    for k in keys:
        a = without.get(key, {}).get(k, "?")
        b = with_[key].get(k, "?")
        rows.append([key, classes.get(pod, "?"), k, a, b + ("   <- changed" if a != b else "")])
    rows.append(["", "", "", "", ""])
w = [max(len(r[i]) for r in rows) for i in range(5)]
for r in rows:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
PY
# Each run also checked the kernel against what the runtime or nri-qos must
# produce; say whether every check held.
for plugin in none prelaunched; do
  summary="$(grep -h -E '^  (PASS|FAIL) containerd' "$E2E_WORK/demo-$plugin.out" || echo "  no result (see $E2E_WORK/demo-$plugin.out)")"
  checks="$(grep -h -o '[0-9]* checks passed, [0-9]* failed' "$E2E_WORK/demo-$plugin.out" | head -n 1)"
  echo "plugin=$plugin:${summary#  } ${checks:+($checks)}"
done
