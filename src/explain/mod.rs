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

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};
use thiserror::Error;

use crate::kube::facts::from_manifest;
use crate::node::cgroupfs::Owner;
use crate::node::layout::{container_cgroup, pod_cgroup_parent, Driver};
use crate::node::{NodeFacts, QosClass};
use crate::qos::formulas as f;
use crate::qos::pod::{parse_pod, pod_qos, ManifestError, Pod, Resolved};
use crate::qos::policy::{self, PolicyConfig, WeightConversion};
use crate::qos::{Adjustment, ContainerFacts, Decision, PodFacts, RequestSource, Resources};

mod kubelet;
mod render;

pub use kubelet::{KubeletMemoryQosSim, KubeletMode, KubeletSimError};
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

impl NodeSpec {
    /// The node as the policy sees it.
    fn facts(&self) -> NodeFacts {
        NodeFacts {
            memory_capacity: self.memory_capacity,
            memory_allocatable: self.memory_allocatable,
            page_size: self.page_size,
            cgroup_v2: self.cgroup_v2,
        }
    }
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
    pub kubelet_unified: BTreeMap<String, String>,
    /// Who sets each cgroup value: `kubelet` (its Memory QoS), `nri-qos`
    /// (our adjustment), or `runtime` (the CRI request as the runtime applies it).
    pub set_by: BTreeMap<String, Owner>,
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
    let pod = parse_pod_manifest(yaml)?;
    let (class, class_reason) = pod_qos(&pod)?;
    let api = api_server.then(|| from_manifest(&pod)).transpose()?;
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
    let all = spec_containers(&pod)?;
    let kubelet_pod = pod_level
        .and_then(|p| p.requests.memory)
        .and_then(|req| kubelet.pod_level_protection(class, req, node));
    let ctx = PodContext {
        class,
        node,
        cfg,
        kubelet,
        node_facts: node.facts(),
        pod_facts: PodFacts {
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid,
            labels: pod.metadata.labels.clone(),
            annotations: pod.metadata.annotations.clone(),
            cgroup_parent: cgroup_parent.clone(),
            resources: None,
            // The kubelet protected the pod cgroup itself: the pod's
            // protection is its own.
            kubelet_memory_qos: kubelet_pod.is_some(),
        },
        pod_path,
        pod_level,
        remaining: pod_level_share(&all, pod_level),
        min_regular: all
            .iter()
            .filter(|c| !c.init)
            .map(SpecContainer::memory_request)
            .min(),
        api,
        pod: &pod,
    };
    let containers: Vec<ContainerReport> = all.iter().map(|c| ctx.explain(c)).collect();
    let namespace = match pod.metadata.namespace.as_str() {
        "" => "default",
        ns => ns,
    };
    Ok(PodReport {
        pod: format!("{namespace}/{}", pod.metadata.name),
        qos_class: class,
        reason: class_reason,
        cgroup_parent,
        pod_cgroup: pod_cgroup(&ctx.pod_path, &containers, kubelet_pod),
        containers,
        sandbox: sandbox(node, &ctx.pod_path),
        request_source: api_server.then(|| RequestSource::ApiServer.to_string()),
    })
}

/// The pause container: runtime-created, oom_score_adj -998, 2 shares.
fn sandbox(node: &NodeSpec, pod_path: &str) -> Value {
    json!({
        "cgroupPath": container_cgroup(node.driver, pod_path, "<sandbox-id>"),
        "cpuShares": f::MIN_SHARES,
        "cpuWeight": 1,
        "oomScoreAdj": f::SANDBOX_OOM_SCORE_ADJ,
    })
}

/// Parses the file given to explain, which must say what it is
/// (`parse_pod` also reads API objects, where list items can come without
/// their kind).
fn parse_pod_manifest(yaml: &str) -> Result<Pod, ExplainError> {
    let pod = parse_pod(yaml)?;
    if pod.kind.is_empty() {
        return Err(ManifestError::Field {
            path: "kind".into(),
            message: "missing; a Pod manifest says `kind: Pod`".into(),
        }
        .into());
    }
    Ok(pod)
}

/// One container of the spec with its requests and limits resolved.
struct SpecContainer {
    name: String,
    init: bool,
    /// An init container that keeps running (`restartPolicy: Always`).
    sidecar: bool,
    resources: Resolved,
}

impl SpecContainer {
    fn memory_request(&self) -> u64 {
        self.resources.requests.memory.unwrap_or(0)
    }

    /// Runs for the pod's lifetime (a regular container or a sidecar), so
    /// it counts toward the pod's requests.
    fn runs_with_pod(&self) -> bool {
        !self.init || self.sidecar
    }
}

/// The init containers, then the regular ones, resolved.
fn spec_containers(pod: &Pod) -> Result<Vec<SpecContainer>, ManifestError> {
    let mut all = Vec::new();
    for (i, c) in pod.spec.init_containers.iter().enumerate() {
        all.push(SpecContainer {
            name: c.name.clone(),
            init: true,
            sidecar: c.is_sidecar(),
            resources: c
                .resources
                .resolve(&format!("spec.initContainers[{i}].resources"))?,
        });
    }
    for (i, c) in pod.spec.containers.iter().enumerate() {
        all.push(SpecContainer {
            name: c.name.clone(),
            init: false,
            sidecar: false,
            resources: c
                .resources
                .resolve(&format!("spec.containers[{i}].resources"))?,
        });
    }
    Ok(all)
}

/// The pod-level memory request beyond the containers', spread evenly over
/// them (helpers.go); 0 without a pod-level request.
fn pod_level_share(all: &[SpecContainer], pod_level: Option<Resolved>) -> u64 {
    let Some(pod_req) = pod_level.and_then(|p| p.requests.memory) else {
        return 0;
    };
    let running: u64 = all
        .iter()
        .filter(|c| c.runs_with_pod())
        .map(SpecContainer::memory_request)
        .fold(0, u64::saturating_add);
    let init_max = all
        .iter()
        .filter(|c| c.init && !c.sidecar)
        .map(SpecContainer::memory_request)
        .max()
        .unwrap_or(0);
    pod_req.saturating_sub(running.max(init_max)) / all.len().max(1) as u64
}

/// What every container of the explained pod is explained against.
struct PodContext<'a> {
    pod: &'a Pod,
    class: QosClass,
    node: &'a NodeSpec,
    cfg: &'a PolicyConfig,
    kubelet: &'a KubeletMemoryQosSim,
    node_facts: NodeFacts,
    pod_facts: PodFacts,
    pod_path: String,
    pod_level: Option<Resolved>,
    /// Each container's share of the pod-level memory request.
    remaining: u64,
    /// The smallest regular container's memory request (a sidecar's
    /// oom_score_adj is capped by it).
    min_regular: Option<u64>,
    /// The pod as the Kubernetes API source reads it, when explained for it.
    api: Option<crate::kube::facts::ApiPodFacts>,
}

impl PodContext<'_> {
    /// One container: what the kubelet sends, what the policy decides, and
    /// what the kernel ends up with.
    fn explain(&self, c: &SpecContainer) -> ContainerReport {
        let kubelet = self.kubelet_request(c);
        let mem_limit = self.memory_limit(c);
        // The kubelet's Memory QoS request: from the container's own
        // resources (with the requests defaulted to the limits, as the API
        // server does), never the pod-level ones.
        let kubelet_unified = self.kubelet.unified(
            self.class,
            c.memory_request(),
            c.resources.limits.memory,
            self.node,
        );
        let facts = ContainerFacts {
            name: c.name.clone(),
            resources: Resources {
                cpu_shares: Some(kubelet.cpu_shares),
                cpu_quota: self.cpu_limit(c).map(|_| kubelet.cpu_quota),
                cpu_period: Some(f::QUOTA_PERIOD),
                memory_limit: mem_limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX)),
                unified: kubelet_unified.clone(),
            },
            oom_score_adj: Some(kubelet.oom_score_adj),
            api_memory_request: self.api.as_ref().and_then(|f| f.container_request(&c.name)),
            // A runtime that shows plugins the kubelet's keys (containerd
            // 2.2, CRI-O 1.34 and later).
            unified_shown: true,
            ..Default::default()
        };
        let d = policy::decide(&self.pod_facts, &facts, &self.node_facts, self.cfg);
        let eff = policy::effective(&facts.resources, &d.adjustment);
        self.report(c, kubelet, kubelet_unified, &d, &eff)
    }

    /// The CPU limit, falling back to the pod-level one.
    fn cpu_limit(&self, c: &SpecContainer) -> Option<u64> {
        c.resources
            .limits
            .cpu_milli
            .or(self.pod_level.and_then(|p| p.limits.cpu_milli))
    }

    /// The memory limit, falling back to the pod-level one.
    fn memory_limit(&self, c: &SpecContainer) -> Option<u64> {
        c.resources
            .limits
            .memory
            .or(self.pod_level.and_then(|p| p.limits.memory))
    }

    /// The CRI values kuberuntime computes for the container.
    fn kubelet_request(&self, c: &SpecContainer) -> KubeletRequest {
        let cpu_limit = self.cpu_limit(c);
        let cpu_request = c.resources.requests.cpu_milli.or(cpu_limit);
        KubeletRequest {
            cpu_shares: f::milli_cpu_to_shares(cpu_request.unwrap_or(0)),
            cpu_quota: cpu_limit.map_or(0, |m| f::milli_cpu_to_quota(m, f::QUOTA_PERIOD)),
            cpu_period: f::QUOTA_PERIOD,
            memory_limit: self.memory_limit(c).unwrap_or(0),
            oom_score_adj: kubelet::oom_score_adj(
                self.pod,
                self.class,
                c.memory_request(),
                self.remaining,
                self.min_regular.filter(|_| c.sidecar),
                self.node.memory_capacity,
            ),
        }
    }

    /// The kernel values from the effective resources `eff` after decision `d`.
    fn report(
        &self,
        c: &SpecContainer,
        kubelet: KubeletRequest,
        kubelet_unified: BTreeMap<String, String>,
        d: &Decision,
        eff: &Resources,
    ) -> ContainerReport {
        let unified = |k: &str| eff.unified.get(k).and_then(|v| v.parse::<u64>().ok());
        let eff_shares = eff.cpu_shares.unwrap_or(kubelet.cpu_shares);
        let weight = unified("cpu.weight").unwrap_or_else(|| match self.cfg.cpu_weight {
            WeightConversion::Linear => f::cpu_weight_linear(eff_shares),
            // What runc >= 1.3.2 / crun >= 1.23 write when we leave it to them.
            _ => f::cpu_weight_quadratic(eff_shares),
        });
        let period = eff.cpu_period.unwrap_or(f::QUOTA_PERIOD);
        let cpu_max = match eff.cpu_quota {
            Some(q) if q > 0 => format!("{q} {period}"),
            _ => format!("max {period}"),
        };
        let memory_max = eff.memory_limit.and_then(|l| u64::try_from(l).ok());
        let memory_high = unified("memory.high");
        let memory_request_range = (d.request_source == RequestSource::OomScoreAdj)
            .then(|| {
                f::memory_request_range_from_oom_score_adj(
                    kubelet.oom_score_adj,
                    self.node.memory_capacity,
                )
            })
            .flatten()
            .map(|r| (r.start, (r.end != u64::MAX).then_some(r.end)));
        ContainerReport {
            name: c.name.clone(),
            init: c.init,
            sidecar: c.sidecar,
            cgroup_path: container_cgroup(self.node.driver, &self.pod_path, "<container-id>"),
            cpu_shares: eff_shares,
            cpu_weight: weight,
            cpu_max,
            memory_min: unified("memory.min").unwrap_or(0),
            memory_low: unified("memory.low").unwrap_or(0),
            memory_high: bytes_or_max(memory_high),
            memory_max: bytes_or_max(memory_max),
            throttle_guard: self.class != QosClass::Guaranteed
                && memory_high.is_some_and(|h| memory_max.is_none_or(|max| h < max)),
            oom_score_adj: d.adjustment.oom_score_adj.unwrap_or(kubelet.oom_score_adj),
            memory_request: d.memory_request,
            memory_request_source: d.request_source,
            set_by: set_by(&d.adjustment, &kubelet_unified),
            kubelet,
            memory_request_range,
            kubelet_unified,
        }
    }
}

/// Who sets each cgroup value: nri-qos where the adjustment does, else the
/// kubelet where its Memory QoS sends the key, else the runtime.
fn set_by(adj: &Adjustment, kubelet_unified: &BTreeMap<String, String>) -> BTreeMap<String, Owner> {
    let owner = |set_by_us: bool, from_kubelet: bool| match (set_by_us, from_kubelet) {
        (true, _) => Owner::NriQos,
        (false, true) => Owner::Kubelet,
        (false, false) => Owner::Runtime,
    };
    let mut set_by = BTreeMap::new();
    for key in ["cpu.weight", "memory.min", "memory.low", "memory.high"] {
        set_by.insert(
            key.to_string(),
            owner(
                adj.unified.contains_key(key),
                kubelet_unified.contains_key(key),
            ),
        );
    }
    set_by.insert("cpu.max".into(), owner(adj.cpu_quota.is_some(), false));
    set_by.insert(
        "memory.max".into(),
        owner(adj.memory_limit.is_some(), false),
    );
    set_by.insert(
        "oom_score_adj".into(),
        owner(adj.oom_score_adj.is_some(), false),
    );
    set_by
}

/// The pod-level cgroup: the kubelet writes it itself (Σ requests, with
/// any RuntimeClass overhead, or the pod-level request, `kubelet_pod`)
/// when its Memory QoS protects the pod, and the hierarchy keeper then
/// leaves it alone; otherwise the keeper sums the protection of the
/// containers that run with the pod.
fn pod_cgroup(
    pod_path: &str,
    containers: &[ContainerReport],
    kubelet_pod: Option<(&str, u64)>,
) -> Value {
    if let Some((key, value)) = kubelet_pod {
        let of = |k: &str| if k == key { value } else { 0 };
        return json!({
            "cgroupPath": pod_path,
            "memoryMin": of("memory.min"),
            "memoryLow": of("memory.low"),
            "owner": Owner::Kubelet,
        });
    }
    let running = || containers.iter().filter(|c| !c.init || c.sidecar);
    let kubelet_sum = |key: &str| {
        running()
            .filter_map(|c| c.kubelet_unified.get(key))
            .filter_map(|v| v.parse::<u64>().ok())
            .fold(0u64, u64::saturating_add)
    };
    let (kubelet_min, kubelet_low) = (kubelet_sum("memory.min"), kubelet_sum("memory.low"));
    if kubelet_min.saturating_add(kubelet_low) > 0 {
        return json!({
            "cgroupPath": pod_path,
            "memoryMin": kubelet_min,
            "memoryLow": kubelet_low,
            "owner": Owner::Kubelet,
        });
    }
    json!({
        "cgroupPath": pod_path,
        "memoryMin": running().map(|c| c.memory_min).fold(0u64, u64::saturating_add),
        "memoryLow": running().map(|c| c.memory_low).fold(0u64, u64::saturating_add),
        "owner": Owner::NriQos,
    })
}

#[cfg(test)]
mod tests;
