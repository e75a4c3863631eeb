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
mod guard;
pub mod measure;
pub mod protect;
pub mod psi;
pub mod rank;
pub mod throttle;
pub mod tree;
mod triggers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};

pub use config::MonitorConfig;
pub use measure::{
    cgroup_working_set, derive_request, measure, measure_node, NodeMemory, POD_USAGE_SOURCE,
    WS_MEMINFO, WS_ROOT_STAT,
};

use crate::node::cluster;
use crate::node::registry::PodRegistry;
use crate::node::relax::Relaxer;
use act::ProcessOps;
use decide::{Decider, Plan, Reason, Verdict};
use measure::limit_hits;
use rank::{Candidate, RankPolicy, Ranking};
use tree::Discovery;
use triggers::Triggers;

use crate::node::cgroupfs::{self as stat, ReadError};
use crate::node::layout::{find_kubepods, Driver};
use crate::node::time;
use crate::qos::QosClass;

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
}

#[derive(Debug, Clone)]
struct Victim {
    uid: String,
    path: PathBuf,
    since: Duration,
}

/// Below this a pod is not worth a memory.reclaim write.
const MIN_RECLAIM: u64 = 1 << 20;

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

    /// A tick between full steps while calm needs only the quick check;
    /// `Some(next)` when that was enough. Cheap enough to run on the async
    /// loop without a trip to the blocking pool.
    pub fn quick(&mut self, wake: &Wake, now: Duration) -> Option<Duration> {
        let calm = self.victim.is_none()
            && !self.decider.busy()
            && !self.guard.busy()
            && self.fast_until.is_none_or(|t| now >= t);
        if matches!(wake, Wake::Tick) && calm && now < self.next_full {
            self.quick_check()
        } else {
            None
        }
    }

    /// Between full steps while calm: one read of /proc/meminfo. Returns when
    /// to look again, or `None` when MemAvailable is within one threshold of
    /// the thresholds (or unreadable) and a full step should run now. This is
    /// what keeps fast checks cheap: earlyoom's cadence at meminfo's cost.
    fn quick_check(&mut self) -> Option<Duration> {
        let kb = self.mem_available_kb()?;
        let available = kb.checked_mul(1024)?;
        let threshold = self
            .cfg
            .hard_threshold
            .resolve(self.capacity)
            .max(self.cfg.soft_threshold.resolve(self.capacity));
        available.checked_sub(threshold.saturating_mul(2))?;
        Some(self.interval_for(available - threshold))
    }

    /// MemAvailable in kB from the kept-open /proc/meminfo.
    fn mem_available_kb(&mut self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        if self.meminfo.is_none() {
            self.meminfo = std::fs::File::open(self.paths.meminfo()).ok();
        }
        // MemAvailable is the third line; 4 KiB holds the whole file.
        self.meminfo_buf.resize(4096, 0);
        let n = match self.meminfo.as_ref()?.read_at(&mut self.meminfo_buf, 0) {
            Ok(n) => n,
            Err(_) => {
                self.meminfo = None;
                return None;
            }
        };
        let text = std::str::from_utf8(&self.meminfo_buf[..n]).ok()?;
        text.lines().find_map(|l| {
            l.strip_prefix("MemAvailable:")?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
    }

    /// Sooner the closer `headroom` bytes are to being used up at
    /// `max-fill-rate`, between pressure-interval and check-interval.
    fn interval_for(&self, headroom: u64) -> Duration {
        let (slow, fast) = (self.cfg.check_interval.0, self.cfg.pressure_interval.0);
        let rate = self.cfg.max_fill_rate.resolve(self.capacity).max(1);
        Duration::from_secs_f64(headroom as f64 / rate as f64).clamp(fast.min(slow), slow)
    }

    fn measure(&self) -> Result<NodeMemory, MonitorError> {
        let kp = self.kubepods().map(|k| k.0);
        measure(
            &self.paths,
            kp.as_deref().filter(|_| self.cfg.allocatable_signal),
            self.cfg.mem_available_signal,
        )
    }

    pub fn kubepods(&self) -> Option<(PathBuf, Driver)> {
        find_kubepods(&self.paths.cgroup_root, &self.cfg.kubepods)
    }

    /// Every pod under kubepods with its numbers, in UID order.
    /// `check_pause` inspects every pod's processes; eviction skips that and
    /// checks only the pods it is about to pick (cheaper under pressure).
    pub fn candidates(&mut self, check_pause: bool) -> Vec<Candidate> {
        let Some((kp, driver)) = self.kubepods() else {
            tracing::warn!(root = %self.paths.cgroup_root.display(), kubepods = %self.cfg.kubepods, "kubepods cgroup not found");
            return Vec::new();
        };
        let mut out = Vec::new();
        for pod in self.discovery.scan(&kp, driver).into_iter().take(MAX_PODS) {
            let ws = match cgroup_working_set(&pod.path) {
                Ok(ws) => ws,
                Err(e) => {
                    // Usually a pod that just went away.
                    tracing::debug!(pod = %pod.uid, error = %e, "skipping pod without stats");
                    continue;
                }
            };
            let info = self.pods.get(&pod.uid);
            let (class, class_source) = match info.as_ref().and_then(|i| i.class) {
                Some(c) => (c, "registry"),
                None => (pod.class, "cgroup-path"),
            };
            let (request, request_source) = match info
                .as_ref()
                .and_then(|i| i.memory_request.map(|r| (r, i.request_source)))
            {
                Some(r) => r,
                None => derive_request(&pod.path, class),
            };
            out.push(Candidate {
                namespace: info.as_ref().map(|i| i.namespace.clone()),
                name: info.as_ref().map(|i| i.name.clone()),
                priority: info.as_ref().and_then(|i| i.priority),
                uid: pod.uid,
                class,
                class_source,
                working_set: ws,
                request,
                request_source,
                pause_only: check_pause && act::pause_only(&pod.path, &self.paths.proc_root),
                static_pod: info.as_ref().is_some_and(|i| i.static_pod),
                path: pod.path,
            });
        }
        out
    }

    /// Measures and ranks without acting (for `--once` and for tests).
    pub fn snapshot(&mut self) -> Result<(NodeMemory, Vec<Candidate>, Ranking), MonitorError> {
        let node = self.measure()?;
        let cands = self.candidates(true);
        let ranking = rank::rank(&cands, &self.policy);
        Ok((node, cands, ranking))
    }

    fn psi_fields(&self) -> (String, String) {
        let show = |p: Result<psi::Psi, ReadError>| match p {
            Ok(p) => format!(
                "some10={:.2} full10={:.2}",
                p.some.avg10,
                p.full.map_or(0.0, |f| f.avg10)
            ),
            Err(_) => "n/a".into(),
        };
        let node = show(psi::read(&self.paths.node_psi()));
        let kp = match self.kubepods() {
            Some((kp, _)) => show(psi::read(&kp.join("memory.pressure"))),
            None => "n/a".into(),
        };
        (node, kp)
    }

    /// Publishes evictions and node PSI averages to `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn publish_psi(&self) {
        let (Some(m), Ok(p)) = (&self.metrics, psi::read(&self.paths.node_psi())) else {
            return;
        };
        m.set_pressure("memory", "some_avg10", p.some.avg10);
        m.set_pressure("memory", "some_avg60", p.some.avg60);
        m.set_pressure("memory", "some_avg300", p.some.avg300);
        if let Some(f) = p.full {
            m.set_pressure("memory", "full_avg10", f.avg10);
            m.set_pressure("memory", "full_avg60", f.avg60);
            m.set_pressure("memory", "full_avg300", f.avg300);
        }
    }

    pub fn step(&mut self, wake: &Wake, now: Duration) -> StepReport {
        self.step_started = Instant::now();
        self.meminfo = None;
        self.publish_psi();
        if matches!(wake, Wake::Psi { .. }) {
            self.fast_until = Some(now + self.psi_followup);
        }
        let mut report = StepReport {
            verdict: None,
            node: None,
            killed: None,
            would_kill: None,
            evicted: None,
            reclaimed: Vec::new(),
            emptied_after: None,
            limit_bound: Vec::new(),
            relaxed: Vec::new(),
            next_check: self.cfg.pressure_interval.0,
        };

        if let Some(next) = self.quick(wake, now) {
            report.next_check = next;
            return report;
        }

        if let Some(v) = &self.victim {
            if !act::populated(&v.path) {
                tracing::info!(victim = %v.uid, took_ms = time::millis(now.saturating_sub(v.since)), "victim pod cgroup is empty");
                self.decider.kill_finished(now);
                self.victim = None;
            }
        }

        let node = match self.measure() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "cannot measure node memory");
                return report;
            }
        };
        report.node = Some(node);
        self.capacity = node.capacity;
        let verdict = self
            .decider
            .observe(now, node.effective_available(), node.capacity);
        report.verdict = Some(verdict);
        if verdict.kill_timed_out {
            if let Some(v) = self.victim.take() {
                self.stuck.insert(v.path.clone());
                tracing::warn!(victim = %v.uid, path = %v.path.display(), "victim cgroup still populated after kill-timeout; skipping it until pressure ends");
            }
        }

        match verdict.plan {
            Plan::Calm => {
                if matches!(wake, Wake::Psi { .. }) {
                    self.explain_psi(wake, now, &node, &verdict, &mut report);
                }
            }
            Plan::Watch | Plan::Hold(_) => {
                tracing::debug!(plan = ?verdict.plan, available = node.effective_available(), "holding");
            }
            Plan::Reclaim { deficit } => {
                let cands = self.candidates(false);
                let ranking = rank::rank(&cands, &self.policy);
                self.log_decision("reclaim", wake, &node, &verdict, &cands, &ranking);
                self.reclaim_top(deficit, &cands, &ranking, &mut report);
                self.lower_besteffort_high(&cands, &ranking);
            }
            Plan::Evict { reason, deficit } => {
                self.evict(wake, now, node, verdict, reason, deficit, &mut report)
            }
        }

        if self.cfg.throttle.enabled && self.victim.is_none() && report.killed.is_none() {
            self.throttle_pass(wake, now, &mut report);
        }

        if !self.decider.pressure() {
            if !self.lowered_high.is_empty() {
                self.restore_high();
            }
            self.stuck.clear();
        }
        let following_psi = self.fast_until.is_some_and(|t| now < t);
        if !self.decider.busy() && !following_psi {
            report.next_check = self.calm_interval(&report);
            self.next_full = now + self.cfg.check_interval.0;
        }
        if self.guard.busy() {
            report.next_check = report.next_check.min(self.cfg.throttle.interval.0);
        }
        report
    }

    /// While calm: sooner the closer memory.available is to the first
    /// threshold we act on, as earlyoom does (headroom / max fill rate).
    fn calm_interval(&self, report: &StepReport) -> Duration {
        let (Some(node), Some(v)) = (report.node, report.verdict) else {
            return self.cfg.check_interval.0;
        };
        self.interval_for(
            node.effective_available()
                .saturating_sub(v.soft.max(v.hard)),
        )
    }

    fn ranking_brief(cands: &[Candidate], ranking: &Ranking) -> String {
        ranking
            .order
            .iter()
            .take(5)
            .enumerate()
            .map(|(n, &i)| format!("#{} {}", n + 1, cands[i].brief()))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn log_decision(
        &self,
        what: &str,
        wake: &Wake,
        node: &NodeMemory,
        v: &Verdict,
        cands: &[Candidate],
        ranking: &Ranking,
    ) {
        let (psi_node, psi_kubepods) = self.psi_fields();
        tracing::warn!(
            action = what,
            wake = %wake,
            available = node.effective_available(),
            signal = node.signal(),
            node_available = node.available,
            allocatable_available = ?node.allocatable_available,
            mem_available = ?node.mem_available,
            capacity = node.capacity,
            working_set = node.working_set,
            ws_source = node.source,
            hard_threshold = v.hard,
            soft_threshold = v.soft,
            hard_met = v.hard_met,
            soft_met = v.soft_met,
            psi_node = %psi_node,
            psi_kubepods = %psi_kubepods,
            candidates = ranking.order.len(),
            excluded = ranking.excluded.len(),
            usage_source = POD_USAGE_SOURCE,
            ranking = %Self::ranking_brief(cands, ranking),
            dry_run = self.cfg.dry_run,
            "memory pressure decision"
        );
    }

    fn reclaim_top(
        &self,
        deficit: u64,
        cands: &[Candidate],
        ranking: &Ranking,
        report: &mut StepReport,
    ) {
        if !self.cfg.reclaim || ranking.order.is_empty() {
            return;
        }
        let top: Vec<&Candidate> = ranking
            .order
            .iter()
            .take(self.cfg.reclaim_top_n.max(1))
            .map(|&i| &cands[i])
            .collect();
        let each = deficit.div_ceil(top.len() as u64).max(4096);
        let swap = measure::swap_free(&self.paths);
        for c in top {
            let can = measure::reclaimable(&c.path, swap);
            let bytes = each.min(can);
            if bytes < MIN_RECLAIM {
                tracing::debug!(pod = %c.uid, reclaimable = can, swap_free = swap, "nothing to reclaim from this pod");
                continue;
            }
            report.reclaimed.push(c.uid.clone());
            if self.cfg.dry_run {
                tracing::info!(pod = %c.uid, bytes, "dry-run: would write memory.reclaim");
                continue;
            }
            let t = Instant::now();
            match act::reclaim(&c.path, bytes) {
                Ok(outcome) => {
                    tracing::info!(pod = %c.uid, bytes, reclaimable = can, ?outcome, took_us = time::micros(t.elapsed()), "memory.reclaim")
                }
                Err(e) => tracing::warn!(pod = %c.uid, error = %e, "memory.reclaim failed"),
            }
        }
    }

    fn lower_besteffort_high(&mut self, cands: &[Candidate], ranking: &Ranking) {
        let factor = self.cfg.besteffort_memory_high_factor;
        if factor <= 0.0 {
            return;
        }
        for &i in ranking.order.iter().take(self.cfg.reclaim_top_n.max(1)) {
            let c = &cands[i];
            if c.class != QosClass::BestEffort || self.lowered_high.contains_key(&c.path) {
                continue;
            }
            // factor is validated to [0, 1): the product is finite, non-negative, at most working_set.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let high = ((c.working_set as f64 * factor) as u64 / 4096 * 4096).max(4096);
            let path = c.path.join("memory.high");
            let original = stat::read(&path)
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "max".into());
            if self.cfg.dry_run {
                tracing::info!(pod = %c.uid, high, "dry-run: would lower memory.high");
                continue;
            }
            match stat::write_file(&path, &high.to_string()) {
                Ok(()) => {
                    tracing::info!(pod = %c.uid, high, original = %original, "lowered memory.high until pressure ends");
                    self.lowered_high.insert(c.path.clone(), original);
                }
                Err(e) => tracing::warn!(pod = %c.uid, error = %e, "cannot lower memory.high"),
            }
        }
    }

    fn restore_high(&mut self) {
        for (cg, original) in self.lowered_high.drain() {
            if let Err(e) = stat::write_file(&cg.join("memory.high"), &original) {
                tracing::debug!(error = %e, "cannot restore memory.high (pod gone?)");
            } else {
                tracing::info!(path = %cg.display(), high = %original, "restored memory.high");
            }
        }
    }

    /// PSI fired but no threshold is met: say why we are not acting, naming
    /// pods that hit their own memory.max since last time.
    fn explain_psi(
        &mut self,
        wake: &Wake,
        now: Duration,
        node: &NodeMemory,
        v: &Verdict,
        report: &mut StepReport,
    ) {
        let mut seen = HashMap::new();
        if let Some((kp, driver)) = self.kubepods() {
            for pod in self.discovery.scan(&kp, driver).into_iter().take(MAX_PODS) {
                let hits = limit_hits(&pod.path);
                let before = self.limit_seen.get(&pod.path).copied().unwrap_or(0);
                if hits > before {
                    report
                        .limit_bound
                        .push(format!("{}(+{})", pod.uid, hits - before));
                }
                seen.insert(pod.path, hits);
            }
        }
        // Keeps only pods that still exist: bounded by the pod count.
        self.limit_seen = seen;
        let quiet = self
            .last_psi_note
            .is_some_and(|t| now.saturating_sub(t) < self.cfg.transition_period.0);
        if quiet {
            return;
        }
        self.last_psi_note = Some(now);
        let (psi_node, psi_kubepods) = self.psi_fields();
        tracing::info!(
            wake = %wake,
            available = node.effective_available(),
            ws_source = node.source,
            hard_threshold = v.hard,
            soft_threshold = v.soft,
            psi_node = %psi_node,
            psi_kubepods = %psi_kubepods,
            limit_bound = %report.limit_bound.join(","),
            "memory pressure without node shortage: not acting"
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn evict(
        &mut self,
        wake: &Wake,
        now: Duration,
        node: NodeMemory,
        v: Verdict,
        reason: Reason,
        deficit: u64,
        report: &mut StepReport,
    ) {
        let cands = self.candidates(false);
        let ranking = rank::rank(&cands, &self.policy);
        self.log_decision(
            if reason == Reason::Hard {
                "evict-hard"
            } else {
                "evict-soft"
            },
            wake,
            &node,
            &v,
            &cands,
            &ranking,
        );
        // Never the sandbox alone, never an emptied pod: walk down the ranking.
        let proc_root = &self.paths.proc_root;
        let stuck = &self.stuck;
        let top = ranking.order.iter().copied().find(|&i| {
            if stuck.contains(&cands[i].path) {
                tracing::info!(pod = %cands[i].uid, "skipping pod that did not die after an earlier kill");
                return false;
            }
            let skip = act::pause_only(&cands[i].path, proc_root);
            if skip {
                tracing::info!(pod = %cands[i].uid, "skipping pod with only the sandbox (pause) or nothing left");
            }
            !skip
        });
        let Some(top) = top else {
            tracing::error!(
                excluded = ranking.excluded.len(),
                "memory pressure but no eviction candidate"
            );
            return;
        };
        // A synchronous memory.reclaim can take tens of ms; past the hard
        // threshold that delay can let the kernel OOM killer win, so it is
        // opt-in there (the soft band already reclaimed on the way down).
        if self.cfg.reclaim && (reason == Reason::Soft || self.cfg.reclaim_before_hard_kill) {
            self.reclaim_top(deficit, &cands, &ranking, report);
        }
        // Recheck right before the kill, on fresh numbers.
        let fresh = match self.measure() {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "cannot re-measure before kill; not killing");
                return;
            }
        };
        if !self
            .decider
            .still_warranted(now, fresh.effective_available(), fresh.capacity)
        {
            tracing::info!(
                available = fresh.effective_available(),
                signal = fresh.signal(),
                before = node.available,
                "recheck: threshold clear, no kill"
            );
            return;
        }
        if !act::populated(&cands[top].path) {
            tracing::info!(pod = %cands[top].uid, "recheck: victim already empty, deciding again");
            return;
        }
        let threshold = if reason == Reason::Hard {
            v.hard
        } else {
            v.soft
        };
        let notice = |c: &Candidate| {
            Some(cluster::EvictionNotice {
                uid: c.uid.clone(),
                namespace: c.namespace.clone()?,
                name: c.name.clone()?,
                hard: reason == Reason::Hard,
                available: fresh.effective_available(),
                signal: fresh.signal().to_string(),
                threshold,
                working_set: c.working_set,
                request: c.request,
                request_source: c.request_source.to_string(),
            })
        };
        // Soft threshold with the API server: an Eviction moves the pod (the
        // kubelet terminates it gracefully), and a PodDisruptionBudget's
        // refusal passes the turn to the next candidate. No answer: kill.
        let cluster = self.cluster.clone().filter(|_| reason == Reason::Soft);
        let mut top = top;
        if let (Some(api), false) = (cluster, self.cfg.dry_run) {
            let mut refused = 0;
            let mut next = ranking.order.iter().copied().skip_while(|&i| i != top);
            loop {
                let Some(i) = next.next() else {
                    tracing::warn!(refused, "every candidate's PodDisruptionBudget refused an eviction at the soft threshold; nothing evicted");
                    self.decider.kill_started(now);
                    self.decider.kill_finished(now);
                    return;
                };
                if self.stuck.contains(&cands[i].path) || act::pause_only(&cands[i].path, proc_root)
                {
                    continue;
                }
                let Some(n) = notice(&cands[i]) else {
                    top = i;
                    break;
                };
                match api.evict(&n, cluster::SOFT_EVICTION_WAIT) {
                    cluster::EvictOutcome::Created => {
                        tracing::warn!(
                            victim = %cands[i].uid,
                            namespace = %n.namespace,
                            name = %n.name,
                            class = ?cands[i].class,
                            working_set = n.working_set,
                            request = n.request,
                            request_source = %n.request_source,
                            priority = cands[i].priority.unwrap_or(0),
                            available = n.available,
                            signal = %n.signal,
                            "evicted pod through the API server (the kubelet terminates it gracefully)"
                        );
                        report.evicted = Some(cands[i].uid.clone());
                        if let Some(m) = &self.metrics {
                            m.inc_eviction(
                                &format!("{:?}", cands[i].class),
                                &format!("{reason:?}"),
                            );
                        }
                        self.decider.kill_started(now);
                        self.victim = Some(Victim {
                            uid: cands[i].uid.clone(),
                            path: cands[i].path.clone(),
                            since: now,
                        });
                        return;
                    }
                    cluster::EvictOutcome::RefusedByPdb => {
                        refused += 1;
                        tracing::info!(pod = %format_args!("{}/{}", n.namespace, n.name), "PodDisruptionBudget refused the eviction at the soft threshold; trying the next candidate");
                    }
                    cluster::EvictOutcome::Unreachable => {
                        tracing::warn!(pod = %format_args!("{}/{}", n.namespace, n.name), "API server unreachable; killing the pod's cgroup instead");
                        top = i;
                        break;
                    }
                }
            }
        }
        let victim = &cands[top];
        tracing::warn!(
            victim = %victim.uid,
            namespace = victim.namespace.as_deref().unwrap_or("?"),
            name = victim.name.as_deref().unwrap_or("?"),
            class = ?victim.class,
            class_source = victim.class_source,
            working_set = victim.working_set,
            usage_source = POD_USAGE_SOURCE,
            request = victim.request,
            request_source = %victim.request_source,
            priority = victim.priority.unwrap_or(0),
            exceeds_request = victim.exceeds_request(),
            // memory.events.local max of the pod and its containers: a pod
            // at its own limit is logged, not spared (the kubelet ignores it too).
            limit_hits = limit_hits(&victim.path),
            reason = ?reason,
            available = fresh.effective_available(),
            signal = fresh.signal(),
            ws_source = fresh.source,
            path = %victim.path.display(),
            dry_run = self.cfg.dry_run,
            "killing pod"
        );
        let tell_api = notice(victim);
        self.kill(
            victim.clone(),
            wake,
            now,
            Cause::Node(reason),
            tell_api,
            report,
        );
    }

    /// The one kill path (node pressure and the throttle guard): dry-run,
    /// cgroup.kill + process_mrelease, watch the cgroup empty, then the
    /// decider's in-flight / cooldown. `tell_api`: what the API server
    /// learns after the kill, when it is configured.
    fn kill(
        &mut self,
        victim: Candidate,
        wake: &Wake,
        now: Duration,
        cause: Cause,
        tell_api: Option<cluster::EvictionNotice>,
        report: &mut StepReport,
    ) {
        let victim = &victim;
        if self.cfg.dry_run {
            report.would_kill = Some(victim.uid.clone());
            // Behave as if it finished at once, so dry-run logs once per cooldown.
            self.decider.kill_started(now);
            self.decider.kill_finished(now);
            return;
        }
        let t = Instant::now();
        // Detection to decision: the wake-up until the kill is issued.
        let wake_to_kill = t.duration_since(self.step_started);
        match act::kill_pod(&victim.path, self.ops.as_ref(), self.mrelease) {
            Ok(r) => {
                if r.mrelease_unsupported {
                    tracing::info!("process_mrelease unsupported by this kernel; not trying again");
                    self.mrelease = false;
                }
                tracing::warn!(
                    victim = %victim.uid,
                    method = ?r.method,
                    pids = r.pids,
                    mreleased = r.mreleased,
                    mrelease_exiting = r.mrelease_exiting,
                    // cgroup.kill (or per-pid SIGKILL) plus process_mrelease.
                    kill_us = time::micros(t.elapsed()),
                    wake_to_kill_us = time::micros(wake_to_kill),
                    met_to_kill_ms = self
                        .decider
                        .met_since()
                        .map_or(0, |m| time::millis(now.saturating_sub(m))),
                    wake = %wake,
                    cause = ?cause,
                    "killed pod"
                );
                report.killed = Some(victim.uid.clone());
                // Killed first; the API learns of it in the background.
                if let (Some(api), Some(n)) = (&self.cluster, tell_api) {
                    api.evict_after_kill(n);
                }
                if let Some(m) = &self.metrics {
                    let class = format!("{:?}", victim.class);
                    match cause {
                        Cause::Node(reason) => m.inc_eviction(&class, &format!("{reason:?}")),
                        Cause::Throttle(signal) => m.inc_throttle_eviction(&class, signal.label()),
                    }
                }
                self.decider.kill_started(now);
                // Nothing else may happen while the kill is in flight, so
                // watch the cgroup empty closely for a short while: frees the
                // cooldown sooner and measures kill-to-empty to ~5 ms.
                let wait = self.cfg.kill_wait.0;
                while t.elapsed() < wait {
                    if !act::populated(&victim.path) {
                        let took = t.elapsed();
                        tracing::info!(victim = %victim.uid, took_ms = time::millis(took), "victim pod cgroup is empty");
                        report.emptied_after = Some(took);
                        self.decider.kill_finished(now + took);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.victim = Some(Victim {
                    uid: victim.uid.clone(),
                    path: victim.path.clone(),
                    since: now,
                });
            }
            Err(e) => {
                tracing::error!(victim = %victim.uid, error = %e, "kill failed");
                // Cool down anyway so a broken cgroup is not hammered.
                self.decider.kill_started(now);
                self.decider.kill_finished(now);
            }
        }
    }
}

/// Runs the monitor until the future is dropped. Entry point for both the
/// `nri-qos monitor` subcommand and the plugin process.
pub async fn run(
    cfg: MonitorConfig,
    paths: Paths,
    pods: Arc<dyn PodRegistry>,
) -> Result<(), MonitorError> {
    run_with_metrics(cfg, paths, pods, None).await
}

/// `run`, publishing evictions and PSI to the metrics endpoint.
pub async fn run_with_metrics(
    cfg: MonitorConfig,
    paths: Paths,
    pods: Arc<dyn PodRegistry>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) -> Result<(), MonitorError> {
    run_with_cluster(cfg, paths, pods, metrics, None).await
}

/// `run_with_metrics`, also evicting through the API server when `cluster`
/// is given.
pub async fn run_with_cluster(
    cfg: MonitorConfig,
    paths: Paths,
    pods: Arc<dyn PodRegistry>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    cluster: Option<Arc<dyn cluster::ClusterEvictions>>,
) -> Result<(), MonitorError> {
    run_in_plugin(
        cfg,
        paths,
        pods,
        metrics,
        cluster,
        Arc::new(throttle::FileRelaxer),
    )
    .await
}

/// `run_with_cluster`, relaxing memory.high through `relaxer` (the
/// plugin's NRI session).
pub async fn run_in_plugin(
    cfg: MonitorConfig,
    paths: Paths,
    pods: Arc<dyn PodRegistry>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    cluster: Option<Arc<dyn cluster::ClusterEvictions>>,
    relaxer: Arc<dyn Relaxer>,
) -> Result<(), MonitorError> {
    cfg.validate()?;
    if cfg.lock_memory {
        match protect::lock_memory() {
            Ok(()) => {
                tracing::info!("process memory locked as it is touched (mlockall, MCL_ONFAULT)")
            }
            Err(e) => tracing::warn!(error = %e,
                "not locking the process's memory (needs CAP_IPC_LOCK); under pressure the kernel may page out the monitor's code"),
        }
    }
    let mut monitor = Monitor::new(cfg.clone(), paths.clone(), pods, Arc::new(act::Syscalls))
        .with_relaxer(relaxer);
    if let Some(m) = metrics {
        monitor = monitor.with_metrics(m);
    }
    if let Some(c) = cluster {
        monitor = monitor.with_cluster(c);
    }
    let nice = cfg.nice;
    start(cfg, paths, monitor, Arc::new(SystemClock::default()), nice).await
}

/// `run` with the process syscalls and the clock injected.
pub async fn run_with(
    cfg: MonitorConfig,
    paths: Paths,
    pods: Arc<dyn PodRegistry>,
    ops: Arc<dyn ProcessOps>,
    clock: Arc<dyn Clock>,
) -> Result<(), MonitorError> {
    cfg.validate()?;
    let monitor = Monitor::new(cfg.clone(), paths.clone(), pods, ops);
    start(cfg, paths, monitor, clock, 0).await
}

/// Arms the PSI triggers on the current runtime and runs the loop on a
/// thread of its own. A thread, not a task: a sleeping thread wakes once
/// per check, where tokio's timer wheel wakes twice for every timeout over
/// 64 ms, which was half the idle cost; and a step's blocking file I/O and
/// kill wait never hold up the plugin's NRI handlers.
/// `nice` is applied to the monitor thread alone (0 leaves it).
async fn start(
    cfg: MonitorConfig,
    paths: Paths,
    monitor: Monitor,
    clock: Arc<dyn Clock>,
    nice: i32,
) -> Result<(), MonitorError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(16);
    let mut triggers = Triggers::new(&cfg, &paths, tx.clone(), tokio::runtime::Handle::current());
    triggers.arm();
    tracing::info!(
        cgroup_root = %paths.cgroup_root.display(),
        proc_root = %paths.proc_root.display(),
        kubepods = ?monitor.kubepods(),
        psi_targets_armed = triggers.armed(),
        hard = %cfg.hard_threshold,
        soft = %cfg.soft_threshold,
        dry_run = cfg.dry_run,
        "memory-pressure monitor started"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let thread_stop = stop.clone();
    std::thread::Builder::new()
        .name("nri-qos-monitor".into())
        .spawn(move || {
            if nice != 0 {
                match protect::set_thread_nice(nice) {
                    Ok(()) => tracing::info!(nice, "monitor thread priority raised"),
                    Err(e) => tracing::warn!(nice, error = %e,
                        "cannot set the monitor thread's nice value (needs CAP_SYS_NICE); it competes for CPU like any process"),
                }
            }
            let r = drive(monitor, rx, clock, Some(triggers), &thread_stop);
            let _ = done_tx.send(r);
        })
        .map_err(MonitorError::Spawn)?;
    // Dropping this future (shutdown, select!) stops the thread at once.
    let _stop = StopOnDrop { stop, tx };
    done_rx
        .await
        .map_err(|_| MonitorError::Task("the monitor thread panicked".into()))?
}

struct StopOnDrop {
    stop: Arc<AtomicBool>,
    tx: SyncSender<Wake>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.tx.try_send(Wake::Tick);
    }
}

/// The loop: wait for a wake-up or the next check, then step, until the
/// channel closes or `stop` is set.
fn drive(
    mut monitor: Monitor,
    rx: Receiver<Wake>,
    clock: Arc<dyn Clock>,
    mut triggers: Option<Triggers>,
    stop: &AtomicBool,
) -> Result<(), MonitorError> {
    let mut next = Duration::ZERO;
    loop {
        let wake = match rx.recv_timeout(next) {
            Ok(w) => w,
            Err(RecvTimeoutError::Timeout) => Wake::Tick,
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(t) = triggers.as_mut() {
            match &wake {
                Wake::PsiLost { source } => t.lost(source),
                Wake::Tick => t.arm(),
                Wake::Psi { .. } => {}
            }
        }
        let now = clock.now();
        next = match monitor.quick(&wake, now) {
            Some(quick) => quick,
            None => monitor.step(&wake, now).next_check,
        };
    }
}

/// Drives a monitor on the calling thread from an injected channel of
/// wake-ups until it closes (tests, embedders with their own wake-ups).
pub fn drive_with(
    monitor: Monitor,
    rx: Receiver<Wake>,
    clock: Arc<dyn Clock>,
) -> Result<(), MonitorError> {
    drive(monitor, rx, clock, None, &AtomicBool::new(false))
}

#[cfg(test)]
mod tests;
