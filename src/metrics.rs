//! Optional Prometheus endpoint: `GET /metrics` (text exposition format
//! 0.0.4) and `GET /healthz`, on a loopback address only.
//!
//! Metric names use the `nri_qos_` prefix: the issue's `nri-qos_` cannot be
//! used because Prometheus names must match `[a-zA-Z_:][a-zA-Z0-9_:]*` (no `-`).
//!
//! Hand-written rather than the `prometheus-client` crate: five metric
//! families with label values from fixed sets fit in fixed arrays of atomics,
//! so recording is lock-free and allocation-free in the NRI hooks, memory is
//! bounded by construction, and we avoid a dependency for ~100 lines of text
//! formatting. Unknown label values are recorded as `"other"`.
//!
//! The HTTP side is deliberately tiny: one request per connection, at most
//! [`MAX_REQUEST_BYTES`] read within [`REQUEST_TIMEOUT`], then the
//! connection is closed. At most [`MAX_CONNECTIONS`] are held at once; a
//! new one closes the oldest rather than being refused, so idle or slow
//! local clients can never starve `/healthz` (a liveness probe that fails
//! restarts the pod). Why not hyper: README, "The metrics endpoint".

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

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

/// Most bytes of a request we read (request line plus headers).
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Time a client gets to send its whole request head. Prometheus and the
/// health probe send it with the connection; this cuts idle and slow-loris
/// clients short.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Time a client gets to read our answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections held at once (an fd and a small task each, an 8 KiB buffer
/// once a request starts). At the limit the oldest is closed to make room.
pub const MAX_CONNECTIONS: usize = 256;

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("metrics address {addr} is not a loopback address")]
    NotLoopback { addr: SocketAddr },
    #[error("cannot listen on metrics address {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot accept on metrics address {addr}")]
    Accept {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("health check of {addr} failed")]
    Probe {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("health check of {addr}: unexpected answer {status:?}")]
    Unhealthy { addr: SocketAddr, status: String },
}

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
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.hook_sum_nanos.fetch_add(nanos, Ordering::Relaxed);
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
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.kube.lag_micros.store(micros, Ordering::Relaxed);
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

    /// How many pod, QoS and kubepods cgroups the kubelet's Memory QoS and
    /// nri-qos each own (the hierarchy keeper's decisions).
    pub fn set_protection_owners(&self, kubelet: u64, nri_qos: u64) {
        self.protection_owners[0].store(kubelet, Ordering::Relaxed);
        self.protection_owners[1].store(nri_qos, Ordering::Relaxed);
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        // Writing to a String cannot fail; the results are ignored on purpose.
        let o = &mut out;

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
        self.render_kube(o);

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
        out
    }
}

/// A gauge without labels: its header and its one sample.
fn gauge(o: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    header(o, name, "gauge", help);
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

/// Serves `metrics` on `addr` until the task is dropped. Refuses any
/// non-loopback address; a failing connection never stops the server.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<(), MetricsError> {
    let listener = bind(addr).await?;
    serve_on(listener, metrics).await
}

/// Binds the metrics listener (loopback only); split from [`serve_on`] so a
/// caller can learn the port of `127.0.0.1:0`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, MetricsError> {
    if !addr.ip().is_loopback() {
        return Err(MetricsError::NotLoopback { addr });
    }
    TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })
}

/// Serves on an already bound listener (see [`bind`]).
pub async fn serve_on(listener: TcpListener, metrics: Arc<Metrics>) -> Result<(), MetricsError> {
    let addr = listener.local_addr().map_err(|source| MetricsError::Bind {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        source,
    })?;
    if !addr.ip().is_loopback() {
        return Err(MetricsError::NotLoopback { addr });
    }
    info!(%addr, "metrics endpoint listening");
    // Oldest first. Only this loop touches it: no lock.
    let mut open: VecDeque<AbortHandle> = VecDeque::with_capacity(MAX_CONNECTIONS);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            // Per-connection failures (peer reset before accept, fd limits)
            // must not end the endpoint; back off briefly and go on.
            Err(e) if is_transient(&e) => {
                warn!(%addr, error = %e, "metrics accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(source) => return Err(MetricsError::Accept { addr, source }),
        };
        open.retain(|c| !c.is_finished());
        if open.len() >= MAX_CONNECTIONS {
            if let Some(oldest) = open.pop_front() {
                debug!(%peer, "too many metrics connections; closing the oldest");
                oldest.abort();
            }
        }
        let metrics = metrics.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = handle(stream, &metrics).await {
                debug!(%peer, error = %e, "metrics connection ended");
            }
        });
        open.push_back(task.abort_handle());
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Metrics,
    Health,
    NotFound,
    BadRequest,
    TooLarge,
}

/// Parses the request head (`buf` holds everything up to the blank line).
fn route(head: &[u8]) -> Route {
    let line_end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return Route::BadRequest;
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") || method.is_empty() || target.is_empty() {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or(target);
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics,
        ("GET", "/healthz") => Route::Health,
        _ => Route::NotFound,
    }
}

/// Reads the request head: up to the blank line, at most [`MAX_REQUEST_BYTES`].
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Route> {
    // An idle connection holds no buffer.
    stream.readable().await?;
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    loop {
        if len == buf.len() {
            return Ok(Route::TooLarge);
        }
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            // Peer closed before a full head: answer only if a line came.
            return Ok(if len == 0 {
                Route::BadRequest
            } else {
                route(&buf[..len])
            });
        }
        let start = len.saturating_sub(3);
        len += n;
        if buf[start..len].windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(route(&buf[..len]));
        }
    }
}

async fn handle(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let route = match tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await {
        Ok(r) => r?,
        Err(_) => Route::BadRequest,
    };
    let (status, body) = match route {
        Route::Metrics => ("200 OK", metrics.render()),
        Route::Health => ("200 OK", "ok\n".to_string()),
        Route::NotFound => ("404 Not Found", "not found\n".to_string()),
        Route::BadRequest => ("400 Bad Request", "bad request\n".to_string()),
        Route::TooLarge => (
            "431 Request Header Fields Too Large",
            "request too large\n".to_string(),
        ),
    };
    let content_type = if route == Route::Metrics {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
        Ok(r) => r?,
        Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
    }
    // Lingering close: closing with unread input makes the kernel send a
    // reset that can destroy our answer in flight (oversized requests), so
    // discard what is left, bounded in bytes and time.
    let drain = async {
        let mut sink = [0u8; 1024];
        let mut left = DRAIN_BYTES;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    Ok(())
}

/// Most unread input discarded before closing, and for how long.
const DRAIN_BYTES: usize = 64 * 1024;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Blocking health check for an `exec` liveness probe (`nri-qos health`):
/// `GET /healthz` on `addr` must answer 200 within `timeout`.
pub fn check_health(addr: SocketAddr, timeout: Duration) -> Result<(), MetricsError> {
    use std::io::{Read, Write};
    let io = |source| MetricsError::Probe { addr, source };
    let mut s = StdTcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .map_err(io)?;
    let mut answer = Vec::new();
    s.take(4096).read_to_end(&mut answer).map_err(io)?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.lines().next().unwrap_or("").to_string();
    if status.starts_with("HTTP/1.1 200 ") {
        Ok(())
    } else {
        Err(MetricsError::Unhealthy { addr, status })
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
        let text = m.render();
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

    #[test]
    fn request_lines_route() {
        let cases: &[(&[u8], Route)] = &[
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", Route::Metrics),
            (b"GET /metrics?x=1 HTTP/1.0\r\n\r\n", Route::Metrics),
            (b"GET /healthz HTTP/1.1\r\n\r\n", Route::Health),
            (b"POST /metrics HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"GET / HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"GET /metrics\r\n\r\n", Route::BadRequest),
            (b"GET /metrics HTTP/2.0\r\n\r\n", Route::BadRequest),
            (b"GET  /metrics HTTP/1.1\r\n\r\n", Route::BadRequest),
            (b"\xff\xfe\r\n\r\n", Route::BadRequest),
            (b"", Route::BadRequest),
        ];
        for (head, want) in cases {
            assert_eq!(route(head), *want, "{:?}", String::from_utf8_lossy(head));
        }
    }

    #[tokio::test]
    async fn non_loopback_address_is_refused() {
        for a in ["0.0.0.0:0", "[::]:0", "192.0.2.1:9464"] {
            let addr: SocketAddr = a.parse().unwrap();
            let err = serve(addr, Arc::new(Metrics::new())).await.unwrap_err();
            assert!(
                matches!(err, MetricsError::NotLoopback { .. }),
                "{a}: {err}"
            );
        }
    }
}
