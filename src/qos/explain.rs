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
    pub oom_score_adj: i64,
    /// The memory request the policy worked with, and where it came from.
    pub memory_request: Option<u64>,
    pub memory_request_source: RequestSource,
    /// What the kubelet sends the runtime for this container, before any
    /// plugin (the CRI `LinuxContainerResources`).
    pub kubelet: KubeletRequest,
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

/// Explains a Pod manifest.
pub fn explain(yaml: &str, node: &NodeSpec, cfg: &PolicyConfig) -> Result<PodReport, ExplainError> {
    let pod = parse_pod(yaml)?;
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
                .sum();
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
    };

    let mut containers = Vec::new();
    let (mut pod_min, mut pod_low) = (0u64, 0u64);
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
        let facts = ContainerFacts {
            name: name.clone(),
            resources: Resources {
                cpu_shares: Some(shares),
                cpu_quota: quota,
                cpu_period: Some(f::QUOTA_PERIOD),
                memory_limit: mem_limit.map(|l| l.min(i64::MAX as u64) as i64),
                unified: Default::default(),
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
            pod_min += min;
            pod_low += low;
        }
        let container_path = match node.driver {
            Driver::Cgroupfs => format!("{pod_path}/<container-id>"),
            Driver::Systemd => format!("{pod_path}/cri-containerd-<container-id>.scope"),
        };
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
        pod_cgroup: json!({
            "cgroupPath": pod_path,
            "memoryMin": pod_min,
            "memoryLow": pod_low,
        }),
    })
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
            match c.memory_request {
                Some(b) => format!("{} ({:?})", human_bytes(b), c.memory_request_source),
                None => format!("- ({:?})", c.memory_request_source),
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
    ]);
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
        explain(yaml, &NODE, &PolicyConfig::default()).unwrap()
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
    fn node_critical_and_systemd_paths() {
        let yaml = "metadata: {name: c, uid: a-b}\nspec:\n  priorityClassName: system-node-critical\n  containers:\n  - name: app\n    resources: {requests: {memory: 256Mi}}\n";
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
    }
}
