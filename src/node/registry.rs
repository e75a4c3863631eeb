//! The one pod/container registry: the NRI plugin writes what the runtime
//! told it, the hierarchy keeper reads the records and the pressure monitor
//! looks pods up through [`PodRegistry`] (metadata cgroupfs does not have:
//! namespace, priority, the true memory request). The optional Kubernetes
//! source answers the same trait.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::cgroupfs::Owner;
use super::QosClass;

/// Where a memory request came from (the CRI carries none). Logged with
/// every decision; the monitor prints it with [`fmt::Display`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RequestSource {
    /// `unified["memory.min"]` set by the kubelet's Memory QoS.
    UnifiedMemoryMin,
    /// `unified["memory.low"]` set by the kubelet's Memory QoS (TieredReservation, Burstable).
    UnifiedMemoryLow,
    /// Our pod annotation (Σ container requests from the pod spec).
    Annotation,
    /// The pod spec from the API server (the optional Kubernetes source),
    /// the kubelet's way (`resourcehelper.PodRequests`: init max rule,
    /// sidecars, pod-level resources, overhead).
    ApiServer,
    /// Guaranteed: the request equals the limit.
    GuaranteedLimit,
    /// Burstable: inverted from the kubelet's oom_score_adj (resolution MemTotal/1000).
    OomScoreAdj,
    /// BestEffort: no request, 0 by definition.
    BestEffort,
    /// Σ memory.min (else memory.low) of the pod cgroup's children.
    CgroupChildrenMinLow,
    /// memory.min (else memory.low) of the pod cgroup itself.
    CgroupPodMinLow,
    /// Guaranteed pod: request == limit == pod memory.max.
    CgroupPodMax,
    /// Nothing to recover it from; the monitor uses 0, so the pod counts
    /// as over its request.
    Unknown,
}

impl fmt::Display for RequestSource {
    /// The monitor's name for the source (logs, Events, eviction notices).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RequestSource::UnifiedMemoryMin | RequestSource::UnifiedMemoryLow => {
                "unified-memory-qos"
            }
            RequestSource::Annotation => "pod-spec",
            RequestSource::ApiServer => "api-server",
            RequestSource::OomScoreAdj => "oom-score-adj",
            RequestSource::CgroupChildrenMinLow => "cgroup-children-min-low",
            RequestSource::CgroupPodMinLow => "cgroup-pod-min-low",
            RequestSource::GuaranteedLimit | RequestSource::CgroupPodMax => "cgroup-pod-max",
            RequestSource::BestEffort => "besteffort",
            RequestSource::Unknown => "unknown-as-0",
        })
    }
}

/// What the operator knows about the kubelet's Memory QoS (KEP-2570), which
/// writes container, pod, QoS and kubepods protection itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KubeletMemoryQos {
    /// Detect it: the kubelet's `unified` keys (visible from NRI v0.10,
    /// containerd 2.2), or pod cgroups carrying protection nri-qos did not write.
    Auto,
    /// The kubelet does not protect memory: nri-qos owns every value it sets.
    None,
    /// 1.27-1.35 alpha: memory.min everywhere and memory.high (factor 0.9)
    /// from the kubelet; nri-qos stays off both.
    Alpha,
    /// 1.36+ TieredReservation: memory.min/low from the kubelet; memory.high
    /// stays nri-qos's unless the kubelet's key is visible (set
    /// `memory-high = false` when the kubelet has a memoryThrottlingFactor
    /// on a runtime that hides `unified`).
    Tiered,
}

/// A pod as the runtime described it. Strings are `Box<str>`, not
/// `String`: 8 bytes less per field in every hash-table bucket, and the
/// registry holds one record per pod and container on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRecord {
    /// The sandbox id.
    pub id: Box<str>,
    pub uid: Box<str>,
    pub namespace: Box<str>,
    pub name: Box<str>,
    /// CRI cgroup parent, e.g. `/kubepods/burstable/pod<uid>` or a systemd slice.
    pub cgroup_parent: Box<str>,
    /// The pod's memory limit in bytes as the runtime reported it (the
    /// CRI's pod-level resources: the pod's own limit (KEP-2837), else the
    /// sum of its containers'), the latest pod-level resize's once one
    /// came (UpdatePodSandbox). The pod never holds more: protection and
    /// the request the monitor ranks by stop there ([`within_pod_limit`]).
    pub memory_limit: Option<u64>,
}

/// `bytes` (a pod's protection, or the request its containers add up to),
/// no more than the pod's memory limit: a pod never uses more than it,
/// while protection above it would still count in its parents. Without
/// pod-level resources the sum of its containers' never exceeds the limit
/// anyway; with them, containers inheriting the pod's limit would each
/// count it whole.
pub fn within_pod_limit(bytes: u64, pod_limit: Option<u64>) -> u64 {
    pod_limit.map_or(bytes, |l| bytes.min(l))
}

/// A container and what the policy decided for it.
#[derive(Debug, Clone)]
pub struct ContainerRecord {
    pub id: Box<str>,
    pub pod_id: Box<str>,
    pub name: Box<str>,
    pub class: QosClass,
    pub memory_request: Option<u64>,
    pub request_source: RequestSource,
    /// memory.min / memory.low / memory.high we asked the runtime to set,
    /// or its request already carried (bytes; 0: neither).
    pub memory_min: u64,
    pub memory_low: u64,
    pub memory_high: u64,
    /// It came with the kubelet's Memory QoS (its keys, or its pod's cgroup
    /// was the kubelet's): the pod's protection is the kubelet's.
    pub kubelet_memory_qos: bool,
    pub oom_score_adj: Option<i64>,
    pub cgroups_path: Box<str>,
}

/// The runtime's view of pods and containers, rebuilt on every Synchronize.
/// The hierarchy keeper reads it; the pressure monitor through [`PodRegistry`].
#[derive(Debug)]
pub struct Registry {
    /// By sandbox id.
    pub pods: HashMap<String, PodRecord>,
    pub containers: HashMap<String, ContainerRecord>,
    /// Who owns each pod/QoS/kubepods cgroup's protection, decided once by
    /// the plugin (a pod the kubelet protected before its sandbox) or the
    /// hierarchy keeper; kept across Synchronize.
    pub owners: HashMap<PathBuf, Owner>,
    /// `[policy] kubelet-memory-qos` as in force (the runtime's drop-in may
    /// set it after start), for the keeper.
    pub kubelet_memory_qos: KubeletMemoryQos,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            pods: HashMap::new(),
            containers: HashMap::new(),
            owners: HashMap::new(),
            kubelet_memory_qos: KubeletMemoryQos::Auto,
        }
    }
}

impl Registry {
    /// The monitor's view of one pod: its containers' requests summed,
    /// the first known source, the first container's class.
    pub fn pod_info(&self, pod: &PodRecord) -> PodInfo {
        let ctrs: Vec<&ContainerRecord> = self
            .containers
            .values()
            .filter(|c| c.pod_id == pod.id)
            .collect();
        let known: Vec<u64> = ctrs.iter().filter_map(|c| c.memory_request).collect();
        let source = ctrs
            .iter()
            .map(|c| c.request_source)
            .find(|s| *s != RequestSource::Unknown)
            .unwrap_or(RequestSource::Unknown);
        PodInfo {
            uid: pod.uid.to_string(),
            namespace: pod.namespace.to_string(),
            name: pod.name.to_string(),
            priority: None,
            // Saturating: the runtime's numbers are not ours to trust, and
            // a wrapped sum would rank a huge pod as a tiny one.
            memory_request: (!known.is_empty()).then(|| {
                let sum = known.iter().fold(0u64, |a, b| a.saturating_add(*b));
                within_pod_limit(sum, pod.memory_limit)
            }),
            request_source: source,
            class: ctrs.first().map(|c| c.class),
            static_pod: false,
        }
    }

    /// The pod with this UID (with dashes), when the runtime told us one.
    pub fn pod_by_uid(&self, uid: &str) -> Option<&PodRecord> {
        if uid.is_empty() {
            return None;
        }
        self.pods.values().find(|p| &*p.uid == uid)
    }
}

/// The registry as the plugin, the keeper and the monitor share it.
pub type SharedRegistry = Arc<Mutex<Registry>>;

impl PodRegistry for Mutex<Registry> {
    fn get(&self, uid: &str) -> Option<PodInfo> {
        let reg = super::lock(self);
        reg.pod_by_uid(uid).map(|p| reg.pod_info(p))
    }
}

/// What the monitor knows about a pod, keyed by pod UID (with dashes).
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

/// A container's exact memory request from its pod spec, for the plugin's
/// policy (the optional Kubernetes source implements it). Cheap and
/// non-blocking: the plugin asks from inside a runtime hook.
pub trait ContainerRequests: Send + Sync {
    /// `None` when the pod (by runtime UID) or the container is not known.
    fn container_request(&self, pod_uid: &str, container: &str) -> Option<u64>;
}

/// No metadata at all (standalone `nri-qos monitor`).
#[derive(Debug, Default)]
pub struct NoPods;

impl PodRegistry for NoPods {
    fn get(&self, _uid: &str) -> Option<PodInfo> {
        None
    }
}

/// The first registry that knows a pod answers (the API server's pod
/// facts ahead of the runtime's).
pub struct Layered(pub Vec<Arc<dyn PodRegistry>>);

impl PodRegistry for Layered {
    fn get(&self, uid: &str) -> Option<PodInfo> {
        self.0.iter().find_map(|r| r.get(uid))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A registry of pods `pod<i>` (UID `uid-<i>`) whose containers ask
    /// for the given requests.
    pub(crate) fn registry(pods: &[Vec<u64>]) -> Registry {
        let mut reg = Registry::default();
        for (p, requests) in pods.iter().enumerate() {
            let id = format!("pod{p}");
            reg.pods.insert(
                id.clone(),
                PodRecord {
                    id: id.as_str().into(),
                    uid: format!("uid-{p:04}").into(),
                    name: id.as_str().into(),
                    ..Default::default()
                },
            );
            for (i, r) in requests.iter().enumerate() {
                let cid = format!("{id}-c{i}");
                reg.containers.insert(
                    cid.clone(),
                    ContainerRecord {
                        id: cid.into(),
                        pod_id: id.as_str().into(),
                        name: format!("c{i}").into(),
                        class: QosClass::Burstable,
                        memory_request: Some(*r),
                        request_source: RequestSource::Annotation,
                        memory_min: 0,
                        memory_low: *r,
                        memory_high: 0,
                        oom_score_adj: None,
                        cgroups_path: "".into(),
                        kubelet_memory_qos: false,
                    },
                );
            }
        }
        reg
    }

    #[test]
    fn pods_are_found_by_uid_and_forgotten_with_their_sandbox() {
        let shared = Mutex::new(registry(&[vec![1 << 20, 2 << 20], vec![]]));
        let info = PodRegistry::get(&shared, "uid-0000").unwrap();
        assert_eq!(
            (info.name.as_str(), info.memory_request, info.class),
            ("pod0", Some(3 << 20), Some(QosClass::Burstable))
        );
        assert_eq!(info.request_source.to_string(), "pod-spec");
        let empty = PodRegistry::get(&shared, "uid-0001").unwrap();
        assert_eq!((empty.memory_request, empty.class), (None, None));
        assert_eq!(empty.request_source, RequestSource::Unknown);
        shared.lock().unwrap().pods.remove("pod0");
        assert!(PodRegistry::get(&shared, "uid-0000").is_none());
        assert!(PodRegistry::get(&shared, "").is_none());
        assert!(NoPods.get("uid-0001").is_none());
    }

    #[test]
    fn two_huge_requests_do_not_wrap_to_zero() {
        let reg = registry(&[vec![1 << 63, 1 << 63]]);
        let info = reg.pod_info(&reg.pods["pod0"]);
        assert_eq!(info.memory_request, Some(u64::MAX));
    }

    #[test]
    fn each_source_keeps_the_name_the_monitor_prints() {
        use RequestSource::*;
        for (s, want) in [
            (UnifiedMemoryMin, "unified-memory-qos"),
            (UnifiedMemoryLow, "unified-memory-qos"),
            (Annotation, "pod-spec"),
            (ApiServer, "api-server"),
            (GuaranteedLimit, "cgroup-pod-max"),
            (OomScoreAdj, "oom-score-adj"),
            (BestEffort, "besteffort"),
            (CgroupChildrenMinLow, "cgroup-children-min-low"),
            (CgroupPodMinLow, "cgroup-pod-min-low"),
            (CgroupPodMax, "cgroup-pod-max"),
            (Unknown, "unknown-as-0"),
        ] {
            assert_eq!(s.to_string(), want, "{s:?}");
        }
    }
}
