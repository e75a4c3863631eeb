//! `nri_qos_events_total{event,path}`: the NRI pod and container events and
//! the path each came by, its own RPC (NRI v0.12) or StateChange.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{counters, header, index, OTHER};

/// NRI events (`event`; `nri::plugin` names them from the NRI event enum).
pub const EVENTS: &[&str] = &[
    "run_pod_sandbox",
    "stop_pod_sandbox",
    "remove_pod_sandbox",
    "create_container",
    "post_create_container",
    "start_container",
    "post_start_container",
    "update_container",
    "post_update_container",
    "stop_container",
    "remove_container",
    "update_pod_sandbox",
    "post_update_pod_sandbox",
    OTHER,
];
/// How an event reached the plugin (`path`): its own RPC, or StateChange.
pub const EVENT_PATHS: &[&str] = &["dedicated", "state_change", OTHER];

/// One counter per event and path.
pub(super) struct EventCounters(Box<[AtomicU64]>);

impl Default for EventCounters {
    fn default() -> Self {
        EventCounters(counters(EVENTS.len() * EVENT_PATHS.len()))
    }
}

impl EventCounters {
    pub(super) fn record(&self, event: &str, path: &str) {
        let i = index(EVENTS, event) * EVENT_PATHS.len() + index(EVENT_PATHS, path);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The family; only the series that counted something.
    pub(super) fn render(&self, o: &mut String) {
        header(
            o,
            "nri_qos_events_total",
            "counter",
            "NRI pod and container events, by event and by the path the runtime used: its own RPC (NRI v0.12) or StateChange.",
        );
        for (ei, event) in EVENTS.iter().enumerate() {
            for (pi, path) in EVENT_PATHS.iter().enumerate() {
                let v = self.0[ei * EVENT_PATHS.len() + pi].load(Ordering::Relaxed);
                if v > 0 {
                    let _ = writeln!(
                        o,
                        "nri_qos_events_total{{event=\"{event}\",path=\"{path}\"}} {v}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_counted_by_path_and_unknown_labels_go_to_other() {
        let c = EventCounters::default();
        c.record("run_pod_sandbox", "dedicated");
        c.record("run_pod_sandbox", "dedicated");
        c.record("remove_container", "state_change");
        c.record("something_new", "carrier_pigeon");
        let mut out = String::new();
        c.render(&mut out);
        assert!(out.contains("# TYPE nri_qos_events_total counter"), "{out}");
        for line in [
            "nri_qos_events_total{event=\"run_pod_sandbox\",path=\"dedicated\"} 2",
            "nri_qos_events_total{event=\"remove_container\",path=\"state_change\"} 1",
            "nri_qos_events_total{event=\"other\",path=\"other\"} 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line}\n{out}");
        }
        assert_eq!(out.lines().filter(|l| !l.starts_with('#')).count(), 3);
    }
}
