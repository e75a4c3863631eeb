//! The workload every metrics binary shares: the same families as
//! `src/metrics.rs` (adjustments{class,result}, the hook histogram,
//! pressure{resource,kind}, evictions{class,reason}), updated before each
//! scrape, and a self-test client that scrapes N times and then prints the
//! process's VmRSS/VmHWM.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

pub const CLASSES: &[&str] = &["Guaranteed", "Burstable", "BestEffort", "other"];
pub const RESULTS: &[&str] = &["applied", "unchanged", "dry_run", "error", "other"];
pub const RESOURCES: &[&str] = &["memory", "cpu", "io", "other"];
pub const KINDS: &[&str] = &[
    "some_avg10", "some_avg60", "some_avg300", "full_avg10", "full_avg60", "full_avg300", "other",
];
pub const REASONS: &[&str] = &["hard", "soft", "other"];
pub const HOOK_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1,
];

/// Scrapes `addr` `n` times (HTTP/1.1, `Connection: close`), checks each
/// body mentions `nri_qos_`, then prints `rss_kib hwm_kib bytes_per_scrape`.
pub fn self_test(addr: SocketAddr, n: usize) {
    let mut last = 0;
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut body = Vec::new();
        s.read_to_end(&mut body).expect("read");
        assert!(body.windows(8).any(|w| w == b"nri_qos_"), "no metrics in reply");
        last = body.len();
        if std::env::var_os("CRATE_COSTS_DUMP").is_some() && last > 0 {
            let text = String::from_utf8_lossy(&body);
            eprint!("{}", text.split("\r\n\r\n").nth(1).unwrap_or(""));
            std::process::exit(0);
        }
    }
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().trim_end_matches(" kB").to_string())
            .unwrap_or_default()
    };
    println!("{} {} {}", field("VmRSS:"), field("VmHWM:"), last);
}

/// Scrape count from the command line (default 1,000).
pub fn scrapes() -> usize {
    std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1000)
}

pub mod hand;
/// The one ground-floor type src/qos/pod.rs names (`crate::node::QosClass`).
pub mod node {
    #[derive(
        Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
    )]
    pub enum QosClass {
        Guaranteed,
        Burstable,
        BestEffort,
    }
}

/// Our src/qos/quantity.rs and src/qos/pod.rs, copied in by the script.
#[allow(dead_code)]
pub mod qos {
    pub mod pod;
    pub mod quantity;
}
pub mod prom;
pub mod serve;

/// Nanoseconds per `touch` (one adjustment counter, one hook-histogram
/// observation, one gauge set, one eviction counter), best of 5 x 200,000.
pub fn touch_ns<E: Exposition>(m: &E) -> f64 {
    (0..5)
        .map(|_| {
            let start = std::time::Instant::now();
            for i in 0..200_000u64 {
                m.touch(std::hint::black_box(i));
            }
            start.elapsed().as_nanos() as f64 / 200_000.0
        })
        .fold(f64::MAX, f64::min)
}

/// One way of keeping and rendering the metrics.
pub trait Exposition: Send + Sync + 'static {
    /// Records one hook, adjustment, pressure sample and eviction.
    fn touch(&self, i: u64);
    /// The Prometheus text exposition.
    fn render(&self) -> String;
}
