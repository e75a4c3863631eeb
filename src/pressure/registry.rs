//! Pod metadata the monitor cannot read from cgroupfs (namespace, priority,
//! the true memory request). The NRI plugin feeds a [`SharedRegistry`]; the
//! monitor works without it and then says where each number came from.

use std::collections::HashMap;
use std::fmt;
use std::sync::RwLock;

use crate::qos::QosClass;

/// Where a pod's memory request came from. Logged with every decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestSource {
    /// Σ container requests from the pod spec (API server / kubelet).
    PodSpec,
    /// The pod's request from the API server's pod spec, the kubelet's
    /// way (`resourcehelper.PodRequests`: init max rule, sidecars,
    /// pod-level resources, overhead).
    ApiServer,
    /// `memory.min`/`memory.low` the kubelet put in the CRI `unified` map.
    UnifiedMemoryQos,
    /// Inverted from the Burstable oom_score_adj (±MemTotal/1000).
    OomScoreAdj,
    /// Σ memory.min (else memory.low) of the pod cgroup's children.
    CgroupChildrenMinLow,
    /// memory.min (else memory.low) of the pod cgroup itself.
    CgroupPodMinLow,
    /// Guaranteed pod: request == limit == pod memory.max.
    CgroupPodMax,
    /// BestEffort: request is 0 by definition.
    BestEffort,
    /// Nothing found; 0 is used, so the pod counts as over its request.
    Unknown,
}

impl fmt::Display for RequestSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RequestSource::PodSpec => "pod-spec",
            RequestSource::ApiServer => "api-server",
            RequestSource::UnifiedMemoryQos => "unified-memory-qos",
            RequestSource::OomScoreAdj => "oom-score-adj",
            RequestSource::CgroupChildrenMinLow => "cgroup-children-min-low",
            RequestSource::CgroupPodMinLow => "cgroup-pod-min-low",
            RequestSource::CgroupPodMax => "cgroup-pod-max",
            RequestSource::BestEffort => "besteffort",
            RequestSource::Unknown => "unknown-as-0",
        })
    }
}

/// What the plugin knows about a pod, keyed by pod UID (with dashes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `spec.priority`; `None` ranks as 0, like the kubelet.
    pub priority: Option<i32>,
    /// Pod memory request in bytes, when known.
    pub memory_request: Option<u64>,
    pub request_source: RequestSource,
    /// QoS class; `None` falls back to the class implied by the cgroup path.
    pub class: Option<QosClass>,
    /// A static or mirror pod: critical to the kubelet whatever its priority.
    pub static_pod: bool,
}

/// Lookup of pod metadata by UID. Implementations must be cheap and never block
/// for long: the monitor calls this under memory pressure.
pub trait PodRegistry: Send + Sync {
    fn get(&self, uid: &str) -> Option<PodInfo>;
}

/// No metadata at all (standalone `nri-qos monitor`).
#[derive(Debug, Default)]
pub struct NoPods;

impl PodRegistry for NoPods {
    fn get(&self, _uid: &str) -> Option<PodInfo> {
        None
    }
}

/// A registry the NRI plugin fills on RunPodSandbox and empties on
/// RemovePodSandbox.
#[derive(Debug, Default)]
pub struct SharedRegistry {
    pods: RwLock<HashMap<String, PodInfo>>,
}

impl SharedRegistry {
    pub fn upsert(&self, info: PodInfo) {
        // A poisoned lock only means a writer panicked mid-insert; the map
        // itself is still usable.
        let mut m = self.pods.write().unwrap_or_else(|e| e.into_inner());
        m.insert(info.uid.clone(), info);
    }

    pub fn remove(&self, uid: &str) {
        let mut m = self.pods.write().unwrap_or_else(|e| e.into_inner());
        m.remove(uid);
    }

    pub fn len(&self) -> usize {
        self.pods.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The first registry that knows a pod answers (the API server's pod
/// facts ahead of the runtime's).
pub struct Layered(pub Vec<std::sync::Arc<dyn PodRegistry>>);

impl PodRegistry for Layered {
    fn get(&self, uid: &str) -> Option<PodInfo> {
        self.0.iter().find_map(|r| r.get(uid))
    }
}

impl PodRegistry for SharedRegistry {
    fn get(&self, uid: &str) -> Option<PodInfo> {
        self.pods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_shared_registry_upsert_get_remove() {
        let r = SharedRegistry::default();
        let info = PodInfo {
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "p".into(),
            priority: Some(5),
            memory_request: Some(1 << 20),
            request_source: RequestSource::PodSpec,
            class: Some(QosClass::Burstable),
            static_pod: false,
        };
        r.upsert(info.clone());
        assert_eq!(r.get("u1"), Some(info));
        r.remove("u1");
        assert!(r.get("u1").is_none() && r.is_empty());
        assert!(NoPods.get("u1").is_none());
    }
}
