//! The policy: class, recovered requests, and the settings each class gets.
//!
//! Pure and infallible: every odd input leads to "leave it alone" plus a
//! note, never a panic or an error (a runtime fails container creation when
//! a plugin returns an error).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::formulas::{self as f, MAX_SHARES, MIN_SHARES};
use super::quantity;
use super::{
    Adjustment, ContainerFacts, Decision, NodeFacts, PodFacts, QosClass, RequestSource, Resources,
};
use crate::node::layout::pod_class;

/// Pod annotation with an explicit memory request for every container of the
/// pod without its own (a Kubernetes quantity, e.g. `256Mi`).
pub const MEMORY_REQUEST_ANNOTATION: &str = "memory-request.qos.nri-qos.io";
/// Per-container form: `memory-request.qos.nri-qos.io/<container-name>`.
pub const MEMORY_REQUEST_ANNOTATION_PREFIX: &str = "memory-request.qos.nri-qos.io/";
/// Pod annotation `memory-high.qos.nri-qos.io: "off"` opts a pod out of memory.high.
pub const MEMORY_HIGH_ANNOTATION: &str = "memory-high.qos.nri-qos.io";
/// containerd's annotation telling the sandbox (pause) container apart.
pub const CONTAINER_TYPE_ANNOTATION: &str = "io.kubernetes.cri.container-type";

/// Whether the policy reads the pod annotation `key`; no other is kept
/// of a pod the runtime describes in Synchronize.
pub fn reads_pod_annotation(key: &str) -> bool {
    key == MEMORY_REQUEST_ANNOTATION
        || key == MEMORY_HIGH_ANNOTATION
        || key.starts_with(MEMORY_REQUEST_ANNOTATION_PREFIX)
}

/// Whether the policy reads the container annotation `key`.
pub fn reads_container_annotation(key: &str) -> bool {
    key == CONTAINER_TYPE_ANNOTATION
}

/// How shares become cgroup v2 `cpu.weight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightConversion {
    /// runc ≥ 1.3.2 / crun ≥ 1.23: 1 CPU (1024 shares) → 100, like a systemd service.
    Quadratic,
    /// KEP-2254 linear: 1 CPU → 39.
    Linear,
    /// Do not set cpu.weight; the runtime converts shares itself.
    Off,
}

/// Which memory protection requests buy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reservation {
    /// Guaranteed: memory.min = request; Burstable: memory.low = request (KEP-2570 1.36).
    Tiered,
    /// memory.min = request for Guaranteed and Burstable (the 1.27 alpha design).
    Min,
    /// No protection.
    None,
}

pub use crate::node::registry::KubeletMemoryQos;

/// Policy configuration (the `[policy]` table of `config/nri-qos.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct PolicyConfig {
    /// shares → cpu.weight conversion on cgroup v2.
    pub cpu_weight: WeightConversion,
    /// Keep cpu.shares within 2..=262144 and quota at least 1000 µs.
    pub clamp_cpu: bool,
    /// Memory protection from requests.
    pub memory_reservation: Reservation,
    /// Set memory.high for Burstable and BestEffort (KEP-2570).
    pub memory_high: bool,
    /// memory.high = request + factor × (limit − request); in (0, 1].
    pub memory_throttling_factor: f64,
    /// Set oom_score_adj by class.
    pub oom_score_adj: bool,
    /// Whether the kubelet's Memory QoS protects memory itself.
    pub kubelet_memory_qos: KubeletMemoryQos,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            cpu_weight: WeightConversion::Quadratic,
            clamp_cpu: true,
            memory_reservation: Reservation::Tiered,
            memory_high: true,
            memory_throttling_factor: 0.9,
            oom_score_adj: true,
            kubelet_memory_qos: KubeletMemoryQos::Auto,
        }
    }
}

/// A `[policy]` value serde accepts but the policy cannot use.
#[derive(Debug, Clone, Copy, PartialEq, Error)]
pub enum PolicyError {
    #[error("policy.memory-throttling-factor must be in (0, 1], not {0}")]
    ThrottlingFactor(f64),
}

impl PolicyConfig {
    /// Checks values serde cannot; the error names the field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let f = self.memory_throttling_factor;
        if !(f.is_finite() && f > 0.0 && f <= 1.0) {
            return Err(PolicyError::ThrottlingFactor(f));
        }
        Ok(())
    }
}

/// True for the pod sandbox (pause) container.
pub fn is_sandbox(container: &ContainerFacts) -> bool {
    container
        .annotations
        .get(CONTAINER_TYPE_ANNOTATION)
        .is_some_and(|t| t == "sandbox")
}

fn cpu_milli_limit(r: &Resources) -> Option<u64> {
    let quota = u64::try_from(r.cpu_quota?).ok().filter(|q| *q > 0)?;
    // As the kernel will see it after the minimum-quota clamp, so the class
    // does not change when our own adjustment is applied.
    let quota = quota.max(f::MIN_QUOTA as u64);
    let period = r.cpu_period.filter(|p| *p > 0).unwrap_or(f::QUOTA_PERIOD);
    Some(quota.saturating_mul(1000) / period)
}

/// Class from what the runtime sees when the kubelet's cgroup parent does
/// not say: BestEffort = no CPU request, no CPU limit, no memory limit;
/// Guaranteed = CPU and memory limits, with the CPU request (from shares)
/// equal to the CPU limit; Burstable otherwise. The memory request is not
/// visible, so it is taken to equal the limit — a pod with a smaller memory
/// request but equal CPU values is classified Guaranteed here.
pub fn class_from_resources(r: &Resources) -> (QosClass, &'static str) {
    let shares = r.cpu_shares.unwrap_or(0);
    let cpu_limit = cpu_milli_limit(r);
    let mem_limit = r.memory_limit.filter(|l| *l > 0);
    if shares <= MIN_SHARES && cpu_limit.is_none() && mem_limit.is_none() {
        return (QosClass::BestEffort, "no CPU request and no limits");
    }
    if let (Some(milli), Some(_)) = (cpu_limit, mem_limit) {
        if f::milli_cpu_to_shares(milli) == shares.clamp(MIN_SHARES, MAX_SHARES) {
            return (
                QosClass::Guaranteed,
                "CPU and memory limits set, CPU request equals the limit",
            );
        }
    }
    (
        QosClass::Burstable,
        "requests below limits or limits missing",
    )
}

/// The pod's class and why.
pub fn classify(pod: &PodFacts, container: &ContainerFacts) -> (QosClass, String) {
    if let Some(class) = pod_class(&pod.cgroup_parent) {
        return (
            class,
            format!("kubelet cgroup parent {}", pod.cgroup_parent),
        );
    }
    if let Some(r) = pod
        .resources
        .as_ref()
        .filter(|r| **r != Resources::default())
    {
        let (c, why) = class_from_resources(r);
        return (c, format!("pod-level resources: {why}"));
    }
    let (c, why) = class_from_resources(&container.resources);
    (c, format!("container resources: {why}"))
}

/// The memory request and where it came from.
pub fn memory_request(
    pod: &PodFacts,
    container: &ContainerFacts,
    class: QosClass,
    node: &NodeFacts,
    notes: &mut Vec<String>,
) -> (Option<u64>, RequestSource) {
    // The kubelet's Memory QoS sends the exact request: memory.min (alpha,
    // and Guaranteed under TieredReservation) or memory.low (Burstable).
    for (key, source) in [
        ("memory.min", RequestSource::UnifiedMemoryMin),
        ("memory.low", RequestSource::UnifiedMemoryLow),
    ] {
        if let Some(v) = container.resources.unified.get(key) {
            match v.trim().parse::<u64>() {
                Ok(b) if b > 0 => return (Some(b), source),
                Ok(_) => {}
                Err(_) => notes.push(format!("ignoring unified {key} {v:?}: not a byte count")),
            }
        }
    }
    let per_container = format!("{MEMORY_REQUEST_ANNOTATION_PREFIX}{}", container.name);
    for key in [per_container.as_str(), MEMORY_REQUEST_ANNOTATION] {
        if let Some(v) = pod.annotations.get(key) {
            match quantity::parse_bytes(v) {
                Ok(b) => return (Some(b), RequestSource::Annotation),
                Err(e) => notes.push(format!("ignoring annotation {key}: {e}")),
            }
        }
    }
    // Exact, and ahead of anything recovered from the CRI values.
    if let Some(r) = container.api_memory_request {
        return match r {
            0 => (None, RequestSource::ApiServer),
            r => (Some(r), RequestSource::ApiServer),
        };
    }
    let limit = memory_limit(&container.resources);
    match class {
        QosClass::BestEffort => (None, RequestSource::BestEffort),
        QosClass::Guaranteed => match limit {
            Some(l) => (Some(l), RequestSource::GuaranteedLimit),
            None => (None, RequestSource::Unknown),
        },
        // Only the kubelet computes oom_score_adj from the request; a value
        // from another client (crictl) says nothing about it.
        QosClass::Burstable if pod_class(&pod.cgroup_parent).is_none() => {
            (None, RequestSource::Unknown)
        }
        QosClass::Burstable => match container
            .oom_score_adj
            .and_then(|adj| f::memory_request_range_from_oom_score_adj(adj, node.memory_capacity))
        {
            Some(range) => {
                // The adj only pins the request to a range C/1000 wide. When
                // the limit lies in it, request == limit is the reading the
                // kubelet's own data allows (and sets no memory.high); else
                // the lower end, never more than the limit.
                let r = match limit {
                    Some(l) if range.contains(&l) => l,
                    Some(l) => range.start.min(l),
                    None => range.start,
                };
                (Some(r), RequestSource::OomScoreAdj)
            }
            None => (None, RequestSource::Unknown),
        },
    }
}

/// Sets a unified key unless the runtime request already carries it: a value
/// there is the kubelet's (or ours, applied earlier) and is never replaced;
/// claiming it twice would also fail the container in NRI's merge.
fn set_unified(adj: &mut Adjustment, current: &Resources, key: &str, value: String) {
    if !current.unified.contains_key(key) {
        adj.unified.insert(key.to_string(), value);
    }
}

/// True when the runtime request carries the kubelet's Memory QoS protection
/// (a non-zero `unified` memory.min or memory.low).
pub fn kubelet_memory_qos_keys(r: &Resources) -> bool {
    ["memory.min", "memory.low"].iter().any(|k| {
        r.unified
            .get(*k)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|b| b > 0)
    })
}

/// Whether the kubelet protects this container's memory, and whether it may
/// have set memory.high where we cannot see it (`unified_shown`: see
/// [`ContainerFacts::unified_shown`]).
fn kubelet_protection(
    pod: &PodFacts,
    cur: &Resources,
    unified_shown: bool,
    cfg: &PolicyConfig,
) -> (bool, bool) {
    let visible = kubelet_memory_qos_keys(cur);
    let protects = match cfg.kubelet_memory_qos {
        KubeletMemoryQos::None => visible,
        KubeletMemoryQos::Alpha | KubeletMemoryQos::Tiered => true,
        KubeletMemoryQos::Auto => visible || pod.kubelet_memory_qos,
    };
    // No memory.high in a map the runtime shows means none was set.
    let hidden_high = protects
        && !unified_shown
        && match cfg.kubelet_memory_qos {
            KubeletMemoryQos::Alpha | KubeletMemoryQos::Auto => true,
            KubeletMemoryQos::Tiered | KubeletMemoryQos::None => false,
        };
    (protects, hidden_high)
}

/// Computes what a container should get. Never fails.
pub fn decide(
    pod: &PodFacts,
    container: &ContainerFacts,
    node: &NodeFacts,
    cfg: &PolicyConfig,
) -> Decision {
    let (class, reason) = classify(pod, container);
    if is_sandbox(container) {
        return sandbox_decision(container, cfg, class, reason);
    }
    let mut notes = Vec::new();
    let (request, source) = memory_request(pod, container, class, node, &mut notes);
    let page = node.page_size.max(1);
    let cur = &container.resources;
    let shares = clamped_shares(cur);
    let mut d = Decision {
        class,
        reason,
        memory_request: request.map(|r| f::page_align_down(r, page)),
        request_source: source,
        cpu_request_milli: f::shares_to_milli_cpu(shares),
        adjustment: Adjustment::default(),
        notes,
    };
    if cfg.clamp_cpu {
        clamp_cpu(cur, shares, &mut d);
    }
    // cgroup v1: no unified keys (runc rejects them). Said once at start by
    // the plugin, not per container.
    if node.cgroup_v2 {
        set_cpu_weight(cur, cfg, shares, &mut d.adjustment);
        set_memory(pod, container, node, cfg, &mut d);
    }
    if cfg.oom_score_adj {
        d.adjustment.oom_score_adj = oom_score_adj(container, node, d.class, d.memory_request);
    }
    d
}

/// The pod sandbox (pause) container gets only its oom_score_adj.
fn sandbox_decision(
    container: &ContainerFacts,
    cfg: &PolicyConfig,
    class: QosClass,
    reason: String,
) -> Decision {
    let mut adj = Adjustment::default();
    if cfg.oom_score_adj && container.oom_score_adj != Some(f::SANDBOX_OOM_SCORE_ADJ) {
        adj.oom_score_adj = Some(f::SANDBOX_OOM_SCORE_ADJ);
    }
    Decision {
        class,
        reason: format!("{reason}; pod sandbox"),
        memory_request: None,
        request_source: RequestSource::Unknown,
        cpu_request_milli: 0,
        adjustment: adj,
        notes: Vec::new(),
    }
}

/// The CPU shares as the kernel takes them (the minimum when unset).
fn clamped_shares(cur: &Resources) -> u64 {
    cur.cpu_shares
        .unwrap_or(MIN_SHARES)
        .clamp(MIN_SHARES, MAX_SHARES)
}

/// Brings shares and quota into the range the kernel accepts.
fn clamp_cpu(cur: &Resources, clamped: u64, d: &mut Decision) {
    if let Some(shares) = cur.cpu_shares.filter(|s| *s != clamped) {
        d.notes
            .push(format!("cpu shares {shares} clamped to {clamped}"));
        d.adjustment.cpu_shares = Some(clamped);
    }
    if let Some(q) = cur.cpu_quota.filter(|q| *q > 0 && *q < f::MIN_QUOTA) {
        d.notes.push(format!(
            "cpu quota {q} raised to the {} µs minimum",
            f::MIN_QUOTA
        ));
        d.adjustment.cpu_quota = Some(f::MIN_QUOTA);
        if cur.cpu_period.is_none() {
            d.adjustment.cpu_period = Some(f::QUOTA_PERIOD);
        }
    }
}

/// cpu.weight from the shares, by the configured conversion.
fn set_cpu_weight(cur: &Resources, cfg: &PolicyConfig, shares: u64, adj: &mut Adjustment) {
    let weight = match cfg.cpu_weight {
        WeightConversion::Quadratic => Some(f::cpu_weight_quadratic(shares)),
        WeightConversion::Linear => Some(f::cpu_weight_linear(shares)),
        WeightConversion::Off => None,
    };
    if let Some(w) = weight {
        set_unified(adj, cur, "cpu.weight", w.to_string());
    }
}

/// The memory limit in bytes, when one is set.
fn memory_limit(r: &Resources) -> Option<u64> {
    r.memory_limit
        .and_then(|l| u64::try_from(l).ok())
        .filter(|l| *l > 0)
}

/// memory.min or memory.low from the request (unless the kubelet protects
/// the container itself), and memory.high (KEP-2570).
fn set_memory(
    pod: &PodFacts,
    container: &ContainerFacts,
    node: &NodeFacts,
    cfg: &PolicyConfig,
    d: &mut Decision,
) {
    let cur = &container.resources;
    let page = node.page_size.max(1);
    let limit = memory_limit(cur);
    // Cap at the limit first, then align: memory.min ≤ memory.max and whole pages.
    let protected = d
        .memory_request
        .map(|r| f::page_align_down(limit.map_or(r, |l| r.min(l)), page))
        .filter(|r| *r > 0);
    let (kubelet_protects, kubelet_high_hidden) =
        kubelet_protection(pod, cur, container.unified_shown, cfg);
    // Said once per pod cgroup where ownership is decided, not per container.
    if let Some(r) = protected.filter(|_| !kubelet_protects) {
        if let Some(k) = protection_key(cfg.memory_reservation, d.class) {
            set_unified(&mut d.adjustment, cur, k, r.to_string());
        }
    }

    let high_base = memory_high_base(d.class, protected, d.memory_request);
    if cfg.memory_high && d.class == QosClass::Burstable && high_base.is_none() {
        d.notes
            .push("memory request unknown: memory.high left unset".into());
    }
    let opted_out = opted_out_of_memory_high(pod) || kubelet_high_hidden;
    if let (true, false, Some(req)) = (cfg.memory_high, opted_out, high_base) {
        if let Some(h) = f::memory_high(
            req,
            limit,
            node.memory_allocatable,
            cfg.memory_throttling_factor,
            page,
        ) {
            set_unified(&mut d.adjustment, cur, "memory.high", h.to_string());
        }
    }
}

/// The unified key a class's protected request goes into.
fn protection_key(reservation: Reservation, class: QosClass) -> Option<&'static str> {
    match (reservation, class) {
        (Reservation::None, _) | (_, QosClass::BestEffort) => None,
        (Reservation::Tiered, QosClass::Burstable) => Some("memory.low"),
        _ => Some("memory.min"),
    }
}

/// The request memory.high is computed from. BestEffort's request is 0 by
/// definition; a Burstable request we could not recover gets no memory.high,
/// since a guess could throttle the container below what it asked for.
fn memory_high_base(class: QosClass, protected: Option<u64>, request: Option<u64>) -> Option<u64> {
    match class {
        QosClass::BestEffort => Some(0),
        QosClass::Burstable => protected.or(request),
        QosClass::Guaranteed => None,
    }
}

/// The pod's `memory-high.qos.nri-qos.io: "off"` (or `"false"`) annotation.
fn opted_out_of_memory_high(pod: &PodFacts) -> bool {
    pod.annotations
        .get(MEMORY_HIGH_ANNOTATION)
        .is_some_and(|v| v.eq_ignore_ascii_case("off") || v == "false")
}

/// The oom_score_adj to set, when it differs from what the runtime was asked for.
fn oom_score_adj(
    container: &ContainerFacts,
    node: &NodeFacts,
    class: QosClass,
    request: Option<u64>,
) -> Option<i64> {
    let given = container.oom_score_adj;
    let want = match class {
        QosClass::Guaranteed => Some(given.map_or(f::GUARANTEED_OOM_SCORE_ADJ, |g| {
            // Lower values (system daemons, node-critical pods) stay.
            g.min(f::GUARANTEED_OOM_SCORE_ADJ)
        })),
        QosClass::BestEffort => Some(f::BESTEFFORT_OOM_SCORE_ADJ),
        // The kubelet's value already accounts for sidecars, pod-level
        // requests and critical pods, which we cannot see: keep it when
        // it is a Burstable value; compute one only when it is not.
        QosClass::Burstable => match given {
            Some(g) if (3..=999).contains(&g) || g == f::GUARANTEED_OOM_SCORE_ADJ => None,
            _ => Some(f::burstable_oom_score_adj(
                request.unwrap_or(0),
                node.memory_capacity,
            )),
        },
    };
    want.map(|w| w.clamp(-1000, 1000))
        .filter(|w| given != Some(*w))
}

/// One unified key of [`effective`] (ours over the runtime's), without
/// copying the resources: the hooks ask it for every container.
pub fn effective_unified<'a>(
    current: &'a Resources,
    adj: &'a Adjustment,
    key: &str,
) -> Option<&'a str> {
    adj.unified
        .get(key)
        .or_else(|| current.unified.get(key))
        .map(String::as_str)
}

/// What the kernel ends up with for a container: the runtime's values with
/// ours on top. Used by `explain` and `audit`.
pub fn effective(current: &Resources, adj: &Adjustment) -> Resources {
    let mut r = current.clone();
    r.cpu_shares = adj.cpu_shares.or(r.cpu_shares);
    r.cpu_quota = adj.cpu_quota.or(r.cpu_quota);
    r.cpu_period = adj.cpu_period.or(r.cpu_period);
    r.memory_limit = adj.memory_limit.or(r.memory_limit);
    let extra: BTreeMap<String, String> = adj.unified.clone();
    r.unified.extend(extra);
    r
}

#[cfg(test)]
// Tests cast small, known values; the cast lints guard the product code.
#[allow(clippy::cast_sign_loss)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MI: i64 = 1 << 20;
    const GI: i64 = 1 << 30;
    /// kubelet-qos.md §8 assumptions: C = 16 GiB, allocatable 15 GiB, page 4096, v2.
    const NODE: NodeFacts = NodeFacts {
        memory_capacity: 16 << 30,
        memory_allocatable: 15 << 30,
        page_size: 4096,
        cgroup_v2: true,
    };

    fn pod(parent: &str, annotations: &[(&str, &str)]) -> PodFacts {
        PodFacts {
            namespace: "default".into(),
            name: "p".into(),
            uid: "u".into(),
            cgroup_parent: parent.into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn ctr(shares: u64, quota: i64, limit: i64, oom: i64) -> ContainerFacts {
        ContainerFacts {
            name: "app".into(),
            resources: Resources {
                cpu_shares: Some(shares),
                cpu_quota: (quota > 0).then_some(quota),
                cpu_period: Some(100_000),
                memory_limit: (limit > 0).then_some(limit),
                unified: BTreeMap::new(),
            },
            oom_score_adj: Some(oom),
            ..Default::default()
        }
    }

    const G: &str = "/kubepods/podu";
    const B: &str = "/kubepods/burstable/podu";
    const E: &str = "/kubepods/besteffort/podu";

    fn u(d: &Decision, k: &str) -> Option<String> {
        d.adjustment.unified.get(k).cloned()
    }

    fn s(v: i64) -> Option<String> {
        Some(v.to_string())
    }

    /// One worked vector: (source, pod, container, cfg) → expected unified keys and oom.
    struct Vector {
        source: &'static str,
        pod: PodFacts,
        ctr: ContainerFacts,
        cfg: PolicyConfig,
        class: QosClass,
        weight: Option<i64>,
        min: Option<i64>,
        low: Option<i64>,
        high: Option<i64>,
        oom: Option<i64>,
    }

    fn v(source: &'static str, pod: PodFacts, ctr: ContainerFacts, class: QosClass) -> Vector {
        Vector {
            source,
            pod,
            ctr,
            cfg: PolicyConfig::default(),
            class,
            weight: None,
            min: None,
            low: None,
            high: None,
            oom: None,
        }
    }

    fn ann(k: &'static str, v: &'static str) -> [(&'static str, &'static str); 1] {
        [(k, v)]
    }

    const REQ: &str = "memory-request.qos.nri-qos.io/app";

    fn vectors() -> Vec<Vector> {
        use QosClass::*;
        let linear = PolicyConfig {
            cpu_weight: WeightConversion::Linear,
            ..Default::default()
        };
        let min = PolicyConfig {
            memory_reservation: Reservation::Min,
            ..Default::default()
        };
        let none = PolicyConfig {
            memory_reservation: Reservation::None,
            memory_high: false,
            ..Default::default()
        };
        vec![
            Vector { weight: Some(1), high: Some(14_495_514_624), ..v("§8 row 1 BestEffort: weight 1, memory.high after the BestEffort fix", pod(E, &[]), ctr(2, 0, 0, 1000), BestEffort) },
            Vector { weight: Some(100), min: Some(GI), ..v("§8 row 2 Guaranteed 1 CPU/1Gi: quadratic weight 100, tiered memory.min = limit", pod(G, &[]), ctr(1024, 100_000, GI, -997), Guaranteed) },
            Vector { weight: Some(35), min: Some(256 * MI), ..v("§8 row 3 Guaranteed 250m/256Mi (requests defaulted to limits)", pod(G, &[]), ctr(256, 25_000, 256 * MI, -997), Guaranteed) },
            Vector { weight: Some(17), low: Some(128 * MI), high: Some(496_603_136), ..v("§8 row 4 Burstable 100m,128Mi→500m,512Mi, request from annotation", pod(B, &ann(REQ, "128Mi")), ctr(102, 50_000, 512 * MI, 993), Burstable) },
            Vector { weight: Some(17), low: Some(120_258_560), high: Some(495_206_400), ..v("§8 row 4 without annotation: request inverted from oom 993 (lower end, page-aligned; §5 route 2)", pod(B, &[]), ctr(102, 50_000, 512 * MI, 993), Burstable) },
            Vector { weight: Some(59), low: Some(GI), high: Some(14_602_887_168), ..v("§8 row 5 Burstable 500m,1Gi, no limit: memory.high base = allocatable", pod(B, &ann(REQ, "1Gi")), ctr(512, 0, 0, 938), Burstable) },
            Vector { weight: Some(1), low: Some(GI), ..v("§8 row 6 without annotation: oom 938 allows request == limit 1Gi, so no memory.high", pod(B, &[]), ctr(2, 0, GI, 938), Burstable) },
            Vector { weight: Some(1), low: Some(GI), ..v("§8 row 6 memory limit only, request = limit: no memory.high", pod(B, &ann(REQ, "1Gi")), ctr(2, 0, GI, 938), Burstable) },
            Vector { weight: Some(303), low: Some(16 * GI), high: Some(32_641_748_992), ..v("§8 row 7 Burstable 4 CPU,16Gi→8 CPU,32Gi (oom floor 3 kept)", pod(B, &ann(REQ, "16Gi")), ctr(4096, 800_000, 32 * GI, 3), Burstable) },
            Vector { weight: Some(17), low: Some(MI), high: Some(60_502_016), ..v("§8 row 8 Burstable 1Mi→64Mi (oom 999 carries no request; annotation does)", pod(B, &ann(REQ, "1Mi")), ctr(102, 20_000, 64 * MI, 999), Burstable) },
            Vector { weight: Some(17), ..v("§8 row 8 without annotation: request unknown (adj 999), no memory.high rather than a guess", pod(B, &[]), ctr(102, 20_000, 64 * MI, 999), Burstable) },
            Vector { weight: Some(2), low: Some(256 * MI), high: Some(510_025_728), ..v("§8 row 9 Burstable 5m, 256Mi→512Mi", pod(B, &ann(REQ, "256Mi")), ctr(5, 1_000, 512 * MI, 985), Burstable) },
            Vector { weight: Some(1), ..v("§8 row 12 critical Burstable keeps the kubelet's -997 (which carries no request)", pod(B, &[]), ctr(2, 0, 0, -997), Burstable) },
            Vector { weight: Some(10_000), min: Some(GI), ..v("§8 row 13 300 CPU: shares capped at 262144 → weight 10000", pod(G, &[]), ctr(262_144, 30_000_000, GI, -997), Guaranteed) },
            Vector { weight: Some(39), min: Some(GI), cfg: linear.clone(), ..v("§3 linear KEP-2254: 1024 shares → 39", pod(G, &[]), ctr(1024, 100_000, GI, -997), Guaranteed) },
            Vector { weight: Some(10), min: Some(256 * MI), cfg: linear.clone(), ..v("§3 linear: 256 shares → 10", pod(G, &[]), ctr(256, 25_000, 256 * MI, -997), Guaranteed) },
            Vector { weight: Some(4), low: Some(128 * MI), high: Some(496_603_136), cfg: linear.clone(), ..v("§3 linear: 102 shares → 4", pod(B, &ann(REQ, "128Mi")), ctr(102, 50_000, 512 * MI, 993), Burstable) },
            Vector { weight: Some(157), low: Some(16 * GI), high: Some(32_641_748_992), cfg: linear, ..v("§3 linear: 4096 shares → 157", pod(B, &ann(REQ, "16Gi")), ctr(4096, 800_000, 32 * GI, 3), Burstable) },
            Vector { weight: Some(17), min: Some(128 * MI), high: Some(496_603_136), cfg: min.clone(), ..v("§4 1.27 alpha: memory.min = request for Burstable too", pod(B, &ann(REQ, "128Mi")), ctr(102, 50_000, 512 * MI, 993), Burstable) },
            Vector { weight: Some(100), min: Some(GI), cfg: min, ..v("§4 1.27 alpha: Guaranteed memory.min = limit", pod(G, &[]), ctr(1024, 100_000, GI, -997), Guaranteed) },
            Vector { weight: Some(17), cfg: none.clone(), ..v("reservation none, memory.high off: only cpu.weight", pod(B, &ann(REQ, "128Mi")), ctr(102, 50_000, 512 * MI, 993), Burstable) },
            Vector { weight: Some(1), cfg: none, ..v("reservation none, memory.high off: BestEffort gets only the weight", pod(E, &[]), ctr(2, 0, 0, 1000), BestEffort) },
            Vector { weight: Some(17), low: Some(128 * MI), ..v("per-pod memory.high opt-out annotation", pod(B, &[(REQ, "128Mi"), (MEMORY_HIGH_ANNOTATION, "off")]), ctr(102, 50_000, 512 * MI, 993), Burstable) },
            Vector { weight: Some(17), low: Some(128 * MI), high: Some(496_603_136), ..v("pod-wide request annotation", pod(B, &ann(MEMORY_REQUEST_ANNOTATION, "128Mi")), ctr(102, 50_000, 512 * MI, 993), Burstable) },
            Vector { weight: Some(17), low: Some(120_258_560), high: Some(495_206_400), ..v("invalid annotation is ignored, oom inversion used", pod(B, &ann(REQ, "12x")), ctr(102, 50_000, 512 * MI, 993), Burstable) },
            Vector { weight: Some(1), high: Some(14_495_514_624), oom: Some(1000), ..v("BestEffort with a wrong oom_score_adj gets 1000", pod(E, &[]), ctr(2, 0, 0, 0), BestEffort) },
            Vector { weight: Some(100), min: Some(GI), oom: Some(-997), ..v("Guaranteed with a crictl default oom gets -997", pod(G, &[]), ctr(1024, 100_000, GI, 0), Guaranteed) },
            Vector { weight: Some(100), min: Some(GI), ..v("Guaranteed keeps a lower system value (-999)", pod(G, &[]), ctr(1024, 100_000, GI, -999), Guaranteed) },
            Vector { weight: Some(35), low: Some(256 * MI), high: Some(510_025_728), oom: Some(985), ..v("Burstable with no kubelet value: formula from the request (§2: 256Mi → 985)", pod(B, &ann(REQ, "256Mi")), ctr(256, 50_000, 512 * MI, 0), Burstable) },
            Vector { weight: Some(100), min: Some(GI), ..v("crictl, no kubepods parent: Guaranteed from resources", pod("/custom", &[]), ctr(1024, 100_000, GI, -997), Guaranteed) },
            Vector { weight: Some(35), ..v("crictl, no kubepods parent: Burstable from resources, oom 500 kept and not inverted", pod("/custom", &[]), ctr(256, 50_000, 512 * MI, 500), Burstable) },
            Vector { weight: Some(1), high: Some(14_495_514_624), ..v("crictl, no kubepods parent: BestEffort from resources", pod("/custom", &[]), ctr(2, 0, 0, 1000), BestEffort) },
            Vector { weight: Some(59), low: Some(GI), high: Some(14_602_887_168), ..v("systemd driver: Burstable slice", pod("kubepods-burstable-podu.slice", &ann(REQ, "1Gi")), ctr(512, 0, 0, 938), Burstable) },
            Vector { weight: Some(100), min: Some(GI), ..v("systemd driver: Guaranteed slice", pod("/kubepods.slice/kubepods-podu.slice", &[]), ctr(1024, 100_000, GI, -997), Guaranteed) },
            Vector { weight: Some(174), min: Some(2 * GI), ..v("§3 quadratic shares→weight (runc ConvertCPUSharesToCgroupV2Value): 2048 → 174 (§8 row 11)", pod(G, &[]), ctr(2048, 200_000, 2 * GI, -997), Guaranteed) },
            Vector { weight: Some(174), low: Some(GI), high: Some(3_972_841_472), ..v("§8 row 11 pod-level limits 2 CPU/4Gi, 1Gi request: KEP-2570 floor((req + 0.9·(lim − req))/page)·page", pod(B, &ann(REQ, "1Gi")), ctr(2048, 200_000, 4 * GI, 938), Burstable) },
            Vector { weight: Some(303), low: Some(16 * GI), high: Some(32_641_748_992), oom: Some(3), ..v("§2 GetContainerOOMScoreAdjust: 1000 − 1000·16Gi/16Gi = 0 → floor 3", pod(B, &ann(REQ, "16Gi")), ctr(4096, 800_000, 32 * GI, 0), Burstable) },
            Vector { weight: Some(17), low: Some(MI), high: Some(60_502_016), oom: Some(999), ..v("§2 GetContainerOOMScoreAdjust: 1000 − ⌊1000·1Mi/16Gi⌋ = 1000 → 999", pod(B, &ann(REQ, "1Mi")), ctr(102, 20_000, 64 * MI, 0), Burstable) },
            Vector { weight: Some(17), low: Some(128 * MI), high: Some(335_544_320), cfg: PolicyConfig { memory_throttling_factor: 0.5, ..Default::default() }, ..v("§4 KEP-2570 memory.high with memoryThrottlingFactor 0.5: 128Mi + 0.5·384Mi", pod(B, &ann(REQ, "128Mi")), ctr(102, 50_000, 512 * MI, 993), Burstable) },
            Vector { weight: Some(35), high: Some(510_025_728), ..v("§5 route 1: request from the kubelet's MemoryQoS unified memory.min (kept; the kubelet owns protection, so no memory.low of ours)", pod(B, &[]), ContainerFacts { resources: Resources { unified: BTreeMap::from([("memory.min".into(), (256 * MI).to_string())]), ..ctr(256, 50_000, 512 * MI, 985).resources }, unified_shown: true, ..ctr(256, 50_000, 512 * MI, 985) }, Burstable) },
            Vector { weight: Some(35), low: Some(512 * MI), ..v("§4 protection never above memory.max: a 1Gi request annotation on a 512Mi limit is capped, request == limit sets no memory.high", pod(B, &ann(REQ, "1Gi")), ctr(256, 50_000, 512 * MI, 985), Burstable) },
            Vector { oom: Some(-998), ..v("§8 row 14 pod sandbox (pause): -998, no cgroup values", pod(B, &[]), ContainerFacts { annotations: BTreeMap::from([(CONTAINER_TYPE_ANNOTATION.into(), "sandbox".into())]), ..ctr(2, 0, 0, 0) }, Burstable) },
        ]
    }

    #[test]
    fn worked_vectors() {
        let all = vectors();
        for t in &all {
            let d = decide(&t.pod, &t.ctr, &NODE, &t.cfg);
            let ctx = format!("{}: {d:?}", t.source);
            assert_eq!(d.class, t.class, "{ctx}");
            assert_eq!(u(&d, "cpu.weight"), t.weight.and_then(s), "weight {ctx}");
            assert_eq!(u(&d, "memory.min"), t.min.and_then(s), "min {ctx}");
            assert_eq!(u(&d, "memory.low"), t.low.and_then(s), "low {ctx}");
            assert_eq!(u(&d, "memory.high"), t.high.and_then(s), "high {ctx}");
            assert_eq!(d.adjustment.oom_score_adj, t.oom, "oom {ctx}");
        }
        // At least 40 worked vectors, each naming its source.
        assert!(all.len() >= 40, "{} vectors", all.len());
    }

    #[test]
    fn cpu_request_is_recovered_from_shares() {
        // §5: CPU request = shares × 1000 / 1024 (kubelet 250m → 256 shares → 250m).
        for (shares, milli) in [
            (256, 250),
            (1024, 1000),
            (102, 99),
            (2, 0),
            (262_144, 256_000),
        ] {
            let d = decide(
                &pod(B, &[]),
                &ctr(shares, 0, 0, 999),
                &NODE,
                &Default::default(),
            );
            assert_eq!(d.cpu_request_milli, milli, "{shares} shares");
        }
    }

    #[test]
    fn request_sources_are_recorded() {
        let d = decide(
            &pod(B, &ann(REQ, "1Gi")),
            &ctr(512, 0, 0, 938),
            &NODE,
            &Default::default(),
        );
        assert_eq!(d.request_source, RequestSource::Annotation);
        let d = decide(
            &pod(B, &[]),
            &ctr(512, 0, 0, 938),
            &NODE,
            &Default::default(),
        );
        assert_eq!(d.request_source, RequestSource::OomScoreAdj);
        let d = decide(
            &pod(G, &[]),
            &ctr(1024, 100_000, GI, -997),
            &NODE,
            &Default::default(),
        );
        assert_eq!(d.request_source, RequestSource::GuaranteedLimit);
        let d = decide(
            &pod(E, &[]),
            &ctr(2, 0, 0, 1000),
            &NODE,
            &Default::default(),
        );
        assert_eq!(d.request_source, RequestSource::BestEffort);
        let mut c = ctr(512, 0, 0, 938);
        c.resources
            .unified
            .insert("memory.min".into(), "268435456".into());
        let d = decide(&pod(B, &[]), &c, &NODE, &Default::default());
        assert_eq!(d.request_source, RequestSource::UnifiedMemoryMin);
        assert_eq!(u(&d, "memory.low"), None);
        let mut c = ctr(512, 0, 0, 938);
        c.resources
            .unified
            .insert("memory.low".into(), "268435456".into());
        let d = decide(&pod(B, &[]), &c, &NODE, &Default::default());
        assert_eq!(d.request_source, RequestSource::UnifiedMemoryLow);
        assert_eq!(d.memory_request, Some(268_435_456));
    }

    /// What a kubelet sends for one container under each Memory QoS setup
    /// (kubelet-qos.md §4, §8): `None` = no Memory QoS.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Kubelet {
        NoMemoryQos,
        Alpha,
        Tiered,
        TieredFactor,
    }

    fn kubelet_unified(
        k: Kubelet,
        class: QosClass,
        req: u64,
        limit: Option<u64>,
    ) -> BTreeMap<String, String> {
        // memory.oom.group is sent on cgroup v2 since 1.28 in every setup.
        let mut m = BTreeMap::from([("memory.oom.group".to_string(), "1".to_string())]);
        let high = |m: &mut BTreeMap<String, String>| {
            if let Some(h) = f::memory_high(req, limit, NODE.memory_allocatable, 0.9, 4096) {
                m.insert("memory.high".into(), h.to_string());
            }
        };
        match (k, class) {
            (Kubelet::NoMemoryQos, _) | (_, QosClass::BestEffort) => {}
            (Kubelet::Alpha, QosClass::Guaranteed) => {
                m.insert("memory.min".into(), req.to_string());
            }
            (Kubelet::Alpha, QosClass::Burstable) => {
                m.insert("memory.min".into(), req.to_string());
                high(&mut m);
            }
            (Kubelet::Tiered | Kubelet::TieredFactor, QosClass::Guaranteed) => {
                m.insert("memory.min".into(), req.to_string());
            }
            (Kubelet::Tiered, QosClass::Burstable) => {
                m.insert("memory.low".into(), req.to_string());
            }
            (Kubelet::TieredFactor, QosClass::Burstable) => {
                m.insert("memory.low".into(), req.to_string());
                high(&mut m);
            }
        }
        m
    }

    #[test]
    fn every_class_under_every_kubelet_memory_qos_setup() {
        use QosClass::*;
        // (class, parent, container, true request)
        let cases = [
            (Guaranteed, G, ctr(1024, 100_000, GI, -997), GI as u64),
            (
                Burstable,
                B,
                ctr(102, 50_000, 512 * MI, 993),
                128 * MI as u64,
            ),
            (Burstable, B, ctr(512, 0, 0, 938), GI as u64),
            (BestEffort, E, ctr(2, 0, 0, 1000), 0),
        ];
        for k in [
            Kubelet::NoMemoryQos,
            Kubelet::Alpha,
            Kubelet::Tiered,
            Kubelet::TieredFactor,
        ] {
            for (class, parent, base, req) in &cases {
                let limit = base.resources.memory_limit.map(|l| l as u64);
                let mut c = base.clone();
                c.resources.unified = kubelet_unified(k, *class, *req, limit);
                // A runtime that shows them (NRI v0.10 on).
                c.unified_shown = true;
                let sent = c.resources.unified.clone();
                let d = decide(&pod(parent, &[]), &c, &NODE, &Default::default());
                let ctx = format!("{k:?} {class:?} {d:?}");
                // Never a second claim on a key the runtime request carries.
                for key in sent.keys() {
                    assert!(
                        !d.adjustment.unified.contains_key(key),
                        "{key} claimed twice: {ctx}"
                    );
                }
                let kubelet_protects =
                    sent.contains_key("memory.min") || sent.contains_key("memory.low");
                if kubelet_protects {
                    assert_eq!(d.memory_request, Some(*req), "exact request: {ctx}");
                    let want = if sent.contains_key("memory.min") {
                        RequestSource::UnifiedMemoryMin
                    } else {
                        RequestSource::UnifiedMemoryLow
                    };
                    assert_eq!(d.request_source, want, "{ctx}");
                    assert!(
                        u(&d, "memory.min").is_none() && u(&d, "memory.low").is_none(),
                        "{ctx}"
                    );
                }
                // memory.high: the kubelet's when it sent one, else ours by
                // the same formula (the request is exact), never for Guaranteed.
                let eff = effective(&c.resources, &d.adjustment);
                let want_high = match class {
                    Guaranteed => None,
                    BestEffort => f::memory_high(0, None, NODE.memory_allocatable, 0.9, 4096),
                    Burstable => f::memory_high(*req, limit, NODE.memory_allocatable, 0.9, 4096),
                };
                if kubelet_protects || *class != Burstable {
                    assert_eq!(
                        eff.unified.get("memory.high").cloned(),
                        want_high.map(|h| h.to_string()),
                        "{ctx}"
                    );
                }
            }
        }
    }

    #[test]
    fn hidden_kubelet_memory_qos_keeps_protection_and_memory_high_off() {
        // containerd < 2.2 hides `unified`; the pod cgroup told us (or the operator did).
        let mut p = pod(B, &[]);
        p.kubelet_memory_qos = true;
        let d = decide(
            &p,
            &ctr(102, 50_000, 512 * MI, 993),
            &NODE,
            &Default::default(),
        );
        for k in ["memory.min", "memory.low", "memory.high"] {
            assert_eq!(u(&d, k), None, "{k}: {d:?}");
        }
        assert_eq!(u(&d, "cpu.weight"), Some("17".into()));
        // The operator's setting says the same without any detection.
        for (setting, high) in [
            (KubeletMemoryQos::Alpha, None),
            (KubeletMemoryQos::Tiered, Some("495206400".to_string())),
        ] {
            let cfg = PolicyConfig {
                kubelet_memory_qos: setting,
                ..Default::default()
            };
            let d = decide(&pod(B, &[]), &ctr(102, 50_000, 512 * MI, 993), &NODE, &cfg);
            assert_eq!(u(&d, "memory.low"), None, "{setting:?}");
            assert_eq!(u(&d, "memory.high"), high, "{setting:?}");
        }
        // `none`: a pod flag from detection is ignored, ours as before.
        let cfg = PolicyConfig {
            kubelet_memory_qos: KubeletMemoryQos::None,
            ..Default::default()
        };
        let d = decide(&p, &ctr(102, 50_000, 512 * MI, 993), &NODE, &cfg);
        assert_eq!(u(&d, "memory.low"), Some("120258560".into()));
    }

    #[test]
    fn sandbox_gets_minus_998_and_nothing_else() {
        let mut c = ctr(2, 0, 0, 0);
        c.annotations
            .insert(CONTAINER_TYPE_ANNOTATION.into(), "sandbox".into());
        let d = decide(&pod(B, &[]), &c, &NODE, &Default::default());
        assert_eq!(d.adjustment.oom_score_adj, Some(-998));
        assert!(d.adjustment.unified.is_empty());
        assert_eq!(d.adjustment.cpu_quota, None);
    }

    #[test]
    fn cgroup_v1_gets_no_unified_keys_and_a_note() {
        let v1 = NodeFacts {
            cgroup_v2: false,
            ..NODE
        };
        let d = decide(
            &pod(B, &ann(REQ, "128Mi")),
            &ctr(102, 50_000, 512 * MI, 993),
            &v1,
            &Default::default(),
        );
        assert!(d.adjustment.unified.is_empty());
        // Logged once at start, not once per container.
        assert!(d.notes.is_empty(), "{:?}", d.notes);
    }

    #[test]
    fn odd_cpu_values_are_clamped() {
        let d = decide(
            &pod(B, &[]),
            &ctr(1_000_000, 500, 0, 999),
            &NODE,
            &Default::default(),
        );
        assert_eq!(d.adjustment.cpu_shares, Some(262_144));
        assert_eq!(d.adjustment.cpu_quota, Some(1000));
        assert_eq!(u(&d, "cpu.weight"), Some("10000".into()));
    }

    fn arb_resources() -> impl Strategy<Value = Resources> {
        (
            prop::option::of(prop_oneof![0u64..10, 0u64..300_000, Just(u64::MAX)]),
            prop::option::of(prop_oneof![
                -2i64..2,
                0i64..2_000_000,
                Just(i64::MIN),
                Just(i64::MAX)
            ]),
            prop::option::of(prop_oneof![0u64..10, Just(100_000u64), Just(u64::MAX)]),
            prop::option::of(prop_oneof![-5i64..5, 0i64..(64 << 30), Just(i64::MAX)]),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "memory.min",
                    "memory.low",
                    "memory.high",
                    "memory.oom.group",
                ]),
                prop_oneof![Just("0".to_string()), "[0-9]{1,12}", "\\PC{0,8}"],
                0..3,
            ),
        )
            .prop_map(|(shares, quota, period, limit, unified)| Resources {
                cpu_shares: shares,
                cpu_quota: quota,
                cpu_period: period,
                memory_limit: limit,
                unified: unified
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            })
    }

    fn arb_case() -> impl Strategy<Value = (PodFacts, ContainerFacts, NodeFacts, PolicyConfig)> {
        let parents = prop::sample::select(vec![
            G,
            B,
            E,
            "/custom",
            "",
            "kubepods-burstable-podx.slice",
            "kubepods-podx.slice",
        ]);
        let annotations = prop::option::of(prop_oneof![
            Just("128Mi".to_string()),
            Just("0".into()),
            "\\PC{0,6}",
            "[0-9]{1,20}(Ki|Mi|Gi|Ei)?"
        ]);
        (
            parents,
            annotations,
            prop::option::of(arb_resources()),
            arb_resources(),
            prop::option::of(prop_oneof![-2000i64..2000, Just(i64::MIN), Just(i64::MAX)]),
            (
                1u64..(1 << 42),
                prop::bool::ANY,
                prop_oneof![Just(4096u64), Just(65536), Just(1)],
            ),
            (
                prop::sample::select(vec![
                    WeightConversion::Quadratic,
                    WeightConversion::Linear,
                    WeightConversion::Off,
                ]),
                prop::sample::select(vec![
                    Reservation::Tiered,
                    Reservation::Min,
                    Reservation::None,
                ]),
                prop::bool::ANY,
                0.01f64..=1.0,
                prop::bool::ANY,
                (
                    prop::sample::select(vec![
                        KubeletMemoryQos::Auto,
                        KubeletMemoryQos::None,
                        KubeletMemoryQos::Alpha,
                        KubeletMemoryQos::Tiered,
                    ]),
                    prop::bool::ANY,
                ),
            ),
        )
            .prop_map(
                |(
                    parent,
                    annotation,
                    pod_res,
                    res,
                    oom,
                    (cap, v2, page),
                    (w, r, high, factor, sandbox, (kubelet, detected)),
                )| {
                    let mut p = pod(parent, &[]);
                    p.kubelet_memory_qos = detected;
                    if let Some(a) = annotation {
                        p.annotations.insert(MEMORY_REQUEST_ANNOTATION.into(), a);
                    }
                    p.resources = pod_res;
                    let mut c = ContainerFacts {
                        name: "app".into(),
                        resources: res,
                        oom_score_adj: oom,
                        ..Default::default()
                    };
                    if sandbox {
                        c.annotations
                            .insert(CONTAINER_TYPE_ANNOTATION.into(), "sandbox".into());
                    }
                    let node = NodeFacts {
                        memory_capacity: cap,
                        memory_allocatable: cap / 2 + 1,
                        page_size: page,
                        cgroup_v2: v2,
                    };
                    let cfg = PolicyConfig {
                        cpu_weight: w,
                        memory_reservation: r,
                        memory_high: high,
                        memory_throttling_factor: factor,
                        kubelet_memory_qos: kubelet,
                        ..Default::default()
                    };
                    (p, c, node, cfg)
                },
            )
    }

    fn bytes(r: &Resources, k: &str) -> Option<u64> {
        r.unified.get(k).and_then(|v| v.parse().ok())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn invariants_hold_for_any_input((p, c, node, cfg) in arb_case()) {
            let d = decide(&p, &c, &node, &cfg);
            let a = &d.adjustment;
            let eff = effective(&c.resources, a);
            if let Some(w) = a.unified.get("cpu.weight") {
                let w: u64 = w.parse().unwrap();
                prop_assert!((1..=10_000).contains(&w));
            }
            if let Some(s) = a.cpu_shares {
                prop_assert!((2..=262_144).contains(&s));
            }
            if let Some(q) = a.cpu_quota {
                prop_assert!(q >= 1000);
            }
            if let Some(o) = a.oom_score_adj {
                prop_assert!((-1000..=1000).contains(&o));
            }
            if !node.cgroup_v2 {
                prop_assert!(a.unified.is_empty());
            }
            let max = eff.memory_limit.and_then(|l| u64::try_from(l).ok()).filter(|l| *l > 0).unwrap_or(u64::MAX);
            let ours = |k: &str| a.unified.get(k).and_then(|v| v.parse::<u64>().ok());
            let high = ours("memory.high");
            for k in ["memory.min", "memory.low"] {
                if let Some(v) = ours(k) {
                    prop_assert!(v <= max, "{k} {v} > max {max}");
                    if let Some(h) = high { prop_assert!(v <= h, "{k} {v} > high {h}"); }
                    prop_assert_eq!(v % node.page_size, 0);
                }
            }
            if let Some(h) = high {
                prop_assert!(h <= max);
                prop_assert_eq!(h % node.page_size, 0);
            }
            let _ = bytes(&eff, "memory.min");
            // A key the runtime request carries is never claimed again.
            for k in c.resources.unified.keys() {
                prop_assert!(!a.unified.contains_key(k), "{k} claimed twice");
            }
            // Protection the kubelet owns is never added to.
            if kubelet_memory_qos_keys(&c.resources) || matches!(cfg.kubelet_memory_qos, KubeletMemoryQos::Alpha | KubeletMemoryQos::Tiered) {
                prop_assert!(!a.unified.contains_key("memory.min") && !a.unified.contains_key("memory.low"));
            }
        }

        #[test]
        fn applying_the_answer_is_a_fixed_point((p, c, node, cfg) in arb_case()) {
            let d = decide(&p, &c, &node, &cfg);
            let mut applied = c.clone();
            applied.resources = effective(&c.resources, &d.adjustment);
            if let Some(o) = d.adjustment.oom_score_adj {
                applied.oom_score_adj = Some(o);
            }
            let again = decide(&p, &applied, &node, &cfg);
            prop_assert!(again.adjustment.is_empty(), "second pass wants {:?} after {:?}", again.adjustment, d.adjustment);
        }
    }
}
