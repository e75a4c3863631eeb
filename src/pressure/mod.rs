//! The node memory-pressure monitor.
//!
//! PSI triggers (on `/proc/pressure/memory` and on the kubepods cgroup) wake
//! the monitor within one trigger window; a low-rate tick covers the rest.
//! On every wake-up it computes memory.available the kubelet way and feeds
//! it to a pure state machine ([`decide`]); pressure alone never causes an
//! action. Victims are whole pods, ranked like the kubelet, reclaimed first
//! ([`reclaim`]) and evicted through the eviction path the throttle guard
//! shares ([`crate::evict`]).
//!
//! All paths are injected ([`Paths`]) so tests run on a temp tree.
//!
//! Where the numbers come from (each is named in the log line that uses it):
//! - node working set: root `memory.stat` anon + file − inactive_file (what
//!   cAdvisor does on v2), else `/proc/meminfo` MemTotal − MemFree −
//!   Inactive(file); capacity is MemTotal;
//! - allocatable: kubepods `memory.max` − kubepods working set;
//! - pod usage: pod `memory.current` − `inactive_file`;
//! - pod request / class / priority: the [`PodRegistry`] when the plugin fed
//!   it, else derived from cgroupfs (`evict::pods::derive_request`, the
//!   cgroup path).
//!
//! Deliberate differences from the kubelet's eviction manager:
//! - pods whose stats cannot be read are skipped (the kubelet ranks them
//!   first; here they are almost always pods that just went away);
//! - Guaranteed pods rank after every other pod;
//! - critical = namespace in `critical-namespaces` or priority >=
//!   `critical-priority`; static/mirror pods are only known through the
//!   registry;
//! - the kill is SIGKILL of the whole pod cgroup, without a grace period,
//!   and the kubelet will restart the containers (the pod is not marked
//!   Failed: runtimes ignore NRI evictions).

pub mod cli;
pub mod config;
pub mod decide;
mod evict;
pub mod measure;
mod monitor;
pub mod protect;
pub mod psi;
pub mod reclaim;
mod runner;
mod triggers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::node::time::{Clock, SystemClock};
pub use config::MonitorConfig;
pub use measure::{measure, measure_node, NodeMemory, WS_MEMINFO, WS_ROOT_STAT};
pub use runner::{drive_with, run, MonitorHandles};

use crate::evict::pods::UsageError;
use crate::evict::rank::RankPolicy;
use crate::evict::{EvictConfig, PodScanner, PodTree, SharedEvictor};
use crate::node::registry::PodRegistry;
use decide::{Decider, Verdict};

use crate::node::cgroupfs::ReadError;

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
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
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Usage(#[from] UsageError),
    #[error("{path}: no {key}")]
    Missing { path: PathBuf, key: &'static str },
    #[error("monitor task failed: {0}")]
    Task(String),
    #[error("monitor task failed: starting the monitor thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Where the kernel interfaces live. Production: `/sys/fs/cgroup`, `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub cgroup_root: PathBuf,
    pub proc_root: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            cgroup_root: "/sys/fs/cgroup".into(),
            proc_root: "/proc".into(),
        }
    }
}

impl Paths {
    pub fn meminfo(&self) -> PathBuf {
        self.proc_root.join("meminfo")
    }
    pub fn node_psi(&self) -> PathBuf {
        self.proc_root.join("pressure/memory")
    }
}

/// Why the monitor woke up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// The periodic check (fast while under pressure, slow when calm).
    Tick,
    /// A PSI trigger fired.
    Psi { source: String },
    /// A PSI trigger's source went away (POLLERR); it is re-armed later.
    PsiLost { source: String },
}

impl std::fmt::Display for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wake::Tick => f.write_str("tick"),
            Wake::Psi { source } => write!(f, "psi:{source}"),
            Wake::PsiLost { source } => write!(f, "psi-lost:{source}"),
        }
    }
}

/// What one step did; tests assert on it, the loop uses `next_check`.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    pub verdict: Option<Verdict>,
    pub node: Option<NodeMemory>,
    /// UID of the pod killed in this step.
    pub killed: Option<String>,
    /// UID dry-run would have killed.
    pub would_kill: Option<String>,
    /// UID evicted through the API server (soft threshold, not killed).
    pub evicted: Option<String>,
    /// UIDs whose memory.reclaim was written (or would be, in dry-run).
    pub reclaimed: Vec<String>,
    /// The victim's cgroup emptied within kill-wait, after this long.
    pub emptied_after: Option<Duration>,
    /// Pods whose own memory.max explains a PSI wake-up.
    pub limit_bound: Vec<String>,
    pub next_check: Duration,
}

impl StepReport {
    fn new(next_check: Duration) -> Self {
        StepReport {
            verdict: None,
            node: None,
            killed: None,
            would_kill: None,
            evicted: None,
            reclaimed: Vec::new(),
            emptied_after: None,
            limit_bound: Vec::new(),
            next_check,
        }
    }
}

/// The eviction path's settings from `[monitor]`, where its keys live
/// (the throttle guard's evictions use them too).
impl From<&MonitorConfig> for EvictConfig {
    fn from(c: &MonitorConfig) -> Self {
        EvictConfig {
            dry_run: c.dry_run,
            cooldown: c.cooldown.0,
            kill_timeout: c.kill_timeout.0,
            kill_wait: c.kill_wait.0,
            mrelease: c.mrelease,
            rank: c.rank_policy(),
        }
    }
}

impl MonitorConfig {
    /// Who may never be evicted.
    pub fn rank_policy(&self) -> RankPolicy {
        RankPolicy {
            critical_namespaces: self.critical_namespaces.clone(),
            critical_priority: self.critical_priority,
            require_pod_info: self.require_pod_info,
        }
    }

    /// Where the pods live, for `paths`.
    pub fn pod_tree(&self, paths: &Paths) -> PodTree {
        PodTree {
            cgroup_root: paths.cgroup_root.clone(),
            proc_root: paths.proc_root.clone(),
            kubepods: self.kubepods.clone(),
        }
    }
}

/// Between full steps while calm, the monitor reads only MemAvailable.
#[derive(Debug, Default)]
struct QuickCheck {
    /// While calm, the next full measurement (cgroup stats, ranking inputs);
    /// ticks before it only read MemAvailable.
    next_full: Duration,
    /// MemTotal as last measured (thresholds may be percentages of it).
    capacity: u64,
    /// /proc/meminfo kept open for the quick checks: re-reading an open
    /// procfs file at offset 0 costs half of open+read+close. Reopened at
    /// every full step, so a replaced file is picked up.
    meminfo: Option<std::fs::File>,
    buf: Vec<u8>,
}

/// The monitor's state between wake-ups. `step` does synchronous I/O; the
/// loop runs it on a thread of its own.
pub struct Monitor {
    cfg: MonitorConfig,
    paths: Paths,
    scanner: PodScanner,
    evictor: SharedEvictor,
    decider: Decider,
    policy: RankPolicy,
    /// Last seen memory.events.local `max` per pod cgroup.
    limit_seen: HashMap<PathBuf, u64>,
    /// Original memory.high of BestEffort pods we lowered.
    lowered_high: HashMap<PathBuf, String>,
    last_psi_note: Option<Duration>,
    /// When the current step began, for the wake-to-kill latency log.
    step_started: Instant,
    /// After a PSI wake-up, keep checking fast for one trigger window (as
    /// lmkd does): memory may keep falling without another event.
    psi_followup: Duration,
    fast_until: Option<Duration>,
    /// Prometheus gauges (PSI), when the endpoint is on.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    quick: QuickCheck,
}

impl Monitor {
    /// `evictor` is the eviction path, shared with the throttle guard when
    /// it runs.
    pub fn new(
        cfg: MonitorConfig,
        paths: Paths,
        pods: Arc<dyn PodRegistry>,
        evictor: SharedEvictor,
    ) -> Self {
        let psi_followup = cfg
            .psi_triggers
            .iter()
            .filter_map(|t| t.parse::<psi::Trigger>().ok())
            .map(|t| Duration::from_micros(t.window_us))
            .max()
            .unwrap_or(Duration::from_secs(1));
        Monitor {
            psi_followup,
            fast_until: None,
            metrics: None,
            decider: Decider::new((&cfg).into()),
            policy: cfg.rank_policy(),
            scanner: PodScanner::new(cfg.pod_tree(&paths), pods),
            evictor,
            cfg,
            paths,
            limit_seen: HashMap::new(),
            lowered_high: HashMap::new(),
            last_psi_note: None,
            step_started: Instant::now(),
            quick: QuickCheck::default(),
        }
    }

    /// Publishes node PSI averages to `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

#[cfg(test)]
mod tests;
