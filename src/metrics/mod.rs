//! Prometheus metrics: the lock-free registry the NRI hooks, the keeper and
//! the monitor record into, and its text exposition (format 0.0.4). The
//! loopback HTTP endpoint that serves it is `http.rs`.
//!
//! Metric names use the `nri_qos_` prefix: `nri-qos_` cannot be used
//! because Prometheus names must match `[a-zA-Z_:][a-zA-Z0-9_:]*` (no `-`).
//!
//! Hand-written rather than the `prometheus-client` crate: five metric
//! families with label values from fixed sets fit in fixed arrays of atomics,
//! so recording is lock-free and allocation-free in the NRI hooks, memory is
//! bounded by construction, and we avoid a dependency for ~100 lines of text
//! formatting. Unknown label values are recorded as `"other"`.

mod events;
mod http;

pub use events::{EVENTS, EVENT_PATHS};
pub use http::{
    bind, check_health, serve, serve_on, MetricsError, MAX_CONNECTIONS, MAX_REQUEST_BYTES,
    REQUEST_TIMEOUT, WRITE_TIMEOUT,
};

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::node::time;

/// Kubernetes QoS class label values (`class`), spelled as Kubernetes does
/// (and as `QosClass`'s `Debug`, so `format!("{class:?}")` fits).
pub const CLASSES: &[&str] = &["Guaranteed", "Burstable", "BestEffort", OTHER];
/// Outcome label values (`result`) of one container adjustment.
pub const RESULTS: &[&str] = &["applied", "unchanged", "dry_run", "error", OTHER];
/// PSI resources (`resource`).
pub const RESOURCES: &[&str] = &["memory", "cpu", "io", OTHER];
/// Pressure kinds (`kind`): PSI `some`/`full` averages.
pub const KINDS: &[&str] = &[
    "some_avg10",
    "some_avg60",
    "some_avg300",
    "full_avg10",
    "full_avg60",
    "full_avg300",
    OTHER,
];
/// Why the monitor evicted (`reason`): its hard threshold was crossed, or
/// its soft threshold held for the grace period (`pressure::decide::Reason`;
/// its `Debug` names match case-insensitively).
pub const REASONS: &[&str] = &["hard", "soft", OTHER];
/// Which throttle-guard signal led to an eviction (`signal`;
/// `pressure::throttle::Signal::label`).
pub const SIGNALS: &[&str] = &["high", "max", "psi", OTHER];
/// Label value for anything outside the sets above.
pub const OTHER: &str = "other";

/// Upper bounds of `nri_qos_hook_duration_seconds` (10 µs .. 100 ms; +Inf implied).
pub const HOOK_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1,
];

fn index(set: &[&str], value: &str) -> usize {
    set.iter()
        .position(|s| s.eq_ignore_ascii_case(value))
        .unwrap_or(set.len() - 1)
}

fn counters(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// All metrics of the process. `Send + Sync`; share it as `Arc<Metrics>`.
pub struct Metrics {
    adjustments: Box<[AtomicU64]>,
    evictions: Box<[AtomicU64]>,
    /// f64 bits, with `pressure_set` telling whether a value was ever set.
    pressure: Box<[AtomicU64]>,
    pressure_set: Box<[AtomicBool]>,
    /// Non-cumulative counts per bucket; the last one is +Inf.
    hook_buckets: Box<[AtomicU64]>,
    hook_sum_nanos: AtomicU64,
    hook_count: AtomicU64,
    runtime_connected: AtomicBool,
    throttle_relaxed: Box<[AtomicU64]>,
    throttle_evictions: Box<[AtomicU64]>,
    throttle_under: AtomicU64,
    /// The optional Kubernetes API source (`crate::kube`); its series
    /// appear only when it runs.
    kube: KubeMetrics,
    /// Pod, QoS and kubepods cgroups whose protection each owner writes,
    /// in [`PROTECTION_OWNERS`] order.
    protection_owners: Box<[AtomicU64]>,
    events: events::EventCounters,
}

/// Outcomes of an Eviction through the API server (`outcome`).
pub const EVICTION_OUTCOMES: &[&str] = &["created", "refused_pdb", "unreachable"];

#[derive(Default)]
struct KubeMetrics {
    configured: AtomicBool,
    connected: AtomicBool,
    pods: AtomicU64,
    lag_micros: AtomicU64,
    evictions: [AtomicU64; 3],
    relists: AtomicU64,
    expired: AtomicU64,
}

/// `owner` label values of `nri_qos_protection_cgroups`.
pub const PROTECTION_OWNERS: &[&str] = &["kubelet", "nri-qos"];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            adjustments: counters(CLASSES.len() * RESULTS.len()),
            evictions: counters(CLASSES.len() * REASONS.len()),
            pressure: counters(RESOURCES.len() * KINDS.len()),
            pressure_set: (0..RESOURCES.len() * KINDS.len())
                .map(|_| AtomicBool::new(false))
                .collect(),
            hook_buckets: counters(HOOK_BUCKETS.len() + 1),
            hook_sum_nanos: AtomicU64::new(0),
            hook_count: AtomicU64::new(0),
            runtime_connected: AtomicBool::new(false),
            throttle_relaxed: counters(CLASSES.len()),
            throttle_evictions: counters(CLASSES.len() * SIGNALS.len()),
            throttle_under: AtomicU64::new(0),
            kube: KubeMetrics::default(),
            protection_owners: counters(PROTECTION_OWNERS.len()),
            events: events::EventCounters::default(),
        }
    }

    /// Counts one container adjustment; `class` in [`CLASSES`], `result` in
    /// [`RESULTS`] (case-insensitive; anything else counts as `other`).
    pub fn record_adjustment(&self, class: &str, result: &str) {
        let i = index(CLASSES, class) * RESULTS.len() + index(RESULTS, result);
        self.adjustments[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Records how long one NRI hook took.
    pub fn observe_hook(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let bucket = HOOK_BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(HOOK_BUCKETS.len());
        self.hook_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.hook_sum_nanos
            .fetch_add(time::nanos(d), Ordering::Relaxed);
        self.hook_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets a pressure gauge; `resource` in [`RESOURCES`], `kind` in [`KINDS`].
    /// Series appear once set, so a node without a monitor shows none.
    pub fn set_pressure(&self, resource: &str, kind: &str, v: f64) {
        let i = index(RESOURCES, resource) * KINDS.len() + index(KINDS, kind);
        self.pressure[i].store(v.to_bits(), Ordering::Relaxed);
        self.pressure_set[i].store(true, Ordering::Relaxed);
    }

    /// Counts one eviction; `class` in [`CLASSES`], `reason` in [`REASONS`].
    pub fn inc_eviction(&self, class: &str, reason: &str) {
        let i = index(CLASSES, class) * REASONS.len() + index(REASONS, reason);
        self.evictions[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one container whose memory.high the throttle guard relaxed.
    pub fn inc_throttle_relaxed(&self, class: &str) {
        self.throttle_relaxed[index(CLASSES, class)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one throttle-guard eviction; `signal` in [`SIGNALS`].
    pub fn inc_throttle_eviction(&self, class: &str, signal: &str) {
        let i = index(CLASSES, class) * SIGNALS.len() + index(SIGNALS, signal);
        self.throttle_evictions[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Containers under throttle at the guard's last look.
    pub fn set_throttle_under(&self, n: usize) {
        self.throttle_under.store(n as u64, Ordering::Relaxed);
    }

    /// Whether we currently have a registered session with the runtime.
    pub fn set_runtime_connected(&self, connected: bool) {
        self.runtime_connected.store(connected, Ordering::Relaxed);
    }

    /// The Kubernetes API source runs: its series appear from now on.
    pub fn set_kube_configured(&self) {
        self.kube.configured.store(true, Ordering::Relaxed);
    }

    /// Whether the watch of this node's pods is listed and not failing.
    pub fn set_kube_connected(&self, up: bool) {
        self.kube.connected.store(up, Ordering::Relaxed);
    }

    /// Pods the API source knows on this node.
    pub fn set_kube_pods(&self, n: u64) {
        self.kube.pods.store(n, Ordering::Relaxed);
    }

    /// Delay from the API server's last write of a pod to our watch event.
    pub fn set_kube_watch_lag(&self, d: Duration) {
        self.kube
            .lag_micros
            .store(time::micros(d), Ordering::Relaxed);
    }

    /// Counts one completed list of this node's pods (the first one too).
    pub fn inc_kube_relist(&self) {
        self.kube.relists.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one watch the API server ended with 410 Gone (its resource
    /// version expired); a relist follows.
    pub fn inc_kube_watch_expired(&self) {
        self.kube.expired.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one Eviction by its outcome.
    pub fn inc_kube_eviction(&self, outcome: crate::node::cluster::EvictOutcome) {
        use crate::node::cluster::EvictOutcome::*;
        let i = match outcome {
            Created => 0,
            RefusedByPdb => 1,
            Unreachable => 2,
        };
        self.kube.evictions[i].fetch_add(1, Ordering::Relaxed);
    }

    fn render_kube(&self, o: &mut String) {
        let k = &self.kube;
        if !k.configured.load(Ordering::Relaxed) {
            return;
        }
        gauge(
            o,
            "nri_qos_kube_connected",
            "1 while the watch of this node's pods on the API server is listed and not failing.",
            u8::from(k.connected.load(Ordering::Relaxed)),
        );
        gauge(
            o,
            "nri_qos_kube_pods",
            "Pods on this node the API source knows.",
            k.pods.load(Ordering::Relaxed),
        );
        gauge(
            o,
            "nri_qos_kube_watch_lag_seconds",
            "Delay from the API server's last write of a pod to the watch event for it (latest event; includes clock skew).",
            float(k.lag_micros.load(Ordering::Relaxed) as f64 / 1e6),
        );
        counter(
            o,
            "nri_qos_kube_lists_total",
            "Completed lists of this node's pods: the first, and each relist after a broken or expired watch.",
            k.relists.load(Ordering::Relaxed),
        );
        counter(
            o,
            "nri_qos_kube_watch_expired_total",
            "Watches the API server ended with 410 Gone (resource version too old); each is followed by a relist.",
            k.expired.load(Ordering::Relaxed),
        );
        header(
            o,
            "nri_qos_kube_evictions_total",
            "counter",
            "Evictions through the API server, by outcome.",
        );
        for (i, outcome) in EVICTION_OUTCOMES.iter().enumerate() {
            let v = k.evictions[i].load(Ordering::Relaxed);
            let _ = writeln!(
                o,
                "nri_qos_kube_evictions_total{{outcome=\"{outcome}\"}} {v}"
            );
        }
    }

    /// One pod or container event and the path it came by.
    pub fn record_event(&self, event: &str, path: &str) {
        self.events.record(event, path);
    }

    /// How many pod, QoS and kubepods cgroups the kubelet's Memory QoS and
    /// nri-qos each own (the hierarchy keeper's decisions).
    pub fn set_protection_owners(&self, kubelet: u64, nri_qos: u64) {
        self.protection_owners[0].store(kubelet, Ordering::Relaxed);
        self.protection_owners[1].store(nri_qos, Ordering::Relaxed);
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        // Writing to a String cannot fail: every writeln! result is ignored on purpose.
        let o = &mut out;
        self.render_adjustments(o);
        self.events.render(o);
        self.render_hook_durations(o);
        self.render_pressure(o);
        self.render_evictions(o);
        self.render_throttle(o);
        self.render_runtime_connected(o);
        self.render_kube(o);
        self.render_protection(o);
        out
    }

    fn render_adjustments(&self, o: &mut String) {
        header(
            o,
            "nri_qos_adjustments_total",
            "counter",
            "Containers the policy was applied to, by QoS class and outcome.",
        );
        for (ci, class) in CLASSES.iter().enumerate() {
            for (ri, result) in RESULTS.iter().enumerate() {
                let v = self.adjustments[ci * RESULTS.len() + ri].load(Ordering::Relaxed);
                let _ = writeln!(
                    o,
                    "nri_qos_adjustments_total{{class=\"{class}\",result=\"{result}\"}} {v}"
                );
            }
        }
    }

    fn render_hook_durations(&self, o: &mut String) {
        header(
            o,
            "nri_qos_hook_duration_seconds",
            "histogram",
            "Time spent in NRI hooks (CreateContainer, UpdateContainer, Synchronize, ...).",
        );
        let mut cumulative = 0u64;
        for (i, le) in HOOK_BUCKETS.iter().enumerate() {
            cumulative += self.hook_buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                o,
                "nri_qos_hook_duration_seconds_bucket{{le=\"{le}\"}} {cumulative}"
            );
        }
        cumulative += self.hook_buckets[HOOK_BUCKETS.len()].load(Ordering::Relaxed);
        // Count is derived from the buckets so that +Inf == _count in every
        // scrape even while hooks record concurrently.
        let _ = writeln!(
            o,
            "nri_qos_hook_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let sum = self.hook_sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(o, "nri_qos_hook_duration_seconds_sum {sum}");
        let _ = writeln!(o, "nri_qos_hook_duration_seconds_count {cumulative}");
    }

    fn render_pressure(&self, o: &mut String) {
        header(
            o,
            "nri_qos_pressure",
            "gauge",
            "Node pressure stall information as last read by the monitor (percent).",
        );
        for (ri, resource) in RESOURCES.iter().enumerate() {
            for (ki, kind) in KINDS.iter().enumerate() {
                let i = ri * KINDS.len() + ki;
                if !self.pressure_set[i].load(Ordering::Relaxed) {
                    continue;
                }
                let v = f64::from_bits(self.pressure[i].load(Ordering::Relaxed));
                let _ = writeln!(
                    o,
                    "nri_qos_pressure{{resource=\"{resource}\",kind=\"{kind}\"}} {}",
                    float(v)
                );
            }
        }
    }

    fn render_evictions(&self, o: &mut String) {
        header(
            o,
            "nri_qos_evictions_total",
            "counter",
            "Pods evicted by the memory-pressure monitor, by QoS class and reason.",
        );
        for (ci, class) in CLASSES.iter().enumerate() {
            for (ri, reason) in REASONS.iter().enumerate() {
                let v = self.evictions[ci * REASONS.len() + ri].load(Ordering::Relaxed);
                let _ = writeln!(
                    o,
                    "nri_qos_evictions_total{{class=\"{class}\",reason=\"{reason}\"}} {v}"
                );
            }
        }
    }

    fn render_throttle(&self, o: &mut String) {
        header(
            o,
            "nri_qos_throttle_relaxed_total",
            "counter",
            "Containers whose memory.high the throttle guard raised to memory.max, by QoS class.",
        );
        for (ci, class) in CLASSES.iter().enumerate() {
            let v = self.throttle_relaxed[ci].load(Ordering::Relaxed);
            let _ = writeln!(o, "nri_qos_throttle_relaxed_total{{class=\"{class}\"}} {v}");
        }
        header(
            o,
            "nri_qos_throttle_evictions_total",
            "counter",
            "Pods evicted by the throttle guard, by QoS class and the signal that held.",
        );
        for (ci, class) in CLASSES.iter().enumerate() {
            for (si, signal) in SIGNALS.iter().enumerate() {
                let v = self.throttle_evictions[ci * SIGNALS.len() + si].load(Ordering::Relaxed);
                let _ = writeln!(
                    o,
                    "nri_qos_throttle_evictions_total{{class=\"{class}\",signal=\"{signal}\"}} {v}"
                );
            }
        }
        header(
            o,
            "nri_qos_throttle_containers",
            "gauge",
            "Containers under memory.high throttle (a signal above its threshold) at the last look.",
        );
        let _ = writeln!(
            o,
            "nri_qos_throttle_containers {}",
            self.throttle_under.load(Ordering::Relaxed)
        );
    }

    fn render_runtime_connected(&self, o: &mut String) {
        header(
            o,
            "nri_qos_runtime_connected",
            "gauge",
            "1 while the plugin has a registered NRI session with the runtime.",
        );
        let _ = writeln!(
            o,
            "nri_qos_runtime_connected {}",
            u8::from(self.runtime_connected.load(Ordering::Relaxed))
        );
    }

    fn render_protection(&self, o: &mut String) {
        header(
            o,
            "nri_qos_protection_cgroups",
            "gauge",
            "Pod, QoS and kubepods cgroups whose memory.min/low each owner writes (the kubelet's Memory QoS or nri-qos).",
        );
        for (i, owner) in PROTECTION_OWNERS.iter().enumerate() {
            let v = self.protection_owners[i].load(Ordering::Relaxed);
            let _ = writeln!(o, "nri_qos_protection_cgroups{{owner=\"{owner}\"}} {v}");
        }
    }
}

/// A gauge without labels: its header and its one sample.
fn gauge(o: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    header(o, name, "gauge", help);
    let _ = writeln!(o, "{name} {value}");
}

fn counter(o: &mut String, name: &str, help: &str, value: u64) {
    header(o, name, "counter", help);
    let _ = writeln!(o, "{name} {value}");
}

fn header(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

/// Prometheus spelling of special floats.
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_labels_map_to_other() {
        let m = Metrics::new();
        m.record_adjustment("burstable", "applied");
        m.record_adjustment("Weird\"class", "applied");
        m.inc_eviction("BestEffort", "cosmic-rays");
        let text = m.render();
        assert!(
            text.contains("nri_qos_adjustments_total{class=\"Burstable\",result=\"applied\"} 1")
        );
        assert!(text.contains("nri_qos_adjustments_total{class=\"other\",result=\"applied\"} 1"));
        assert!(text.contains("nri_qos_evictions_total{class=\"BestEffort\",reason=\"other\"} 1"));
        assert!(!text.contains("Weird"));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new();
        m.observe_hook(Duration::from_micros(5));
        m.observe_hook(Duration::from_micros(10));
        m.observe_hook(Duration::from_micros(300));
        m.observe_hook(Duration::from_secs(2));
        let text = m.render();
        assert!(text.contains("nri_qos_hook_duration_seconds_bucket{le=\"0.00001\"} 2"));
        assert!(text.contains("nri_qos_hook_duration_seconds_bucket{le=\"0.0005\"} 3"));
        assert!(text.contains("nri_qos_hook_duration_seconds_bucket{le=\"0.1\"} 3"));
        assert!(text.contains("nri_qos_hook_duration_seconds_bucket{le=\"+Inf\"} 4"));
        assert!(text.contains("nri_qos_hook_duration_seconds_count 4"));
        assert!(text.contains("nri_qos_hook_duration_seconds_sum 2.000315"));
    }

    #[test]
    fn pressure_appears_once_set_and_runtime_gauge_flips() {
        let m = Metrics::new();
        assert!(!m.render().contains("nri_qos_pressure{"));
        m.set_pressure("memory", "some_avg10", 12.5);
        m.set_pressure("memory", "full_avg10", f64::NAN);
        m.set_runtime_connected(true);
        let text = m.render();
        assert!(text.contains("nri_qos_pressure{resource=\"memory\",kind=\"some_avg10\"} 12.5"));
        assert!(text.contains("nri_qos_pressure{resource=\"memory\",kind=\"full_avg10\"} NaN"));
        assert!(text.contains("nri_qos_runtime_connected 1"));
        assert!(
            !text.contains("nri_qos_kube_"),
            "no API series without the API source"
        );
        m.set_kube_configured();
        m.set_kube_connected(true);
        m.inc_kube_eviction(crate::node::cluster::EvictOutcome::RefusedByPdb);
        m.set_kube_watch_lag(Duration::from_millis(1500));
        m.inc_kube_relist();
        m.inc_kube_relist();
        m.inc_kube_watch_expired();
        let text = m.render();
        assert!(text.contains("nri_qos_kube_lists_total 2"), "{text}");
        assert!(
            text.contains("nri_qos_kube_watch_expired_total 1"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE nri_qos_kube_lists_total counter"),
            "{text}"
        );
        assert!(text.contains("nri_qos_kube_connected 1"), "{text}");
        assert!(
            text.contains("nri_qos_kube_evictions_total{outcome=\"refused_pdb\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nri_qos_kube_watch_lag_seconds 1.5"),
            "{text}"
        );
        m.set_protection_owners(3, 5);
        let text = m.render();
        assert!(text.contains("nri_qos_protection_cgroups{owner=\"kubelet\"} 3"));
        assert!(text.contains("nri_qos_protection_cgroups{owner=\"nri-qos\"} 5"));
    }
}
