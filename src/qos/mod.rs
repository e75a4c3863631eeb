//! The QoS policy: a pure function from what the runtime tells us about a
//! container (plain values, no protobuf) to the cgroup and OOM settings its
//! Kubernetes QoS class should get.
//!
//! The NRI layer converts wire messages into [`PodFacts`] / [`ContainerFacts`],
//! calls [`decide`] and turns the [`Adjustment`] back into NRI messages; `explain`
//! builds the same facts from a Pod manifest the way the kubelet would.

use std::collections::BTreeMap;

pub mod formulas;
pub mod pod;
pub mod policy;
pub mod quantity;

// The node's facts and the QoS class live on the ground floor (the cgroup
// layout needs the class); re-exported here for the policy's callers.
pub use crate::node::{NodeFacts, QosClass};

/// Resource values as the runtime hands them over (CRI/OCI semantics).
/// `None` means the runtime did not set the value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<i64>,
    /// cgroup v2 `unified` keys, e.g. `memory.min` set by the kubelet's Memory QoS.
    pub unified: BTreeMap<String, String>,
}

/// What we know about the pod a container belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// CRI cgroup parent, e.g. `/kubepods/burstable/pod<uid>` or a systemd slice.
    pub cgroup_parent: String,
    /// Pod-level resources (`LinuxPodSandbox.pod_resources`), when the runtime sent them.
    pub resources: Option<Resources>,
    /// The kubelet's Memory QoS protects this pod although its keys may not
    /// be visible (NRI before v0.10 hides `unified`): its cgroup carried
    /// protection nri-qos did not write, or the operator said so. The policy
    /// then leaves the container's protection (and unseen memory.high) alone.
    pub kubelet_memory_qos: bool,
}

/// What we know about one container being created or updated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub resources: Resources,
    /// The oom_score_adj the runtime was asked for (the kubelet's value).
    pub oom_score_adj: Option<i64>,
    pub cgroups_path: String,
    /// The container's memory request as the API server has it (0 = none),
    /// when the optional Kubernetes source knows the pod (`crate::kube`).
    pub api_memory_request: Option<u64>,
    /// `resources.unified` is the CRI's whole map: the runtime shows it
    /// (NRI v0.10 on, `node::runtime::RuntimeQuirks::shows_unified`) and
    /// nothing of ours is mixed in, so a key not there was not set. False
    /// where the runtime hides the map (keys the kubelet set may be in the
    /// kernel unseen).
    pub unified_shown: bool,
}

/// The settings we want a container to get; `None` / absent keys leave the
/// runtime's value alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adjustment {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<i64>,
    pub unified: BTreeMap<String, String>,
    pub oom_score_adj: Option<i64>,
}

impl Adjustment {
    pub fn is_empty(&self) -> bool {
        *self == Adjustment::default()
    }
}

pub use crate::node::registry::RequestSource;

/// The policy's answer, with enough context to log why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub class: QosClass,
    /// Human-readable reason for the class (which rule decided it).
    pub reason: String,
    /// Recovered memory request in bytes, when known.
    pub memory_request: Option<u64>,
    /// Where the memory request came from.
    pub request_source: RequestSource,
    /// CPU request in millicores, recovered from the shares the kubelet
    /// sent (`shares × 1000 / 1024`, truncated; 0 for the 2-share minimum).
    pub cpu_request_milli: u64,
    pub adjustment: Adjustment,
    /// Things worth a log line (fallbacks taken, values clamped).
    pub notes: Vec<String>,
}

pub use policy::{decide, KubeletMemoryQos, PolicyConfig, Reservation, WeightConversion};
