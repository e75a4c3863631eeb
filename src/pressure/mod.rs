//! The node memory-pressure monitor.
//!
//! PSI triggers (on `/proc/pressure/memory` and on the kubepods cgroup) wake
//! the monitor within one trigger window; a low-rate tick covers the rest.
//! On every wake-up it computes memory.available the kubelet way and feeds
//! it to a pure state machine ([`decide`]); pressure alone never causes an
//! action. Victims are whole pods, ranked like the kubelet ([`rank`]),
//! reclaimed first and killed through `cgroup.kill` ([`act`]).
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
//!   it, else derived from cgroupfs ([`derive_request`], the cgroup path).
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

pub mod act;
pub mod cli;
pub mod config;
pub mod decide;
mod evict;
mod guard;
pub mod measure;
mod monitor;
pub mod protect;
pub mod psi;
pub mod rank;
mod runner;
pub mod throttle;
pub mod tree;
mod triggers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use config::MonitorConfig;
pub use measure::{
    cgroup_working_set, derive_request, measure, measure_node, NodeMemory, POD_USAGE_SOURCE,
    WS_MEMINFO, WS_ROOT_STAT,
};
pub use runner::{drive_with, run, run_in_plugin, run_with};

use crate::node::cluster;
use crate::node::registry::PodRegistry;
use crate::node::relax::Relaxer;
use act::ProcessOps;
use decide::{Decider, Reason, Verdict};
use rank::RankPolicy;
use tree::Discovery;

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

/// Monotonic time since an arbitrary start; injected so tests use a fake clock.
pub trait Clock: Send + Sync {
    fn now(&self) -> Duration;
}

#[derive(Debug)]
pub struct SystemClock(Instant);

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock(Instant::now())
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
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
    /// Container cgroups whose memory.high the throttle guard relaxed (or
    /// would, in dry-run) in this step.
    pub relaxed: Vec<PathBuf>,
    pub next_check: Duration,
}

/// Why a pod is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    Node(Reason),
    Throttle(throttle::Signal),
    /// An Eviction through the API server (counted when it was created)
    /// that nobody carried out in time.
    UnenforcedEviction,
}

#[derive(Debug, Clone)]
struct Victim {
    uid: String,
    path: PathBuf,
    since: Duration,
    /// Evicted through the API server, not killed: the candidate to kill if
    /// nobody carries the Eviction out in time.
    via_api: Option<rank::Candidate>,
}

/// Bound on pods considered per scan (bounded memory and time).
const MAX_PODS: usize = 4096;

/// The monitor's state between wake-ups. `step` does synchronous I/O; the
/// async loop runs it on the blocking pool.
pub struct Monitor {
    cfg: MonitorConfig,
    paths: Paths,
    pods: Arc<dyn PodRegistry>,
    ops: Arc<dyn ProcessOps>,
    decider: Decider,
    policy: RankPolicy,
    discovery: Discovery,
    victim: Option<Victim>,
    /// Last seen memory.events.local `max` per pod cgroup.
    limit_seen: HashMap<PathBuf, u64>,
    /// Original memory.high of BestEffort pods we lowered.
    lowered_high: HashMap<PathBuf, String>,
    /// Pods still populated after kill-timeout (e.g. a task stuck in D
    /// state): skipped until the pressure episode ends, so the next pod gets
    /// its turn. Bounded by the pod count.
    stuck: std::collections::HashSet<PathBuf>,
    mrelease: bool,
    last_psi_note: Option<Duration>,
    /// When the current step began, for the wake-to-kill latency log.
    step_started: Instant,
    /// After a PSI wake-up, keep checking fast for one trigger window (as
    /// lmkd does): memory may keep falling without another event.
    psi_followup: Duration,
    fast_until: Option<Duration>,
    /// Prometheus counters and gauges, when the endpoint is on.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// While calm, the next full measurement (cgroup stats, ranking inputs);
    /// ticks before it only read MemAvailable.
    next_full: Duration,
    /// MemTotal as last measured (thresholds may be percentages of it).
    capacity: u64,
    /// /proc/meminfo kept open for the quick checks: re-reading an open
    /// procfs file at offset 0 costs half of open+read+close. Reopened at
    /// every full step, so a replaced file is picked up.
    meminfo: Option<std::fs::File>,
    meminfo_buf: Vec<u8>,
    /// The per-container memory.high throttle guard and its cheap filter.
    guard: throttle::Guard,
    throttle_filter: throttle::Filter,
    relaxer: Arc<dyn Relaxer>,
    /// Evictions through the API server, when it is configured.
    cluster: Option<Arc<dyn cluster::ClusterEvictions>>,
}

impl Monitor {
    pub fn new(
        cfg: MonitorConfig,
        paths: Paths,
        pods: Arc<dyn PodRegistry>,
        ops: Arc<dyn ProcessOps>,
    ) -> Self {
        let policy = RankPolicy {
            critical_namespaces: cfg.critical_namespaces.clone(),
            critical_priority: cfg.critical_priority,
            require_pod_info: cfg.require_pod_info,
        };
        let psi_followup = cfg
            .psi_triggers
            .iter()
            .filter_map(|t| t.parse::<psi::Trigger>().ok())
            .map(|t| Duration::from_micros(t.window_us))
            .max()
            .unwrap_or(Duration::from_secs(1));
        let guard = throttle::Guard::new(cfg.throttle.clone());
        Monitor {
            psi_followup,
            fast_until: None,
            metrics: None,
            decider: Decider::new((&cfg).into()),
            mrelease: cfg.mrelease,
            cfg,
            paths,
            pods,
            ops,
            policy,
            discovery: Discovery::default(),
            victim: None,
            limit_seen: HashMap::new(),
            lowered_high: HashMap::new(),
            stuck: std::collections::HashSet::new(),
            last_psi_note: None,
            step_started: Instant::now(),
            next_full: Duration::ZERO,
            capacity: 0,
            meminfo: None,
            meminfo_buf: Vec::new(),
            guard,
            throttle_filter: throttle::Filter::default(),
            relaxer: Arc::new(throttle::FileRelaxer),
            cluster: None,
        }
    }

    /// Relaxes memory.high through `relaxer` (the plugin's NRI session)
    /// instead of writing the cgroup file.
    pub fn with_relaxer(mut self, relaxer: Arc<dyn Relaxer>) -> Self {
        self.relaxer = relaxer;
        self
    }

    /// Also evict through the API server (see [`cluster`]).
    pub fn with_cluster(mut self, cluster: Arc<dyn cluster::ClusterEvictions>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Publishes evictions and node PSI averages to `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

#[cfg(test)]
mod tests;
