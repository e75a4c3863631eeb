//! What the node-pressure monitor and the throttle guard tell the cluster
//! about an eviction, when something (the optional Kubernetes source,
//! `crate::kube`) can: an Eviction through the API moves the pod, where
//! killing its cgroup only gets its containers restarted in place; an Event
//! on the pod says when the throttle guard relaxed a container's
//! memory.high. Neither needs it, and nothing waits on it past the hard
//! threshold (nor ever for a relax notice).

use std::time::Duration;

/// One eviction, with what the Event on the pod says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionNotice {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub reason: EvictionReason,
    pub working_set: u64,
    pub request: u64,
    pub request_source: String,
}

/// Why a pod is evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionReason {
    /// Node memory below a threshold.
    NodePressure {
        /// Past the hard threshold: the cgroup is killed whatever the API says.
        hard: bool,
        /// memory.available and where it came from.
        available: u64,
        signal: String,
        /// The threshold that was crossed, in bytes.
        threshold: u64,
    },
    /// A container of the pod stayed throttled or stalled past the throttle
    /// guard's grace period, also after its memory.high was relaxed (or
    /// where relaxing could not help).
    Throttle {
        /// The signal that held: `high`, `max` or `psi`.
        signal: String,
        grace: String,
    },
}

impl EvictionNotice {
    /// Past the hard threshold: no grace period, the cgroup is gone already.
    pub fn hard(&self) -> bool {
        matches!(self.reason, EvictionReason::NodePressure { hard: true, .. })
    }
}

impl std::fmt::Display for EvictionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvictionReason::NodePressure {
                hard,
                available,
                signal,
                threshold,
            } => write!(
                f,
                "{signal} {available} below the {} threshold {threshold}",
                if *hard { "hard" } else { "soft" }
            ),
            EvictionReason::Throttle { signal, grace } => {
                write!(
                    f,
                    "memory.high throttle ({signal}) past the {grace} grace period"
                )
            }
        }
    }
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
    /// Soft threshold or throttle guard: create the Eviction and wait at
    /// most `limit` for the answer (a refusal passes the turn to the next
    /// candidate).
    fn evict(&self, notice: &EvictionNotice, limit: Duration) -> EvictOutcome;
    /// Hard threshold: the cgroup was killed; record the Eviction and the
    /// Event in the background, never waiting.
    fn evict_after_kill(&self, notice: EvictionNotice);
    /// The throttle guard relaxed a container: post the Event in the
    /// background, never waiting.
    fn memory_high_relaxed(&self, notice: RelaxNotice);
}

/// How long an eviction waits for the API server's answer at the soft
/// threshold or for the throttle guard (both have time; past the hard
/// threshold nothing waits).
pub const SOFT_EVICTION_WAIT: Duration = Duration::from_secs(2);
