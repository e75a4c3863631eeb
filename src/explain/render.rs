//! The explained pod as the table `nri-qos explain` prints, and the
//! big-nodes table of docs/policy.md (oom_score_adj resolution).

use serde_json::Value;

use super::{ContainerReport, PodReport};
use crate::node::cgroupfs::Owner;
use crate::qos::formulas as f;
use crate::table;

/// The big-nodes table of docs/policy.md: how well a Burstable request can be
/// recovered from oom_score_adj on nodes of `GiB` sizes (the kubelet's
/// formula truncates 1000·request/MemTotal to an integer).
pub fn inversion_table(gibs: &[u64]) -> String {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    let mut out = String::from(
        "| node memory | resolution (MemTotal/1000) | smallest recoverable request | memory.low at most this far below the request |\n|---|---|---|---|\n",
    );
    for &g in gibs {
        let c = g << 30;
        // adj 999 also covers every request below MemTotal/1000: 998 is the
        // first value that says anything; 3 is open-ended above.
        let smallest = (4..=998)
            .filter_map(|adj| f::memory_request_range_from_oom_score_adj(adj, c))
            .map(|r| r.start)
            .min()
            .unwrap_or(0);
        let worst = (4..=998)
            .filter_map(|adj| f::memory_request_range_from_oom_score_adj(adj, c))
            .map(|r| (r.end - 1) - f::page_align_down(r.start, 4096))
            .max()
            .unwrap_or(0);
        out.push_str(&format!(
            "| {g} GiB | {} | {} | {} |\n",
            mib(c / 1000),
            mib(smallest),
            mib(worst)
        ));
    }
    out
}

fn human(v: &Value) -> String {
    match v.as_u64() {
        Some(b) => human_bytes(b),
        None => v.as_str().unwrap_or("?").to_string(),
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    if b == 0 {
        return "0".into();
    }
    for (u, size) in UNITS {
        if b >= size {
            return if b.is_multiple_of(size) {
                format!("{}{u}", b / size)
            } else {
                format!("{:.1}{u}", b as f64 / size as f64)
            };
        }
    }
    b.to_string()
}

/// The report as a readable table: a header, one row per container, the
/// sandbox and the pod cgroup, then the notes that apply.
pub fn render_table(r: &PodReport) -> String {
    let mut out = header(r);
    let mut rows = vec![COLUMNS.map(String::from)];
    rows.extend(r.containers.iter().map(container_row));
    rows.push(sandbox_row());
    rows.push(pod_cgroup_row(r));
    out.push_str(&table::aligned(&rows));
    out.push_str(&guard_note(r));
    if r.containers.iter().any(|c| !c.kubelet_unified.is_empty()) {
        out.push_str("\nThe last column is what the kubelet's Memory QoS sets; nri-qos adds the other cpu.weight and memory values and any oom_score_adj change.\n");
    }
    out
}

const COLUMNS: [&str; 10] = [
    "CONTAINER",
    "cpu.weight",
    "cpu.max",
    "memory.min",
    "memory.low",
    "memory.high",
    "memory.max",
    "oom_score_adj",
    "memory request",
    "set by the kubelet",
];

type Row = [String; 10];

fn header(r: &PodReport) -> String {
    let mut out = format!("pod {}: {:?} ({})\n", r.pod, r.qos_class, r.reason);
    out.push_str(&format!(
        "pod cgroup: {}\n",
        r.pod_cgroup["cgroupPath"].as_str().unwrap_or("?")
    ));
    if let Some(s) = &r.request_source {
        out.push_str(&format!(
            "request source: {s} (the plugin's Kubernetes API source: this spec's exact memory requests)\n"
        ));
    }
    out.push('\n');
    out
}

fn container_row(c: &ContainerReport) -> Row {
    let kind = if c.sidecar {
        " (sidecar)"
    } else if c.init {
        " (init)"
    } else {
        ""
    };
    [
        format!("{}{kind}", c.name),
        format!("{} ({} shares)", c.cpu_weight, c.cpu_shares),
        c.cpu_max.clone(),
        human_bytes(c.memory_min),
        human_bytes(c.memory_low),
        human(&c.memory_high),
        human(&c.memory_max),
        c.oom_score_adj.to_string(),
        memory_request_cell(c),
        kubelet_keys_cell(c),
    ]
}

/// The memory request, or its range when only bounds are known, with where
/// it came from.
fn memory_request_cell(c: &ContainerReport) -> String {
    match (c.memory_request, c.memory_request_range) {
        (Some(_), Some((from, to))) => format!(
            "{}..{} ({})",
            human_bytes(from),
            to.map_or("".into(), human_bytes),
            c.memory_request_source
        ),
        (Some(b), None) => format!("{} ({})", human_bytes(b), c.memory_request_source),
        (None, _) => format!("- ({})", c.memory_request_source),
    }
}

fn kubelet_keys_cell(c: &ContainerReport) -> String {
    let keys: Vec<&str> = c
        .set_by
        .iter()
        .filter(|(_, o)| **o == Owner::Kubelet)
        .map(|(k, _)| k.as_str())
        .collect();
    if keys.is_empty() {
        "-".into()
    } else {
        keys.join(",")
    }
}

/// The pause container: the runtime's own values, the same for every pod.
fn sandbox_row() -> Row {
    [
        "(pod sandbox)",
        "1 (2 shares)",
        "max 100000",
        "0",
        "0",
        "max",
        "max",
        "-998",
        "-",
        "-",
    ]
    .map(String::from)
}

fn pod_cgroup_row(r: &PodReport) -> Row {
    let kubelet_keys = if r.pod_cgroup["owner"] == "kubelet" {
        "memory.min,memory.low"
    } else {
        "-"
    };
    [
        "(pod cgroup)".into(),
        "-".into(),
        "-".into(),
        human(&r.pod_cgroup["memoryMin"]),
        human(&r.pod_cgroup["memoryLow"]),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        kubelet_keys.into(),
    ]
}

fn guard_note(r: &PodReport) -> String {
    let guarded: Vec<&str> = r
        .containers
        .iter()
        .filter(|c| c.throttle_guard)
        .map(|c| c.name.as_str())
        .collect();
    if guarded.is_empty() {
        return String::new();
    }
    format!(
        "\nthrottle guard ({}): unless [throttle] enabled = false, a container that stays throttled at its memory.high \
         past [throttle] grace-period gets memory.high = memory.max; if the stall persists, its pod is evicted \
         in the node-pressure order.\n",
        guarded.join(", ")
    )
}
