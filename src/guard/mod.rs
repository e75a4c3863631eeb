//! The memory.high throttle guard.
//!
//! A container whose anonymous memory sits between memory.high and
//! memory.max on a node without swap is throttled on every allocation and
//! never OOM-killed: the kernel leaves that failure mode to userspace. The
//! plugin puts memory.high on Burstable and BestEffort containers, so the
//! guard watches it, in the plugin's process by default, with or without
//! the node-pressure monitor:
//!
//! - signals per container cgroup: the rates of `memory.events` `high` and
//!   `max` (delta / elapsed; a counter that goes down or a new container id
//!   starts a new baseline) and `memory.pressure` `some avg10`;
//! - a container is under throttle while any signal is above its threshold;
//!   the timer restarts only when all are below;
//! - stage 1: `high` active past the grace period ⇒ raise memory.high to
//!   memory.max (`node::cgroupfs::RELAXED_WITHOUT_LIMIT` without a
//!   limit), once;
//! - stage 2: still under throttle a grace period after relaxing (plus the
//!   time PSI avg10 needs to decay; PSI alone only from [`PSI_AFTER_RELAX`]
//!   on), or past grace without `high` at all (a stall that is not at the
//!   container's own memory.high) ⇒ the pod is evicted, ranked like node
//!   pressure, through the eviction path the node-pressure monitor shares
//!   ([`crate::evict`]: one in flight across both, its cooldown, never
//!   Guaranteed, never critical, never a pod with only its sandbox; an
//!   Eviction through the API server when there is one).
//!
//! Guaranteed pods are never read. Reading is cheap: the QoS parents'
//! hierarchical `memory.events` and `memory.pressure` are read first and a
//! class is descended into only when they moved (see [`sample`]).
//!
//! The state machine ([`Throttles`]) is pure: samples and time come in as
//! arguments; [`Guard`] is its I/O edge.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod config;
pub mod decide;
mod pass;
pub mod relax;
mod runner;
pub mod sample;

pub use config::{ThrottleConfig, UnguardedMemoryHigh};
pub use decide::{
    rate, Signal, Signals, ThrottleDecision, Throttles, PSI_AFTER_RELAX, PSI_SETTLE, RATE_WINDOW,
};
pub use relax::{high_value, FileRelaxer};
pub use runner::{run, GuardHandles};
pub use sample::{EventCounts, Filter, Sample};

use crate::evict::{self, Acted, PodScanner, PodTree, SharedEvictor};
use crate::metrics::Metrics;
use crate::node::cluster::ClusterEvictions;
use crate::node::registry::PodRegistry;
use crate::node::relax::Relaxer;

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("config: {0}")]
    Config(String),
    /// A config document that does not parse; `at` names it (and the
    /// table), the parser's error is kept as the source.
    #[error("config: {at}{source}")]
    ConfigParse {
        at: String,
        #[source]
        source: toml::de::Error,
    },
    #[error("throttle guard task failed: {0}")]
    Task(String),
    #[error("throttle guard task failed: starting its thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// What one look did; tests assert on it, the loop uses `next_check`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GuardReport {
    /// Container cgroups whose memory.high was relaxed (or would be, in a
    /// dry run) in this look.
    pub relaxed: Vec<PathBuf>,
    /// What the eviction path did for the guard.
    pub acted: Acted,
    pub next_check: Duration,
}

/// The guard's state between looks. `step` does synchronous I/O; the loop
/// runs it on a thread of its own.
pub struct Guard {
    cfg: ThrottleConfig,
    /// `[throttle] dry-run`, or the eviction path's (`[monitor] dry-run`).
    dry_run: bool,
    scanner: PodScanner,
    evictor: SharedEvictor,
    throttles: Throttles,
    filter: Filter,
    relaxer: Arc<dyn Relaxer>,
    /// `MemoryHighRelaxed` Events, when the API server is configured.
    cluster: Option<Arc<dyn ClusterEvictions>>,
    metrics: Option<Arc<Metrics>>,
    /// When the current look began, for the wake-to-kill latency log.
    started: Instant,
}

impl Guard {
    /// Relaxes through the cgroup file until [`Guard::with_relaxer`] says
    /// otherwise; evicts through `evictor`.
    pub fn new(
        cfg: ThrottleConfig,
        tree: PodTree,
        pods: Arc<dyn PodRegistry>,
        evictor: SharedEvictor,
    ) -> Self {
        let dry_run = cfg.dry_run || evict::lock(&evictor).config().dry_run;
        Guard {
            throttles: Throttles::new(cfg.clone()),
            cfg,
            dry_run,
            scanner: PodScanner::new(tree, pods),
            evictor,
            filter: Filter::default(),
            relaxer: Arc::new(FileRelaxer),
            cluster: None,
            metrics: None,
            started: Instant::now(),
        }
    }

    /// Relaxes memory.high through `relaxer` (the plugin's NRI session).
    pub fn with_relaxer(mut self, relaxer: Arc<dyn Relaxer>) -> Self {
        self.relaxer = relaxer;
        self
    }

    /// Posts an Event on each relaxed pod through the API server.
    pub fn with_cluster(mut self, cluster: Arc<dyn ClusterEvictions>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Counts relaxes and the containers under throttle in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// One look: the eviction in flight, every container worth watching,
    /// relaxes, and at most one eviction.
    pub fn step(&mut self, now: Duration) -> GuardReport {
        self.started = Instant::now();
        let mut report = GuardReport::default();
        self.settle(now, &mut report);
        if let Some((kp, driver)) = self.scanner.kubepods() {
            let evict = self.pass(now, &kp, driver, &mut report);
            if !evict.is_empty() {
                self.evict(now, &evict, &mut report);
            }
        }
        report.next_check = if self.throttles.busy() {
            let due = self.throttles.next_due(now).unwrap_or(Duration::MAX);
            self.cfg.interval.0.min(due)
        } else {
            self.cfg.check_interval.0
        };
        report
    }
}

#[cfg(test)]
mod tests;
