//! The words of the Events nri-qos posts on a pod: `Evicted`, in the
//! kubelet's phrasing where it fits, and `MemoryHighRelaxed`.

use crate::node::cluster::{EvictOutcome, EvictionNotice, RelaxNotice};

/// The Event's message, in the kubelet's words where they fit.
pub fn evicted_message(n: &EvictionNotice, outcome: EvictOutcome, killed: bool) -> String {
    let mut m = format!(
        "The node was low on resource: memory. Threshold quantity: {}, available: {} ({}). Pod was using {}, request is {} ({}).",
        mib(n.threshold),
        mib(n.available),
        n.signal,
        mib(n.working_set),
        mib(n.request),
        n.request_source,
    );
    if killed && n.hard {
        m.push_str(" nri-qos killed the pod's cgroup at once (hard threshold).");
    } else if killed {
        m.push_str(" nri-qos killed the pod's cgroup: the API server did not take the Eviction in time (soft threshold).");
    }
    if outcome == EvictOutcome::RefusedByPdb {
        m.push_str(" Its PodDisruptionBudget was overridden.");
    }
    m
}

/// The `MemoryHighRelaxed` Event's message.
pub fn relaxed_message(n: &RelaxNotice) -> String {
    let high = |v: &str| v.parse().map(mib).unwrap_or_else(|_| v.to_string());
    format!(
        "nri-qos raised memory.high of container {} from {} to {}: it stayed throttled there past the {} grace period ({:.0} high events/s, memory pressure some avg10 {:.0}%). If the stall persists, the pod is evicted.",
        n.container_id,
        high(&n.from),
        high(&n.to),
        n.grace,
        n.high_rate,
        n.psi_some_avg10,
    )
}

fn mib(b: u64) -> String {
    format!("{}Mi", b >> 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_message_names_signal_usage_and_request() {
        let n = EvictionNotice {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "p".into(),
            hard: true,
            available: 50 << 20,
            signal: "memory.available".into(),
            threshold: 100 << 20,
            working_set: 300 << 20,
            request: 100 << 20,
            request_source: "api-server".into(),
        };
        let m = evicted_message(&n, EvictOutcome::RefusedByPdb, true);
        assert!(m.starts_with("The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi (memory.available). Pod was using 300Mi, request is 100Mi (api-server)."), "{m}");
        assert!(m.contains("overridden"), "{m}");
        assert!(m.contains("at once (hard threshold)"), "{m}");
        let soft = EvictionNotice { hard: false, ..n };
        let m = evicted_message(&soft, EvictOutcome::Unreachable, true);
        assert!(!m.contains("hard threshold"), "{m}");
        assert!(
            m.contains("did not take the Eviction in time (soft threshold)"),
            "{m}"
        );
    }

    #[test]
    fn the_relax_message_names_the_container_values_and_signals() {
        let n = RelaxNotice {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "p".into(),
            container_id: "abc123".into(),
            from: "247463936".into(),
            to: "max".into(),
            high_rate: 1234.4,
            psi_some_avg10: 36.2,
            grace: "10s".into(),
        };
        assert_eq!(
            relaxed_message(&n),
            "nri-qos raised memory.high of container abc123 from 236Mi to max: it stayed throttled there past the 10s grace period (1234 high events/s, memory pressure some avg10 36%). If the stall persists, the pod is evicted."
        );
    }
}
