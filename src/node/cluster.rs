//! What the monitor tells the cluster about an eviction, when something
//! (the optional Kubernetes source, `crate::kube`) can: an Eviction through
//! the API moves the pod, where killing its cgroup only gets its containers
//! restarted in place; an Event on the pod says when the throttle guard
//! relaxed a container's memory.high. The monitor never needs it and never
//! waits on it past the hard threshold (nor ever for a relax notice).

use std::time::Duration;

/// One eviction, with what the Event on the pod says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionNotice {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// Past the hard threshold: the cgroup is killed whatever the API says.
    pub hard: bool,
    /// memory.available and where it came from.
    pub available: u64,
    pub signal: String,
    /// The threshold that was crossed, in bytes.
    pub threshold: u64,
    pub working_set: u64,
    pub request: u64,
    pub request_source: String,
}

/// How the API server answered an Eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictOutcome {
    /// 201: the pod is being evicted (DisruptionTarget, deletionTimestamp).
    Created,
    /// 429: a PodDisruptionBudget allows no disruption now.
    RefusedByPdb,
    /// No answer in time, connection refused, or any other error.
    Unreachable,
}

/// The throttle guard raised a container's memory.high (stage 1), with
/// what the `MemoryHighRelaxed` Event on its pod says.
#[derive(Debug, Clone, PartialEq)]
pub struct RelaxNotice {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub container_id: String,
    /// memory.high before and after, as the cgroup file spells them.
    pub from: String,
    pub to: String,
    /// `memory.events` `high` per second and `memory.pressure` some avg10
    /// (percent) when the guard acted, and for how long it waited.
    pub high_rate: f64,
    pub psi_some_avg10: f64,
    pub grace: String,
}

/// The cluster side of evictions. Implementations must not block the
/// caller beyond the limit it passes.
pub trait ClusterEvictions: Send + Sync {
    /// Soft threshold: create the Eviction and wait at most `limit` for
    /// the answer (a refusal passes the turn to the next candidate).
    fn evict(&self, notice: &EvictionNotice, limit: Duration) -> EvictOutcome;
    /// Hard threshold: the cgroup was killed; record the Eviction and the
    /// Event in the background, never waiting.
    fn evict_after_kill(&self, notice: EvictionNotice);
    /// The throttle guard relaxed a container: post the Event in the
    /// background, never waiting.
    fn memory_high_relaxed(&self, notice: RelaxNotice);
}

/// How long the monitor waits for the API server's answer at the soft
/// threshold (the soft band has time; past the hard one nothing waits).
pub const SOFT_EVICTION_WAIT: Duration = Duration::from_secs(2);
