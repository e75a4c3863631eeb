//! `nri-qos explain pod.yaml`: every kernel value a Pod will get.
//!
//! Simulates what the kubelet sends the runtime for each container (cgroup
//! parent, CPU shares/quota, memory limit, oom_score_adj, with its formulas
//! from kubelet-qos.md), runs the same [`decide`](super::decide) the plugin
//! runs, and reports what the kernel ends up with: the runtime's value where
//! we leave it alone, ours where we set it.

use serde::Serialize;
use serde_json::{json, Value};
use thiserror::Error;

use super::formulas as f;
use super::pod::{parse_pod, CpuMem, ManifestError, Pod, Resolved};
use super::policy::{self, PolicyConfig, WeightConversion};
use super::{ContainerFacts, NodeFacts, PodFacts, QosClass, RequestSource, Resources};
use crate::cgroup::plan::Owner;

#[derive(Debug, Error)]
pub enum ExplainError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// cgroup driver of the kubelet and runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
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

/// The kubelet's Memory QoS as `explain` simulates it (KEP-2570,
/// kubelet-qos.md §4): which protection it sends in the CRI `unified` map
/// and its memoryThrottlingFactor (memory.high), if any.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KubeletMemoryQosSim {
    pub mode: KubeletMode,
    pub throttling_factor: Option<f64>,
    /// The BestEffort memory.high fix (in the 1.37 beta): BestEffort gets
    /// memory.high from node allocatable; before it, none.
    pub besteffort_high: bool,
}

/// Protection the kubelet writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KubeletMode {
    /// No Memory QoS protection (gate off, or 1.36+ `memoryReservationPolicy: None`).
    #[default]
    None,
    /// 1.27-1.35: memory.min = request on every container, pod, QoS cgroup.
    Alpha,
    /// 1.36+ TieredReservation: Guaranteed memory.min, Burstable memory.low.
    Tiered,
}

impl KubeletMemoryQosSim {
    /// Defaults of a kubelet `major.minor` with the given mode (`None`: its
    /// default): before 1.37 the gate is off; 1.37 turns it on with the
    /// `None` reservation policy and no factor, so nothing is written unless
    /// configured. The factor defaults to 0.9 before 1.37 and to none after.
    pub fn for_version(
        version: &str,
        mode: Option<KubeletMode>,
        factor: Option<f64>,
    ) -> Result<Self, String> {
        let minor = version
            .trim_start_matches('v')
            .strip_prefix("1.")
            .and_then(|m| m.split('.').next())
            .and_then(|m| m.parse::<u32>().ok())
            .ok_or_else(|| format!("kubelet version must look like 1.37, not {version:?}"))?;
        let mode = mode.unwrap_or_default();
        match mode {
            KubeletMode::Alpha if !(27..=35).contains(&minor) => {
                return Err(format!(
                "the alpha Memory QoS (memory.min everywhere) is kubelet 1.27-1.35, not 1.{minor}"
            ))
            }
            KubeletMode::Tiered if minor < 36 => {
                return Err(format!(
                    "TieredReservation needs kubelet 1.36 or later, not 1.{minor}"
                ))
            }
            _ => {}
        }
        if let Some(f) = factor {
            if !(f.is_finite() && f > 0.0 && f <= 1.0) {
                return Err(format!(
                    "memory throttling factor must be in (0, 1], not {f}"
                ));
            }
        }
        let throttling_factor = match (mode, factor) {
            (KubeletMode::None, _) => None,
            (_, Some(f)) => Some(f),
            (_, None) if minor < 37 => Some(0.9),
            (_, None) => None,
        };
        Ok(KubeletMemoryQosSim {
            mode,
            throttling_factor,
            besteffort_high: minor >= 37,
        })
    }

    /// The Memory QoS keys the kubelet puts in a container's `unified` map.
    pub fn unified(
        &self,
        class: QosClass,
        request: u64,
        limit: Option<u64>,
        node: &NodeSpec,
    ) -> std::collections::BTreeMap<String, String> {
        let mut m = std::collections::BTreeMap::new();
        if self.mode == KubeletMode::None || !node.cgroup_v2 {
            return m;
        }
        let key = match (self.mode, class) {
            (KubeletMode::Tiered, QosClass::Burstable) => Some("memory.low"),
            (_, QosClass::BestEffort) => None,
            _ => Some("memory.min"),
        };
        if let (Some(k), true) = (key, request > 0) {
            m.insert(k.to_string(), request.to_string());
        }
        let high = match (class, self.throttling_factor) {
            (QosClass::Guaranteed, _) | (_, None) => None,
            (QosClass::BestEffort, Some(_)) if !self.besteffort_high => None,
            (_, Some(f)) => {
                f::memory_high(request, limit, node.memory_allocatable, f, node.page_size)
            }
        };
        if let Some(h) = high {
            m.insert("memory.high".into(), h.to_string());
        }
        m
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
    /// A finite memory.high below memory.max: where the monitor runs, its
    /// throttle guard watches this container (`[throttle]`) and raises
    /// memory.high to memory.max when it stays throttled.
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
}

/// kubelet `ComputePodQOS`, including pod-level resources (KEP-2837).
pub fn pod_qos(pod: &Pod) -> Result<(QosClass, String), ManifestError> {
    if let Some(r) = &pod.spec.resources {
        let r = r.resolve("spec.resources")?;
        let class = resolved_class(&r);
        return Ok((
            class,
            format!("pod-level resources decide ({})", class_rule(class)),
        ));
    }
    let mut classes = Vec::new();
    for (i, c) in pod.spec.init_containers.iter().enumerate() {
        classes.push(resolved_class(
            &c.resources
                .resolve(&format!("spec.initContainers[{i}].resources"))?,
        ));
    }
    for (i, c) in pod.spec.containers.iter().enumerate() {
        classes.push(resolved_class(
            &c.resources
                .resolve(&format!("spec.containers[{i}].resources"))?,
        ));
    }
    let all = |k| classes.iter().all(|c| *c == k);
    let class = if all(QosClass::Guaranteed) {
        QosClass::Guaranteed
    } else if all(QosClass::BestEffort) {
        QosClass::BestEffort
    } else {
        QosClass::Burstable
    };
    Ok((class, class_rule(class).to_string()))
}

fn class_rule(c: QosClass) -> &'static str {
    match c {
        QosClass::Guaranteed => "every container has CPU and memory limits equal to its requests",
        QosClass::BestEffort => "no container has CPU or memory requests or limits",
        QosClass::Burstable => "some requests are below their limits or some limits are missing",
    }
}

/// One container's (or the pod level's) class: G-like when CPU and memory
/// both have limits equal to requests, BE-like when nothing is set.
fn resolved_class(r: &Resolved) -> QosClass {
    let none = r.requests == CpuMem::default() && r.limits == CpuMem::default();
    if none {
        return QosClass::BestEffort;
    }
    let g = |req: Option<u64>, lim: Option<u64>| lim.is_some() && req == lim;
    if g(r.requests.cpu_milli, r.limits.cpu_milli) && g(r.requests.memory, r.limits.memory) {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

fn is_node_critical(pod: &Pod) -> bool {
    pod.spec.priority_class_name == "system-node-critical"
}

/// kubelet `GetContainerOOMScoreAdjust` (policy.go, v1.34 era).
#[allow(clippy::too_many_arguments)]
fn kubelet_oom(
    pod: &Pod,
    class: QosClass,
    mem_request: u64,
    remaining: u64,
    sidecar: bool,
    min_regular_request: Option<u64>,
    capacity: u64,
) -> i64 {
    if is_node_critical(pod) {
        return f::GUARANTEED_OOM_SCORE_ADJ;
    }
    match class {
        QosClass::Guaranteed => return f::GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => return f::BESTEFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {}
    }
    let cap = capacity.max(1) as u128;
    let raw = |req: u64| 1000 - (1000 * (req as u128 + remaining as u128) / cap).min(2000) as i64;
    let mut adj = raw(mem_request);
    if sidecar {
        if let Some(min_req) = min_regular_request {
            adj = adj.min(raw(min_req));
        }
    }
    if adj < 1000 + f::GUARANTEED_OOM_SCORE_ADJ {
        return 3;
    }
    if adj == 1000 {
        return 999;
    }
    adj
}

fn pod_cgroup_parent(class: QosClass, uid: &str, driver: Driver) -> (String, String) {
    match driver {
        Driver::Cgroupfs => {
            let qos = match class {
                QosClass::Guaranteed => "",
                QosClass::Burstable => "/burstable",
                QosClass::BestEffort => "/besteffort",
            };
            let parent = format!("/kubepods{qos}/pod{uid}");
            (parent.clone(), parent)
        }
        Driver::Systemd => {
            let qos = match class {
                QosClass::Guaranteed => "",
                QosClass::Burstable => "-burstable",
                QosClass::BestEffort => "-besteffort",
            };
            let escaped = uid.replace('-', "_");
            let slice = format!("kubepods{qos}-pod{escaped}.slice");
            let mut path = "/kubepods.slice".to_string();
            if !qos.is_empty() {
                path.push_str(&format!("/kubepods{qos}.slice"));
            }
            path.push_str(&format!("/{slice}"));
            (slice, path)
        }
    }
}

fn bytes_or_max(v: Option<u64>) -> Value {
    v.map_or(json!("max"), |b| json!(b))
}

/// Explains a Pod manifest for a kubelet without Memory QoS.
pub fn explain(yaml: &str, node: &NodeSpec, cfg: &PolicyConfig) -> Result<PodReport, ExplainError> {
    explain_with(yaml, node, cfg, &KubeletMemoryQosSim::default())
}

/// Explains a Pod manifest next to the kubelet's Memory QoS as `kubelet`
/// describes it. The runtime is taken to show plugins the kubelet's
/// `unified` keys (containerd 2.2+); older ones hide them and nri-qos then
/// also leaves memory.high alone on the pods the kubelet protects.
pub fn explain_with(
    yaml: &str,
    node: &NodeSpec,
    cfg: &PolicyConfig,
    kubelet: &KubeletMemoryQosSim,
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
    let uid = if pod.metadata.uid.is_empty() {
        "00000000-0000-0000-0000-000000000000".to_string()
    } else {
        pod.metadata.uid.clone()
    };
    let (cgroup_parent, pod_path) = pod_cgroup_parent(class, &uid, node.driver);
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
        let oom = kubelet_oom(
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
                memory_limit: mem_limit.map(|l| l.min(i64::MAX as u64) as i64),
                unified: kubelet_unified.clone(),
            },
            oom_score_adj: Some(oom),
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
        let container_path = match node.driver {
            Driver::Cgroupfs => format!("{pod_path}/<container-id>"),
            Driver::Systemd => format!("{pod_path}/cri-containerd-<container-id>.scope"),
        };
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
    let sandbox_path = match node.driver {
        Driver::Cgroupfs => format!("{pod_path}/<sandbox-id>"),
        Driver::Systemd => format!("{pod_path}/cri-containerd-<sandbox-id>.scope"),
    };
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
    })
}

/// The README's big-nodes table: how well a Burstable request can be
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

/// The report as a readable table.
pub fn render_table(r: &PodReport) -> String {
    let mut out = format!("pod {}: {:?} ({})\n", r.pod, r.qos_class, r.reason);
    out.push_str(&format!(
        "pod cgroup: {}\n\n",
        r.pod_cgroup["cgroupPath"].as_str().unwrap_or("?")
    ));
    let mut rows = vec![[
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
    ]
    .map(String::from)];
    for c in &r.containers {
        let kind = if c.sidecar {
            " (sidecar)"
        } else if c.init {
            " (init)"
        } else {
            ""
        };
        rows.push([
            format!("{}{kind}", c.name),
            format!("{} ({} shares)", c.cpu_weight, c.cpu_shares),
            c.cpu_max.clone(),
            human_bytes(c.memory_min),
            human_bytes(c.memory_low),
            human(&c.memory_high),
            human(&c.memory_max),
            c.oom_score_adj.to_string(),
            match (c.memory_request, c.memory_request_range) {
                (Some(_), Some((from, to))) => format!(
                    "{}..{} ({:?})",
                    human_bytes(from),
                    to.map_or("".into(), human_bytes),
                    c.memory_request_source
                ),
                (Some(b), None) => format!("{} ({:?})", human_bytes(b), c.memory_request_source),
                (None, _) => format!("- ({:?})", c.memory_request_source),
            },
            {
                let k: Vec<&str> = c
                    .set_by
                    .iter()
                    .filter(|(_, o)| **o == Owner::Kubelet)
                    .map(|(k, _)| k.as_str())
                    .collect();
                if k.is_empty() {
                    "-".into()
                } else {
                    k.join(",")
                }
            },
        ]);
    }
    rows.push([
        "(pod sandbox)".into(),
        "1 (2 shares)".into(),
        "max 100000".into(),
        "0".into(),
        "0".into(),
        "max".into(),
        "max".into(),
        "-998".into(),
        "-".into(),
        "-".into(),
    ]);
    rows.push([
        "(pod cgroup)".into(),
        "-".into(),
        "-".into(),
        human(&r.pod_cgroup["memoryMin"]),
        human(&r.pod_cgroup["memoryLow"]),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        if r.pod_cgroup["owner"] == "kubelet" {
            "memory.min,memory.low".into()
        } else {
            "-".into()
        },
    ]);
    let guarded: Vec<&str> = r
        .containers
        .iter()
        .filter(|c| c.throttle_guard)
        .map(|c| c.name.as_str())
        .collect();
    let footer = (!guarded.is_empty()).then(|| {
        format!(
            "\nthrottle guard ({}): where the monitor runs, a container that stays throttled at its memory.high \
             past [throttle] grace-period gets memory.high = memory.max; if the stall persists, its pod is evicted \
             in the node-pressure order.\n",
            guarded.join(", ")
        )
    });
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|row| row[i].len()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(footer.as_deref().unwrap_or(""));
    if r.containers.iter().any(|c| !c.kubelet_unified.is_empty()) {
        out.push_str("\nThe last column is what the kubelet's Memory QoS sets; nri-qos adds the other cpu.weight and memory values and any oom_score_adj change.\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: NodeSpec = NodeSpec {
        memory_capacity: 16 << 30,
        memory_allocatable: 15 << 30,
        page_size: 4096,
        driver: Driver::Cgroupfs,
        cgroup_v2: true,
    };

    fn one(yaml: &str) -> PodReport {
        let yaml = format!("kind: Pod\n{yaml}");
        explain(&yaml, &NODE, &PolicyConfig::default()).unwrap()
    }

    #[test]
    fn guaranteed_one_cpu_one_gi() {
        let r = one("metadata: {name: g, uid: abc}\nspec:\n  containers:\n  - name: app\n    resources:\n      limits: {cpu: '1', memory: 1Gi}\n");
        assert_eq!(r.qos_class, QosClass::Guaranteed);
        let c = &r.containers[0];
        assert_eq!((c.cpu_shares, c.cpu_weight), (1024, 100));
        assert_eq!(c.cpu_max, "100000 100000");
        assert_eq!(c.memory_min, 1 << 30);
        assert_eq!(c.memory_high, json!("max"));
        assert!(!c.throttle_guard);
        assert_eq!(c.memory_max, json!(1u64 << 30));
        assert_eq!(c.oom_score_adj, -997);
        assert_eq!(c.cgroup_path, "/kubepods/podabc/<container-id>");
    }

    #[test]
    fn burstable_vector_row_4() {
        let r = one("metadata: {name: b}\nspec:\n  containers:\n  - name: app\n    resources:\n      requests: {cpu: 100m, memory: 128Mi}\n      limits: {cpu: 500m, memory: 512Mi}\n");
        assert_eq!(r.qos_class, QosClass::Burstable);
        let c = &r.containers[0];
        assert_eq!((c.cpu_shares, c.cpu_weight), (102, 17));
        assert_eq!(c.cpu_max, "50000 100000");
        assert_eq!(c.oom_score_adj, 993);
        // The request is recovered from oom_score_adj, as the plugin would.
        assert_eq!(c.memory_low, 120_258_560);
        assert_eq!(c.memory_request_source, RequestSource::OomScoreAdj);
    }

    #[test]
    fn sidecar_takes_the_smallest_regular_adj() {
        // §8 row 10: sidecar 64Mi (own 997), app 512Mi (969) → sidecar 969.
        let r = one("metadata: {name: s}\nspec:\n  initContainers:\n  - name: proxy\n    restartPolicy: Always\n    resources: {requests: {memory: 64Mi}}\n  containers:\n  - name: app\n    resources: {requests: {memory: 512Mi}}\n");
        assert_eq!(r.containers[0].name, "proxy");
        assert!(r.containers[0].sidecar);
        assert_eq!(r.containers[0].oom_score_adj, 969);
        assert_eq!(r.containers[1].oom_score_adj, 969);
    }

    #[test]
    fn pod_level_resources_decide_the_class_and_spread_the_request() {
        // §8 row 11: pod req 2Gi/1 CPU, lim 4Gi/2 CPU; two empty containers → 938 each.
        let r = one("metadata: {name: pl}\nspec:\n  resources:\n    requests: {cpu: '1', memory: 2Gi}\n    limits: {cpu: '2', memory: 4Gi}\n  containers:\n  - name: a\n  - name: b\n");
        assert_eq!(r.qos_class, QosClass::Burstable);
        for c in &r.containers {
            assert_eq!(c.oom_score_adj, 938, "{c:?}");
            assert_eq!(c.cpu_max, "200000 100000");
            assert_eq!(c.cpu_shares, 2048);
            assert_eq!(c.memory_max, json!(4u64 << 30));
        }
    }

    #[test]
    fn a_manifest_without_kind_is_an_error_naming_it() {
        let yaml = "spec: {containers: [{name: a}]}";
        let err = explain(yaml, &NODE, &PolicyConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("kind: missing"), "{err}");
    }

    #[test]
    fn huge_requests_saturate_instead_of_wrapping() {
        let r = one("metadata: {name: h}\nspec:\n  resources:\n    requests: {memory: 8Ei}\n  containers:\n  - name: a\n    resources: {requests: {memory: 8Ei}}\n  - name: b\n    resources: {requests: {memory: 8Ei}}\n");
        assert_eq!(r.containers.len(), 2);
    }

    #[test]
    fn node_critical_and_systemd_paths() {
        let yaml = "kind: Pod\nmetadata: {name: c, uid: a-b}\nspec:\n  priorityClassName: system-node-critical\n  containers:\n  - name: app\n    resources: {requests: {memory: 256Mi}}\n";
        let node = NodeSpec {
            driver: Driver::Systemd,
            ..NODE
        };
        let r = explain(yaml, &node, &PolicyConfig::default()).unwrap();
        assert_eq!(r.containers[0].oom_score_adj, -997);
        assert_eq!(
            r.containers[0].cgroup_path,
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda_b.slice/cri-containerd-<container-id>.scope"
        );
    }

    #[test]
    fn besteffort_gets_memory_high_from_allocatable() {
        let r = one("metadata: {name: e}\nspec:\n  containers:\n  - name: app\n");
        assert_eq!(r.qos_class, QosClass::BestEffort);
        let c = &r.containers[0];
        assert_eq!(c.oom_score_adj, 1000);
        assert_eq!(c.memory_high, json!(14_495_514_624u64));
        assert_eq!(c.cpu_weight, 1);
        assert!(c.throttle_guard);
        assert!(render_table(&r).contains("throttle guard (app)"));
    }

    #[test]
    fn readme_big_nodes_table_is_computed() {
        let table = inversion_table(&[16, 64, 128, 256, 512]);
        let readme = include_str!("../../README.md");
        assert!(
            readme.contains(&table),
            "README.md must carry this table (section \"With the kubelet's Memory QoS\"):\n{table}"
        );
        // §5: 16 GiB → ~17 MB resolution.
        assert!(table.contains("| 16 GiB | 16.4 MiB |"), "{table}");
    }

    const ROW4: &str = "metadata: {name: b}\nspec:\n  containers:\n  - name: app\n    resources:\n      requests: {cpu: 100m, memory: 128Mi}\n      limits: {cpu: 500m, memory: 512Mi}\n";

    fn with_kubelet(version: &str, mode: KubeletMode, factor: Option<f64>) -> PodReport {
        let k = KubeletMemoryQosSim::for_version(version, Some(mode), factor).unwrap();
        let yaml = format!("kind: Pod\n{ROW4}");
        explain_with(&yaml, &NODE, &PolicyConfig::default(), &k).unwrap()
    }

    #[test]
    fn inverted_requests_are_shown_as_the_interval_they_lie_in() {
        let c = &one(ROW4).containers[0];
        // §5 route 2: adj 993 on 16 GiB → [120.3 MB, 137.4 MB).
        assert_eq!(
            c.memory_request_range,
            Some((120_259_085, Some(137_438_954)))
        );
        assert!(render_table(&one(ROW4)).contains(".."));
    }

    #[test]
    fn kubelet_memory_qos_values_are_marked_and_never_replaced() {
        let owner = |r: &PodReport, k: &str| r.containers[0].set_by[k];
        // 1.37 TieredReservation, no factor: memory.low is the kubelet's,
        // exact; memory.high is ours (the kubelet sets none).
        let r = with_kubelet("1.37", KubeletMode::Tiered, None);
        let c = &r.containers[0];
        assert_eq!(c.memory_low, 128 << 20);
        assert_eq!(c.memory_request_source, RequestSource::UnifiedMemoryLow);
        assert_eq!(c.memory_request_range, None);
        assert_eq!(owner(&r, "memory.low"), Owner::Kubelet);
        assert_eq!(owner(&r, "memory.high"), Owner::NriQos);
        assert_eq!(c.memory_high, json!(496_603_136u64));
        assert_eq!(r.pod_cgroup["owner"], "kubelet");
        assert_eq!(r.pod_cgroup["memoryLow"], 128u64 << 20);
        // With factor 0.9 the kubelet's memory.high stands.
        let r = with_kubelet("1.37", KubeletMode::Tiered, Some(0.9));
        assert_eq!(owner(&r, "memory.high"), Owner::Kubelet);
        assert_eq!(r.containers[0].memory_high, json!(496_603_136u64));
        // 1.34 alpha: memory.min and memory.high (0.9 default) are the kubelet's.
        let r = with_kubelet("1.34", KubeletMode::Alpha, None);
        assert_eq!(r.containers[0].memory_min, 128 << 20);
        assert_eq!(r.containers[0].memory_low, 0);
        assert_eq!(owner(&r, "memory.min"), Owner::Kubelet);
        assert_eq!(owner(&r, "memory.high"), Owner::Kubelet);
        assert_eq!(owner(&r, "cpu.weight"), Owner::NriQos);
        // No Memory QoS: everything as before, ours.
        let r = with_kubelet("1.37", KubeletMode::None, None);
        assert_eq!(owner(&r, "memory.low"), Owner::NriQos);
        assert_eq!(r.pod_cgroup["owner"], "nri-qos");
        // Versions and modes that do not exist together are refused.
        assert!(KubeletMemoryQosSim::for_version("1.37", Some(KubeletMode::Alpha), None).is_err());
        assert!(KubeletMemoryQosSim::for_version("1.35", Some(KubeletMode::Tiered), None).is_err());
        assert!(KubeletMemoryQosSim::for_version("x", None, None).is_err());
        assert!(
            KubeletMemoryQosSim::for_version("1.37", Some(KubeletMode::Tiered), Some(1.5)).is_err()
        );
    }

    #[test]
    fn json_shape_is_stable() {
        let r = one("metadata: {name: g, namespace: ns}\nspec:\n  containers:\n  - name: app\n    resources: {limits: {cpu: '1', memory: 1Gi}}\n");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["pod"], "ns/g");
        assert_eq!(v["qosClass"], "Guaranteed");
        for key in [
            "name",
            "init",
            "cgroupPath",
            "cpuShares",
            "cpuWeight",
            "cpuMax",
            "memoryMin",
            "memoryLow",
            "memoryHigh",
            "memoryMax",
            "oomScoreAdj",
        ] {
            assert!(v["containers"][0].get(key).is_some(), "missing {key}");
        }
        assert_eq!(
            v["cgroupParent"],
            "/kubepods/pod00000000-0000-0000-0000-000000000000"
        );
        let k = &v["containers"][0]["kubelet"];
        for (key, want) in [
            ("cpuShares", json!(1024)),
            ("cpuQuota", json!(100_000)),
            ("cpuPeriod", json!(100_000)),
            ("memoryLimit", json!(1u64 << 30)),
            ("oomScoreAdj", json!(-997)),
        ] {
            assert_eq!(k[key], want, "kubelet.{key}");
        }
        assert!(render_table(&r).contains("Guaranteed"));
        // Added for issue 14 (only ever add keys).
        for key in ["memoryRequestRange", "kubeletUnified", "setBy"] {
            assert!(v["containers"][0].get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["podCgroup"]["owner"], "nri-qos");
    }
}
