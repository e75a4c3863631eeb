//! `nri-qos explain pod.yaml`: every kernel value a Pod will get.
//!
//! Simulates what the kubelet sends the runtime for each container (cgroup
//! parent, CPU shares/quota, memory limit, oom_score_adj, with its formulas
//! from kubelet-qos.md), runs the same [`decide`](crate::qos::decide) the plugin
//! runs, and reports what the kernel ends up with: the runtime's value where
//! we leave it alone, ours where we set it.

//!
//! `kubelet` simulates the kubelet's side, `render` turns a report into the
//! table the command prints.

use serde::Serialize;
use serde_json::{json, Value};
use thiserror::Error;

use crate::kube::facts::from_manifest;
use crate::node::cgroupfs::Owner;
use crate::node::layout::{container_cgroup, pod_cgroup_parent, Driver};
use crate::node::{NodeFacts, QosClass};
use crate::qos::formulas as f;
use crate::qos::pod::{parse_pod, pod_qos, ManifestError, Resolved};
use crate::qos::policy::{self, PolicyConfig, WeightConversion};
use crate::qos::{ContainerFacts, PodFacts, RequestSource, Resources};

mod kubelet;
mod render;

pub use kubelet::{KubeletMemoryQosSim, KubeletMode};
pub use render::{inversion_table, render_table};

#[derive(Debug, Error)]
pub enum ExplainError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// The node the pod is explained for.
#[derive(Debug, Clone, Copy)]
pub struct NodeSpec {
    pub memory_capacity: u64,
    pub memory_allocatable: u64,
    pub page_size: u64,
    pub driver: Driver,
    pub cgroup_v2: bool,
}

/// One container's kernel values.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerReport {
    pub name: String,
    pub init: bool,
    pub sidecar: bool,
    pub cgroup_path: String,
    pub cpu_shares: u64,
    pub cpu_weight: u64,
    pub cpu_max: String,
    pub memory_min: u64,
    pub memory_low: u64,
    /// Bytes, or "max".
    pub memory_high: Value,
    /// Bytes, or "max".
    pub memory_max: Value,
    /// A finite memory.high below memory.max: the throttle guard watches
    /// this container (`[throttle]`) and raises memory.high to memory.max
    /// when it stays throttled.
    pub throttle_guard: bool,
    pub oom_score_adj: i64,
    /// The memory request the policy worked with, and where it came from.
    pub memory_request: Option<u64>,
    pub memory_request_source: RequestSource,
    /// What the kubelet sends the runtime for this container, before any
    /// plugin (the CRI `LinuxContainerResources`).
    pub kubelet: KubeletRequest,
    /// When the request was inverted from oom_score_adj: every request the
    /// kubelet maps to that value, `[from, to)` bytes (`to` null: no bound).
    pub memory_request_range: Option<(u64, Option<u64>)>,
    /// The Memory QoS keys of the kubelet's CRI `unified` map.
    pub kubelet_unified: std::collections::BTreeMap<String, String>,
    /// Who sets each cgroup value: `kubelet` (its Memory QoS), `nri-qos`
    /// (our adjustment), or `runtime` (the CRI request as the runtime applies it).
    pub set_by: std::collections::BTreeMap<String, Owner>,
}

/// The CRI resources the kubelet computes for a container (kuberuntime).
/// 0 means "not set", as on the CRI wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletRequest {
    pub cpu_shares: u64,
    pub cpu_quota: i64,
    pub cpu_period: u64,
    pub memory_limit: u64,
    pub oom_score_adj: i64,
}

/// The explained pod. JSON field names are stable: scripts rely on them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    pub pod: String,
    pub qos_class: QosClass,
    pub reason: String,
    /// The cgroup parent the kubelet gives the pod sandbox (CRI
    /// `LinuxPodSandboxConfig.cgroup_parent`; a slice name with systemd).
    pub cgroup_parent: String,
    pub containers: Vec<ContainerReport>,
    /// The pause container (runtime-created; oom_score_adj -998, 2 shares).
    pub sandbox: Value,
    /// The pod-level cgroup as the hierarchy keeper maintains it.
    pub pod_cgroup: Value,
    /// `api-server` when explained for a plugin with the Kubernetes API
    /// source: the memory requests are this spec's exact ones, as the
    /// plugin reads them from the API server (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_source: Option<String>,
}

fn bytes_or_max(v: Option<u64>) -> Value {
    v.map_or(json!("max"), |b| json!(b))
}

/// Explains a Pod manifest for a kubelet without Memory QoS.
pub fn explain(yaml: &str, node: &NodeSpec, cfg: &PolicyConfig) -> Result<PodReport, ExplainError> {
    explain_with(yaml, node, cfg, &KubeletMemoryQosSim::default(), false)
}

/// Explains a Pod manifest next to the kubelet's Memory QoS as `kubelet`
/// describes it. The runtime is taken to show plugins the kubelet's
/// `unified` keys (containerd 2.2+); older ones hide them and nri-qos then
/// also leaves memory.high alone on the pods the kubelet protects.
/// `api_server`: the plugin runs with the Kubernetes API source, so each
/// container's memory request is the spec's exact one (request source
/// `api-server`; the same reading of the spec as the watch), not one
/// recovered from what the kubelet sends the runtime. Nothing is asked of
/// a live API server.
pub fn explain_with(
    yaml: &str,
    node: &NodeSpec,
    cfg: &PolicyConfig,
    kubelet: &KubeletMemoryQosSim,
    api_server: bool,
) -> Result<PodReport, ExplainError> {
    let pod = parse_pod(yaml)?;
    // A file given to explain must say what it is (parse_pod also reads
    // API objects, where list items can come without their kind).
    if pod.kind.is_empty() {
        return Err(ManifestError::Field {
            path: "kind".into(),
            message: "missing; a Pod manifest says `kind: Pod`".into(),
        }
        .into());
    }
    let (class, class_reason) = pod_qos(&pod)?;
    let api_facts = api_server.then(|| from_manifest(&pod)).transpose()?;
    let uid = if pod.metadata.uid.is_empty() {
        "00000000-0000-0000-0000-000000000000".to_string()
    } else {
        pod.metadata.uid.clone()
    };
    let (cgroup_parent, pod_path) = pod_cgroup_parent(node.driver, class, &uid);
    let pod_level = match &pod.spec.resources {
        Some(r) => Some(r.resolve("spec.resources")?),
        None => None,
    };

    // (name, init, sidecar, resolved)
    let mut all = Vec::new();
    for (i, c) in pod.spec.init_containers.iter().enumerate() {
        let r = c
            .resources
            .resolve(&format!("spec.initContainers[{i}].resources"))?;
        all.push((c.name.clone(), true, c.is_sidecar(), r));
    }
    for (i, c) in pod.spec.containers.iter().enumerate() {
        let r = c
            .resources
            .resolve(&format!("spec.containers[{i}].resources"))?;
        all.push((c.name.clone(), false, false, r));
    }
    let mem = |r: &Resolved| r.requests.memory.unwrap_or(0);
    let min_regular = all
        .iter()
        .filter(|(_, init, _, _)| !init)
        .map(|(_, _, _, r)| mem(r))
        .min();
    // Pod-level memory request beyond the containers' is spread evenly (helpers.go).
    let remaining = pod_level
        .and_then(|p| p.requests.memory)
        .map(|pod_req| {
            let running: u64 = all
                .iter()
                .filter(|(_, init, sidecar, _)| !init || *sidecar)
                .map(|(_, _, _, r)| mem(r))
                .fold(0, u64::saturating_add);
            let init_max = all
                .iter()
                .filter(|(_, init, sidecar, _)| *init && !*sidecar)
                .map(|(_, _, _, r)| mem(r))
                .max()
                .unwrap_or(0);
            pod_req.saturating_sub(running.max(init_max)) / all.len().max(1) as u64
        })
        .unwrap_or(0);

    let node_facts = NodeFacts {
        memory_capacity: node.memory_capacity,
        memory_allocatable: node.memory_allocatable,
        page_size: node.page_size,
        cgroup_v2: node.cgroup_v2,
    };
    let pod_facts = PodFacts {
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: uid.clone(),
        labels: pod.metadata.labels.clone(),
        annotations: pod.metadata.annotations.clone(),
        cgroup_parent: cgroup_parent.clone(),
        resources: None,
        kubelet_memory_qos: false,
    };

    let mut containers = Vec::new();
    let (mut pod_min, mut pod_low) = (0u64, 0u64);
    let (mut kubelet_pod_min, mut kubelet_pod_low) = (0u64, 0u64);
    for (name, init, sidecar, r) in &all {
        // CRI values as kuberuntime computes them; CPU and memory limits
        // fall back to the pod-level limits.
        let cpu_limit = r
            .limits
            .cpu_milli
            .or(pod_level.and_then(|p| p.limits.cpu_milli));
        let cpu_request = r.requests.cpu_milli.or(cpu_limit);
        let mem_limit = r.limits.memory.or(pod_level.and_then(|p| p.limits.memory));
        let shares = f::milli_cpu_to_shares(cpu_request.unwrap_or(0));
        let quota = cpu_limit.map(|m| f::milli_cpu_to_quota(m, f::QUOTA_PERIOD));
        let oom = kubelet::oom_score_adj(
            &pod,
            class,
            mem(r),
            remaining,
            *sidecar,
            min_regular,
            node.memory_capacity,
        );
        // The kubelet's Memory QoS request: the container's own (with the
        // requests defaulted to the limits, as the API server does).
        let kubelet_unified = kubelet.unified(class, mem(r), mem_limit, node);
        if !*init || *sidecar {
            let v = |k: &str| {
                kubelet_unified
                    .get(k)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            kubelet_pod_min += v("memory.min");
            kubelet_pod_low += v("memory.low");
        }
        let facts = ContainerFacts {
            name: name.clone(),
            resources: Resources {
                cpu_shares: Some(shares),
                cpu_quota: quota,
                cpu_period: Some(f::QUOTA_PERIOD),
                memory_limit: mem_limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX)),
                unified: kubelet_unified.clone(),
            },
            oom_score_adj: Some(oom),
            api_memory_request: api_facts.as_ref().and_then(|f| f.container_request(name)),
            ..Default::default()
        };
        let d = policy::decide(&pod_facts, &facts, &node_facts, cfg);
        let eff = policy::effective(&facts.resources, &d.adjustment);
        let unified = |k: &str| eff.unified.get(k).and_then(|v| v.parse::<u64>().ok());
        let eff_shares = eff.cpu_shares.unwrap_or(shares);
        let weight = unified("cpu.weight").unwrap_or_else(|| match cfg.cpu_weight {
            WeightConversion::Linear => f::cpu_weight_linear(eff_shares),
            // What runc >= 1.3.2 / crun >= 1.23 write when we leave it to them.
            _ => f::cpu_weight_quadratic(eff_shares),
        });
        let cpu_max = match eff.cpu_quota {
            Some(q) if q > 0 => format!("{q} {}", eff.cpu_period.unwrap_or(f::QUOTA_PERIOD)),
            _ => format!("max {}", eff.cpu_period.unwrap_or(f::QUOTA_PERIOD)),
        };
        let (min, low) = (
            unified("memory.min").unwrap_or(0),
            unified("memory.low").unwrap_or(0),
        );
        if !*init || *sidecar {
            pod_min = pod_min.saturating_add(min);
            pod_low = pod_low.saturating_add(low);
        }
        let container_path = container_cgroup(node.driver, &pod_path, "<container-id>");
        let owner = |set_by_us: bool, from_kubelet: bool| match (set_by_us, from_kubelet) {
            (true, _) => Owner::NriQos,
            (false, true) => Owner::Kubelet,
            (false, false) => Owner::Runtime,
        };
        let mut set_by = std::collections::BTreeMap::new();
        for key in ["cpu.weight", "memory.min", "memory.low", "memory.high"] {
            set_by.insert(
                key.to_string(),
                owner(
                    d.adjustment.unified.contains_key(key),
                    kubelet_unified.contains_key(key),
                ),
            );
        }
        set_by.insert(
            "cpu.max".into(),
            owner(d.adjustment.cpu_quota.is_some(), false),
        );
        set_by.insert(
            "memory.max".into(),
            owner(d.adjustment.memory_limit.is_some(), false),
        );
        set_by.insert(
            "oom_score_adj".into(),
            owner(d.adjustment.oom_score_adj.is_some(), false),
        );
        let memory_request_range = (d.request_source == RequestSource::OomScoreAdj)
            .then(|| f::memory_request_range_from_oom_score_adj(oom, node.memory_capacity))
            .flatten()
            .map(|r| (r.start, (r.end != u64::MAX).then_some(r.end)));
        containers.push(ContainerReport {
            name: name.clone(),
            init: *init,
            sidecar: *sidecar,
            cgroup_path: container_path,
            cpu_shares: eff_shares,
            cpu_weight: weight,
            cpu_max,
            memory_min: min,
            memory_low: low,
            memory_high: bytes_or_max(unified("memory.high")),
            memory_max: bytes_or_max(eff.memory_limit.and_then(|l| u64::try_from(l).ok())),
            throttle_guard: class != QosClass::Guaranteed
                && unified("memory.high").is_some_and(|h| {
                    eff.memory_limit
                        .and_then(|l| u64::try_from(l).ok())
                        .is_none_or(|max| h < max)
                }),
            oom_score_adj: d.adjustment.oom_score_adj.unwrap_or(oom),
            memory_request: d.memory_request,
            memory_request_source: d.request_source,
            kubelet: KubeletRequest {
                cpu_shares: shares,
                cpu_quota: quota.unwrap_or(0),
                cpu_period: f::QUOTA_PERIOD,
                memory_limit: mem_limit.unwrap_or(0),
                oom_score_adj: oom,
            },
            memory_request_range,
            kubelet_unified,
            set_by,
        });
    }
    let sandbox_path = container_cgroup(node.driver, &pod_path, "<sandbox-id>");
    Ok(PodReport {
        pod: format!(
            "{}/{}",
            if pod.metadata.namespace.is_empty() {
                "default"
            } else {
                &pod.metadata.namespace
            },
            pod.metadata.name
        ),
        qos_class: class,
        reason: class_reason,
        cgroup_parent,
        containers,
        sandbox: json!({
            "cgroupPath": sandbox_path,
            "cpuShares": f::MIN_SHARES,
            "cpuWeight": 1,
            "oomScoreAdj": f::SANDBOX_OOM_SCORE_ADJ,
        }),
        // The kubelet writes the pod cgroup itself (Σ requests, with any
        // RuntimeClass overhead) when its Memory QoS protects the pod; the
        // hierarchy keeper then leaves it alone.
        pod_cgroup: if kubelet_pod_min + kubelet_pod_low > 0 {
            json!({
                "cgroupPath": pod_path,
                "memoryMin": kubelet_pod_min,
                "memoryLow": kubelet_pod_low,
                "owner": Owner::Kubelet,
            })
        } else {
            json!({
                "cgroupPath": pod_path,
                "memoryMin": pod_min,
                "memoryLow": pod_low,
                "owner": Owner::NriQos,
            })
        },
        request_source: api_server.then(|| RequestSource::ApiServer.to_string()),
    })
}

#[cfg(test)]
mod tests;
