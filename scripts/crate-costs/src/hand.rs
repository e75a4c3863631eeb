//! Baseline, shaped like src/metrics.rs: atomics, text rendered by hand.
use crate::*;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Metrics {
    adjustments: Vec<AtomicU64>,
    hook: Vec<AtomicU64>,
    hook_sum_ns: AtomicU64,
    pressure: Vec<AtomicU64>,
    evictions: Vec<AtomicU64>,
}

fn zeros(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            adjustments: zeros(20),
            hook: zeros(HOOK_BUCKETS.len() + 1),
            hook_sum_ns: AtomicU64::new(0),
            pressure: zeros(28),
            evictions: zeros(12),
        }
    }
}

impl Exposition for Metrics {
    fn touch(&self, i: u64) {
        self.adjustments[(i % 20) as usize].fetch_add(1, Ordering::Relaxed);
        let secs = (i % 50) as f64 * 0.000_01;
        let b = HOOK_BUCKETS
            .iter()
            .position(|&u| secs <= u)
            .unwrap_or(HOOK_BUCKETS.len());
        self.hook[b].fetch_add(1, Ordering::Relaxed);
        self.hook_sum_ns
            .fetch_add((secs * 1e9) as u64, Ordering::Relaxed);
        self.pressure[(i % 28) as usize].store((i as f64 * 0.5).to_bits(), Ordering::Relaxed);
        self.evictions[(i % 12) as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self) -> String {
        let mut o = String::with_capacity(8192);
        o.push_str("# HELP nri_qos_adjustments_total Adjustments.\n# TYPE nri_qos_adjustments_total counter\n");
        for (ci, c) in CLASSES.iter().enumerate() {
            for (ri, r) in RESULTS.iter().enumerate() {
                let v = self.adjustments[ci * RESULTS.len() + ri].load(Ordering::Relaxed);
                let _ = writeln!(
                    o,
                    "nri_qos_adjustments_total{{class=\"{c}\",result=\"{r}\"}} {v}"
                );
            }
        }
        o.push_str("# HELP nri_qos_hook_duration_seconds Hook time.\n# TYPE nri_qos_hook_duration_seconds histogram\n");
        let mut cum = 0;
        for (i, le) in HOOK_BUCKETS.iter().enumerate() {
            cum += self.hook[i].load(Ordering::Relaxed);
            let _ = writeln!(
                o,
                "nri_qos_hook_duration_seconds_bucket{{le=\"{le}\"}} {cum}"
            );
        }
        cum += self.hook[HOOK_BUCKETS.len()].load(Ordering::Relaxed);
        let sum = self.hook_sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(
            o,
            "nri_qos_hook_duration_seconds_bucket{{le=\"+Inf\"}} {cum}"
        );
        let _ = writeln!(
            o,
            "nri_qos_hook_duration_seconds_sum {sum}\nnri_qos_hook_duration_seconds_count {cum}"
        );
        o.push_str("# HELP nri_qos_pressure PSI.\n# TYPE nri_qos_pressure gauge\n");
        for (ri, r) in RESOURCES.iter().enumerate() {
            for (ki, k) in KINDS.iter().enumerate() {
                let v =
                    f64::from_bits(self.pressure[ri * KINDS.len() + ki].load(Ordering::Relaxed));
                let _ = writeln!(o, "nri_qos_pressure{{resource=\"{r}\",kind=\"{k}\"}} {v}");
            }
        }
        o.push_str(
            "# HELP nri_qos_evictions_total Evictions.\n# TYPE nri_qos_evictions_total counter\n",
        );
        for (ci, c) in CLASSES.iter().enumerate() {
            for (ri, r) in REASONS.iter().enumerate() {
                let v = self.evictions[ci * REASONS.len() + ri].load(Ordering::Relaxed);
                let _ = writeln!(
                    o,
                    "nri_qos_evictions_total{{class=\"{c}\",reason=\"{r}\"}} {v}"
                );
            }
        }
        o
    }
}
