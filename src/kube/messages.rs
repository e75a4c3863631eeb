//! The words of the Events nri-qos posts on a pod: `Evicted`, in the
//! kubelet's phrasing where it fits, and `MemoryHighRelaxed`.

use crate::node::cluster::{EvictOutcome, EvictionNotice, EvictionReason, RelaxNotice};

/// The Event's message, in the kubelet's words where they fit.
pub fn evicted_message(n: &EvictionNotice, outcome: EvictOutcome, killed: bool) -> String {
    let usage = format!(
        "Pod was using {}, request is {} ({}).",
        mib(n.working_set),
        mib(n.request),
        n.request_source,
    );
    let mut m = match &n.reason {
        EvictionReason::NodePressure {
            available,
            signal,
            threshold,
            ..
        } => format!(
            "The node was low on resource: memory. Threshold quantity: {}, available: {} ({signal}). {usage}",
            mib(*threshold),
            mib(*available),
        ),
        EvictionReason::Throttle { signal, grace } => format!(
            "A container of the pod stayed stalled at its memory limit past the {grace} grace period (signal: {signal}), also after nri-qos raised its memory.high, or where raising it could not help. {usage}"
        ),
    };
    match (&n.reason, killed) {
        (_, false) => {}
        (EvictionReason::NodePressure { hard: true, .. }, true) => {
            m.push_str(" nri-qos killed the pod's cgroup at once (hard threshold).")
        }
        (EvictionReason::NodePressure { hard: false, .. }, true) => m.push_str(
            " nri-qos killed the pod's cgroup: the API server did not take the Eviction in time (soft threshold).",
        ),
        (EvictionReason::Throttle { .. }, true) => m.push_str(
            " nri-qos killed the pod's cgroup: the API server did not take the Eviction in time.",
        ),
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
        let reason = |hard| EvictionReason::NodePressure {
            hard,
            available: 50 << 20,
            signal: "memory.available".into(),
            threshold: 100 << 20,
        };
        let n = EvictionNotice {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "p".into(),
            reason: reason(true),
            working_set: 300 << 20,
            request: 100 << 20,
            request_source: "api-server".into(),
        };
        let m = evicted_message(&n, EvictOutcome::RefusedByPdb, true);
        assert!(m.starts_with("The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi (memory.available). Pod was using 300Mi, request is 100Mi (api-server)."), "{m}");
        assert!(m.contains("overridden"), "{m}");
        assert!(m.contains("at once (hard threshold)"), "{m}");
        let soft = EvictionNotice {
            reason: reason(false),
            ..n.clone()
        };
        let m = evicted_message(&soft, EvictOutcome::Unreachable, true);
        assert!(!m.contains("hard threshold"), "{m}");
        assert!(
            m.contains("did not take the Eviction in time (soft threshold)"),
            "{m}"
        );
    }

    #[test]
    fn the_throttle_eviction_message_names_the_signal_and_grace() {
        let n = EvictionNotice {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "p".into(),
            reason: EvictionReason::Throttle {
                signal: "psi".into(),
                grace: "10s".into(),
            },
            working_set: 240 << 20,
            request: 64 << 20,
            request_source: "api-server".into(),
        };
        let m = evicted_message(&n, EvictOutcome::Created, false);
        assert_eq!(m, "A container of the pod stayed stalled at its memory limit past the 10s grace period (signal: psi), also after nri-qos raised its memory.high, or where raising it could not help. Pod was using 240Mi, request is 64Mi (api-server).");
        assert!(!n.hard());
        let m = evicted_message(&n, EvictOutcome::Unreachable, true);
        assert!(m.ends_with("did not take the Eviction in time."), "{m}");
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
