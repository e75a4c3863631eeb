//! `nri-qos audit`: what the policy wants versus what the kernel has.
//!
//! The facts come from the runtime itself: audit registers as a second,
//! short-lived NRI plugin (`nri-qos-audit`, index 99), takes the runtime's
//! Synchronize (every pod and container as the runtime sees them), and
//! disconnects. For every container it recomputes the policy, then reads the
//! real cgroup files and `/proc/<pid>/oom_score_adj`; for the pod, QoS and
//! kubepods cgroups it recomputes the hierarchy keeper's plan.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;

use crate::keeper::plan::{self, PodProtection};
use crate::keeper::HierarchyConfig;
use crate::node::cgroupfs::{exceeds, read_protection, read_trimmed, relaxed_in_tree, Owner};
use crate::node::layout::{container_cgroup_dir, pod_cgroups};
use crate::node::registry::{within_pod_limit, ContainerRequests, RequestSource};
use crate::node::runtime::RuntimeQuirks;
use crate::nri::convert;
use crate::nri::proto::api;
use crate::nri::session::SessionError;
use crate::nri::view::{self, Source};
use crate::qos::{self, NodeFacts, PolicyConfig, QosClass};

mod collect;

pub use crate::nri::reassembly::Snapshot;
pub use collect::collect;

#[derive(Debug, Error)]
pub enum AuditError {
    #[error("cannot connect to the NRI socket {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the runtime ended the audit session before synchronizing: {0}")]
    Session(#[from] SessionError),
    #[error("the runtime did not synchronize within {0:?}")]
    Timeout(Duration),
}

/// One value compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub key: String,
    /// What the policy wants; `None` for a value the policy leaves to the
    /// runtime and cannot see (shown for information, never drift).
    pub expected: Option<String>,
    pub actual: String,
    pub ok: bool,
    /// Who sets the value: `kubelet` (its Memory QoS; never drift unless
    /// the kernel lost a value it sent), `nri-qos`, or `runtime`.
    pub owner: Owner,
}

/// A container, or a pod / QoS / kubepods cgroup, and its checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    /// `ns/pod/container`, or the cgroup path for hierarchy levels.
    pub name: String,
    pub class: Option<QosClass>,
    pub cgroup: String,
    /// A container's memory request as the policy took it, and where it
    /// came from (`api-server` when audit listed the pod from the API
    /// server); none for hierarchy levels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_request: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_source: Option<RequestSource>,
    pub checks: Vec<Check>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditReport {
    pub containers: Vec<Subject>,
    pub hierarchy: Vec<Subject>,
    /// Containers or cgroups we could not check, and why.
    pub skipped: Vec<String>,
    /// What the API server added: the pods listed and matched, or why
    /// the requests come from the runtime's values alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_server: Option<String>,
    pub drift: usize,
}

fn check(key: &str, expected: String, actual: Option<String>) -> Check {
    let actual = actual.unwrap_or_else(|| "(unreadable)".into());
    Check {
        key: key.into(),
        ok: expected == actual,
        expected: Some(expected),
        actual,
        owner: Owner::NriQos,
    }
}

/// A value the policy does not claim: reported, not judged.
fn report_only(key: &str, actual: Option<String>) -> Check {
    Check {
        key: key.into(),
        expected: None,
        actual: actual.unwrap_or_else(|| "(unreadable)".into()),
        ok: true,
        owner: Owner::Runtime,
    }
}

fn owned(mut c: Check, owner: Owner) -> Check {
    c.owner = owner;
    c
}

/// Compares policy and kernel for every container and kubelet-owned cgroup.
/// `quirks`: the runtime's, from its Configure, read as the plugin reads
/// them. `api_pods`: the exact requests of the pods listed from the API
/// server (by the runtime's pod UID), which the plugin's policy takes too.
#[allow(clippy::too_many_arguments)]
pub fn audit(
    snap: &Snapshot,
    quirks: &RuntimeQuirks,
    node: &NodeFacts,
    policy: &PolicyConfig,
    hierarchy: &HierarchyConfig,
    cgroup_root: &Path,
    proc_root: &Path,
    api_pods: Option<&dyn ContainerRequests>,
) -> AuditReport {
    let mut report = AuditReport::default();
    if snap.left_out > 0 {
        report.skipped.push(format!(
            "{} pods and containers of the runtime's Synchronize: past plugin.sync-budget-mib (raise it for audit, e.g. NRI_QOS_PLUGIN_SYNC_BUDGET_MIB=32)",
            snap.left_out
        ));
    }
    let pods: HashMap<&str, &api::PodSandbox> =
        snap.pods.iter().map(|p| (p.id.as_str(), p)).collect();
    let kubelet_pods =
        kubelet_protected_pods(snap, &pods, quirks, (node, policy), cgroup_root, api_pods);
    let explicit = matches!(
        policy.kubelet_memory_qos,
        qos::KubeletMemoryQos::Alpha | qos::KubeletMemoryQos::Tiered
    );
    let mut protection: HashMap<&str, (u64, u64)> = HashMap::new();
    for c in &snap.containers {
        let Some(pod) = pods.get(c.pod_sandbox_id.as_str()) else {
            report.skipped.push(format!(
                "container {}: pod {} unknown",
                c.id, c.pod_sandbox_id
            ));
            continue;
        };
        let kubelet_pod = kubelet_pods.get(pod.id.as_str()).copied().unwrap_or(false);
        let (pod_facts, facts, d, eff) = container_decision(
            pod,
            c,
            kubelet_pod,
            api_pods,
            quirks,
            cgroup_root,
            (node, policy),
        );
        let bytes = |k: &str| eff.unified.get(k).and_then(|v| v.parse::<u64>().ok());
        let e = protection.entry(c.pod_sandbox_id.as_str()).or_default();
        e.0 = e.0.saturating_add(bytes("memory.min").unwrap_or(0));
        e.1 = e.1.saturating_add(bytes("memory.low").unwrap_or(0));

        let name = format!("{}/{}/{}", pod_facts.namespace, pod_facts.name, facts.name);
        let Some(rel) = container_cgroup_dir(&facts.cgroups_path) else {
            report.skipped.push(format!(
                "{name}: cgroups path {:?} not understood",
                facts.cgroups_path
            ));
            continue;
        };
        let dir = cgroup_root.join(&rel);
        if !dir.is_dir() {
            report
                .skipped
                .push(format!("{name}: no cgroup at {}", dir.display()));
            continue;
        }
        let mut checks = if node.cgroup_v2 {
            cgroup_checks(&dir, &d, &eff, &facts, kubelet_pod || explicit)
        } else {
            Vec::new()
        };
        checks.extend(oom_check(&d, &facts, c, proc_root));
        report.drift += checks.iter().filter(|c| !c.ok).count();
        report.containers.push(Subject {
            name,
            class: Some(d.class),
            cgroup: rel.display().to_string(),
            memory_request: d.memory_request,
            request_source: Some(d.request_source),
            checks,
        });
    }

    if node.cgroup_v2 && hierarchy.enabled {
        let pods = pod_protections(snap, cgroup_root, explicit, &kubelet_pods, &protection);
        hierarchy_checks(&pods, node, hierarchy, cgroup_root, explicit, &mut report);
    }
    report
}

/// Which pods the kubelet's Memory QoS protects, by the plugin's rules:
/// its keys on a container, the operator's setting, a pod cgroup
/// holding more protection than our policy would give it, or a running
/// container's cgroup holding a key we would not set.
fn kubelet_protected_pods<'a>(
    snap: &'a Snapshot,
    pods: &HashMap<&str, &api::PodSandbox>,
    quirks: &RuntimeQuirks,
    rules: (&NodeFacts, &PolicyConfig),
    cgroup_root: &Path,
    api_pods: Option<&dyn ContainerRequests>,
) -> HashMap<&'a str, bool> {
    let (node, policy) = rules;
    let auto = policy.kubelet_memory_qos == qos::KubeletMemoryQos::Auto;
    let ours = view::own_pod_protection(&snap.containers, pods, quirks, rules, api_pods);
    let hidden = view::pods_with_hidden_kubelet_keys(
        &snap.containers,
        pods,
        quirks,
        rules,
        cgroup_root,
        api_pods,
    );
    let mut kubelet_pods: HashMap<&str, bool> = HashMap::new();
    for p in &snap.pods {
        let on_disk = pod_cgroups(&p.linux.cgroup_parent)
            .map(|cg| read_protection(&cgroup_root.join(&cg.pod)))
            .unwrap_or_default();
        let mine = ours.get(p.id.as_str()).copied().unwrap_or_default();
        let tree = (auto && node.cgroup_v2 && exceeds(on_disk, mine)) || hidden.contains(&p.id);
        kubelet_pods.insert(p.id.as_str(), tree);
    }
    for c in &snap.containers {
        let facts = view::container_facts(c, Source::Reported, quirks);
        if qos::policy::kubelet_memory_qos_keys(&facts.resources) {
            kubelet_pods.insert(c.pod_sandbox_id.as_str(), true);
        }
    }
    kubelet_pods
}

/// The policy's decision for one container, as the plugin makes it, and
/// the resources the kernel should then have.
fn container_decision(
    pod: &api::PodSandbox,
    c: &api::Container,
    kubelet_pod: bool,
    api_pods: Option<&dyn ContainerRequests>,
    quirks: &RuntimeQuirks,
    cgroup_root: &Path,
    rules: (&NodeFacts, &PolicyConfig),
) -> (
    qos::PodFacts,
    qos::ContainerFacts,
    qos::Decision,
    qos::Resources,
) {
    let mut pod_facts = convert::pod_from_wire(pod);
    pod_facts.kubelet_memory_qos = kubelet_pod;
    // What the plugin decided from after a resize the runtime forgot;
    // elsewhere a memory.max or cpu.max unlike the report is drift.
    let kernel = quirks
        .forgets_resizes
        .then(|| view::limits_from_kernel(cgroup_root, c))
        .flatten();
    let source = kernel
        .as_ref()
        .map_or(Source::Reported, Source::KernelLimits);
    let (facts, d) = view::decide(&pod_facts, c, source, quirks, rules, api_pods);
    let eff = qos::policy::effective(&facts.resources, &d.adjustment);
    (pod_facts, facts, d, eff)
}

/// A container's cgroup v2 files in `dir` against decision `d` and the
/// effective resources `eff`. `kubelet`: the kubelet's Memory QoS protects
/// the pod, so a memory key the policy leaves is the kubelet's.
fn cgroup_checks(
    dir: &Path,
    d: &qos::Decision,
    eff: &qos::Resources,
    facts: &qos::ContainerFacts,
    kubelet: bool,
) -> Vec<Check> {
    let file = |f: &str| read_trimmed(&dir.join(f));
    let mut checks = Vec::new();
    if let Some(w) = eff.unified.get("cpu.weight") {
        checks.push(check("cpu.weight", w.clone(), file("cpu.weight")));
    }
    let period = eff.cpu_period.unwrap_or(100_000);
    let cpu_max = match eff.cpu_quota {
        Some(q) if q > 0 => format!("{q} {period}"),
        _ => format!("max {period}"),
    };
    let cpu_owner = if d.adjustment.cpu_quota.is_some() {
        Owner::NriQos
    } else {
        Owner::Runtime
    };
    checks.push(owned(check("cpu.max", cpu_max, file("cpu.max")), cpu_owner));
    let mem_max = eff
        .memory_limit
        .map(|l| l.to_string())
        .unwrap_or_else(|| "max".into());
    checks.push(owned(
        check("memory.max", mem_max, file("memory.max")),
        Owner::Runtime,
    ));
    // Unified keys the policy does not set stay the runtime's. NRI
    // before v0.10 (containerd 1.7, 2.0, 2.1) does not show plugins the
    // CRI's unified map, so e.g. the kubelet's MemoryQoS memory.min can
    // be in the kernel without being visible here: report, not drift.
    for key in ["memory.min", "memory.low", "memory.high"] {
        checks.push(
            match (
                d.adjustment.unified.get(key),
                facts.resources.unified.get(key),
            ) {
                // memory.high raised to memory.max by the monitor's throttle
                // guard: not drift, the policy leaves it so until the
                // container restarts or is resized.
                (Some(want), _) if key == "memory.high" && relaxed_in_tree(dir, want) => Check {
                    key: key.into(),
                    expected: Some(want.clone()),
                    actual: format!(
                        "{} (relaxed by the throttle guard)",
                        file(key).unwrap_or_default()
                    ),
                    ok: true,
                    owner: Owner::NriQos,
                },
                (Some(want), _) => check(key, want.clone(), file(key)),
                // The kubelet's value as it sent it: never replaced, so it must be there.
                (None, Some(sent)) => owned(check(key, sent.clone(), file(key)), Owner::Kubelet),
                (None, None) if kubelet => owned(report_only(key, file(key)), Owner::Kubelet),
                (None, None) => report_only(key, file(key)),
            },
        );
    }
    checks
}

/// The container's `/proc/<pid>/oom_score_adj` against what the policy
/// (or the runtime, where the policy leaves it) wants.
fn oom_check(
    d: &qos::Decision,
    facts: &qos::ContainerFacts,
    c: &api::Container,
    proc_root: &Path,
) -> Option<Check> {
    let want = d.adjustment.oom_score_adj.or(facts.oom_score_adj)?;
    if c.pid == 0 {
        return None;
    }
    let path = proc_root.join(c.pid.to_string()).join("oom_score_adj");
    let owner = if d.adjustment.oom_score_adj.is_some() {
        Owner::NriQos
    } else {
        Owner::Runtime
    };
    Some(owned(
        check("oom_score_adj", want.to_string(), read_trimmed(&path)),
        owner,
    ))
}

/// Every pod's protection as the keeper counts it: kubelet-owned pods in
/// their parents with what they carry, the others with what the policy
/// gives their containers.
fn pod_protections(
    snap: &Snapshot,
    cgroup_root: &Path,
    explicit: bool,
    kubelet_pods: &HashMap<&str, bool>,
    protection: &HashMap<&str, (u64, u64)>,
) -> Vec<PodProtection> {
    snap.pods
        .iter()
        .filter_map(|p| {
            let cgroups = pod_cgroups(&p.linux.cgroup_parent)?;
            let kubelet = explicit || kubelet_pods.get(p.id.as_str()).copied().unwrap_or(false);
            let (min, low) = if kubelet {
                let on_disk = read_protection(&cgroup_root.join(&cgroups.pod));
                (on_disk.min, on_disk.low)
            } else {
                let (min, low) = protection.get(p.id.as_str()).copied().unwrap_or_default();
                let limit = view::pod_memory_limit(&convert::pod_from_wire(p));
                (within_pod_limit(min, limit), within_pod_limit(low, limit))
            };
            Some(PodProtection {
                cgroups,
                memory_min: min,
                memory_low: low,
                kubelet,
            })
        })
        .collect()
}

/// The keeper's plan for the pod, QoS and kubepods cgroups against their files.
fn hierarchy_checks(
    pods: &[PodProtection],
    node: &NodeFacts,
    hierarchy: &HierarchyConfig,
    cgroup_root: &Path,
    explicit: bool,
    report: &mut AuditReport,
) {
    let classes: HashMap<PathBuf, QosClass> = pods
        .iter()
        .map(|p| (p.cgroups.pod.clone(), p.cgroups.class))
        .collect();
    // The kubelet owns a QoS or kubepods cgroup once it owns a pod in it.
    let kubelet_owned = |cg: &PathBuf| {
        explicit
            || pods.iter().any(|p| {
                p.kubelet
                    && (&p.cgroups.pod == cg
                        || &p.cgroups.kubepods == cg
                        || p.cgroups.qos.as_ref() == Some(cg))
            })
    };
    let budget = plan::budget(
        node.memory_capacity,
        hierarchy.reserve_bytes,
        hierarchy.budget_share,
    );
    for (cg, want) in plan::targets(pods, budget).by_cgroup {
        let dir = cgroup_root.join(&cg);
        if !dir.is_dir() {
            report
                .skipped
                .push(format!("no cgroup at {}", dir.display()));
            continue;
        }
        let kubelet = kubelet_owned(&cg);
        let checks: Vec<Check> = [("memory.min", want.min), ("memory.low", want.low)]
            .into_iter()
            .map(|(f, v)| {
                let actual = read_trimmed(&dir.join(f));
                if kubelet {
                    owned(report_only(f, actual), Owner::Kubelet)
                } else {
                    check(f, v.to_string(), actual)
                }
            })
            .collect();
        report.drift += checks.iter().filter(|c| !c.ok).count();
        report.hierarchy.push(Subject {
            name: cg.display().to_string(),
            class: classes.get(&cg).copied(),
            cgroup: cg.display().to_string(),
            memory_request: None,
            request_source: None,
            checks,
        });
    }
}

/// A readable table; drifting values are marked.
pub fn render_table(r: &AuditReport) -> String {
    let mut out = String::new();
    let mut rows = vec![[
        "SUBJECT".to_string(),
        "CLASS".into(),
        "REQUEST-SOURCE".into(),
        "KEY".into(),
        "OWNER".into(),
        "EXPECTED".into(),
        "ACTUAL".into(),
        String::new(),
    ]];
    for s in r.containers.iter().chain(r.hierarchy.iter()) {
        for c in &s.checks {
            rows.push([
                s.name.clone(),
                s.class
                    .map(|c| format!("{c:?}"))
                    .unwrap_or_else(|| "-".into()),
                s.request_source
                    .map(|r| r.to_string())
                    .unwrap_or_else(|| "-".into()),
                c.key.clone(),
                c.owner.label().to_string(),
                c.expected
                    .clone()
                    .unwrap_or_else(|| format!("({})", c.owner.label())),
                c.actual.clone(),
                if c.ok { String::new() } else { "DRIFT".into() },
            ]);
        }
    }
    out.push_str(&crate::table::aligned(&rows));
    for s in &r.skipped {
        out.push_str(&format!("skipped: {s}\n"));
    }
    if let Some(a) = &r.api_server {
        out.push_str(&format!("api-server: {a}\n"));
    }
    out.push_str(&format!(
        "{} containers, {} hierarchy cgroups, {} drifting values\n",
        r.containers.len(),
        r.hierarchy.len(),
        r.drift
    ));
    out
}
