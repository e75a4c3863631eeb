//! The kubelet's side of a pod, as `explain` simulates it: its Memory QoS
//! `unified` keys (KEP-2570) and its oom_score_adj (kubelet-qos.md).

use std::collections::BTreeMap;

use serde::Serialize;
use thiserror::Error;

use super::NodeSpec;
use crate::node::QosClass;
use crate::qos::formulas as f;
use crate::qos::pod::Pod;

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

/// A kubelet version and Memory QoS setup that do not go together.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum KubeletSimError {
    #[error("kubelet version must look like 1.37, not {0:?}")]
    Version(String),
    #[error("the alpha Memory QoS (memory.min everywhere) is kubelet 1.27-1.35, not 1.{0}")]
    AlphaOutsideRange(u32),
    #[error("TieredReservation needs kubelet 1.36 or later, not 1.{0}")]
    TieredTooOld(u32),
    #[error("memory throttling factor must be in (0, 1], not {0}")]
    ThrottlingFactor(f64),
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
    ) -> Result<Self, KubeletSimError> {
        let minor = version
            .trim_start_matches('v')
            .strip_prefix("1.")
            .and_then(|m| m.split('.').next())
            .and_then(|m| m.parse::<u32>().ok())
            .ok_or_else(|| KubeletSimError::Version(version.to_string()))?;
        let mode = mode.unwrap_or_default();
        match mode {
            KubeletMode::Alpha if !(27..=35).contains(&minor) => {
                return Err(KubeletSimError::AlphaOutsideRange(minor))
            }
            KubeletMode::Tiered if minor < 36 => return Err(KubeletSimError::TieredTooOld(minor)),
            _ => {}
        }
        if let Some(f) = factor {
            if !(f.is_finite() && f > 0.0 && f <= 1.0) {
                return Err(KubeletSimError::ThrottlingFactor(f));
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

    /// What the kubelet writes itself on the pod cgroup of a pod with
    /// pod-level resources: the pod-level memory request, as memory.min, or
    /// memory.low for a Burstable pod under TieredReservation (seen on a
    /// v1.36.2 kubelet: a Burstable pod with a 256Mi pod-level request got
    /// memory.low 268435456, its containers none of their own).
    pub fn pod_level_protection(
        &self,
        class: QosClass,
        pod_request: u64,
        node: &NodeSpec,
    ) -> Option<(&'static str, u64)> {
        if self.mode == KubeletMode::None || !node.cgroup_v2 || pod_request == 0 {
            return None;
        }
        match (self.mode, class) {
            (_, QosClass::BestEffort) => None,
            (KubeletMode::Tiered, QosClass::Burstable) => Some(("memory.low", pod_request)),
            _ => Some(("memory.min", pod_request)),
        }
    }

    /// The Memory QoS keys the kubelet puts in a container's `unified` map,
    /// from the container's own request and limit (a pod-level limit is
    /// not the container's).
    pub fn unified(
        &self,
        class: QosClass,
        request: u64,
        limit: Option<u64>,
        node: &NodeSpec,
    ) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
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
            // Before 1.37 the kubelet sets memory.high only where the
            // request differs from the limit, both 0 where neither is set
            // (kuberuntime_container_linux.go, `memoryRequest != memoryLimit`).
            _ if !self.besteffort_high && request == limit.unwrap_or(0) => None,
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

fn is_node_critical(pod: &Pod) -> bool {
    pod.spec.priority_class_name == "system-node-critical"
}

/// kubelet `GetContainerOOMScoreAdjust` (policy.go, v1.34 era).
/// `remaining`: the container's share of the pod-level request beyond the
/// containers' own; `sidecar_cap`: for a sidecar, the smallest regular
/// container's request, whose score the sidecar's may not exceed.
pub(super) fn oom_score_adj(
    pod: &Pod,
    class: QosClass,
    mem_request: u64,
    remaining: u64,
    sidecar_cap: Option<u64>,
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
    // Each request counts with the container's share of the pod-level
    // request; a sidecar scores no higher than the smallest regular
    // container. The floor and the 1000 → 999 step are monotone, so the
    // minimum of the finished scores is the kubelet's minimum before them.
    let score = |req: u64| f::burstable_oom_score_adj(req.saturating_add(remaining), capacity);
    let adj = score(mem_request);
    match sidecar_cap {
        Some(min_req) => adj.min(score(min_req)),
        None => adj,
    }
}
