//! Feeds the pressure monitor with what the runtime told the plugin: pod
//! names, classes and recovered memory requests, which cgroupfs alone does
//! not have.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::plugin::Registry;
use crate::pressure::{PodInfo, RequestSource as MonitorSource, SharedRegistry};
use crate::qos::RequestSource;

fn monitor_source(s: RequestSource) -> MonitorSource {
    match s {
        RequestSource::UnifiedMemoryMin | RequestSource::UnifiedMemoryLow => {
            MonitorSource::UnifiedMemoryQos
        }
        RequestSource::Annotation => MonitorSource::PodSpec,
        RequestSource::ApiServer => MonitorSource::ApiServer,
        RequestSource::GuaranteedLimit => MonitorSource::CgroupPodMax,
        RequestSource::OomScoreAdj => MonitorSource::OomScoreAdj,
        RequestSource::BestEffort => MonitorSource::BestEffort,
        RequestSource::Unknown => MonitorSource::Unknown,
    }
}

/// The monitor's view of every pod in the plugin's registry.
pub fn pod_infos(reg: &Registry) -> Vec<PodInfo> {
    let mut by_pod: HashMap<&str, Vec<&super::plugin::ContainerRecord>> = HashMap::new();
    for c in reg.containers.values() {
        by_pod.entry(c.pod_id.as_str()).or_default().push(c);
    }
    reg.pods
        .values()
        .filter(|p| !p.facts.uid.is_empty())
        .map(|p| {
            let ctrs = by_pod.get(p.id.as_str()).cloned().unwrap_or_default();
            let known: Vec<u64> = ctrs.iter().filter_map(|c| c.memory_request).collect();
            let source = ctrs
                .iter()
                .map(|c| c.request_source)
                .find(|s| *s != RequestSource::Unknown)
                .unwrap_or(RequestSource::Unknown);
            PodInfo {
                uid: p.facts.uid.clone(),
                namespace: p.facts.namespace.clone(),
                name: p.facts.name.clone(),
                priority: None,
                // Saturating: the runtime's numbers are not ours to trust, and
                // a wrapped sum would rank a huge pod as a tiny one.
                memory_request: (!known.is_empty())
                    .then(|| known.iter().fold(0u64, |a, b| a.saturating_add(*b))),
                request_source: monitor_source(source),
                class: ctrs.first().map(|c| c.class),
                static_pod: false,
            }
        })
        .collect()
}

/// Keeps `pods` in step with the plugin's registry until the plugin goes.
pub async fn feed_monitor(
    registry: Arc<Mutex<Registry>>,
    mut changes: watch::Receiver<u64>,
    pods: Arc<SharedRegistry>,
) {
    let mut known: Vec<String> = Vec::new();
    loop {
        let infos = {
            let reg = registry.lock().unwrap_or_else(|e| e.into_inner());
            pod_infos(&reg)
        };
        let now: Vec<String> = infos.iter().map(|i| i.uid.clone()).collect();
        for gone in known.iter().filter(|u| !now.contains(u)) {
            pods.remove(gone);
        }
        for info in infos {
            pods.upsert(info);
        }
        known = now;
        if changes.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nri::plugin::{ContainerRecord, PodRecord};
    use crate::pressure::rank::{rank, Candidate, RankPolicy};
    use crate::qos::{PodFacts, QosClass};
    use proptest::prelude::*;

    fn registry(pods: &[Vec<u64>]) -> Registry {
        let mut reg = Registry::default();
        for (p, requests) in pods.iter().enumerate() {
            let id = format!("pod{p}");
            reg.pods.insert(
                id.clone(),
                PodRecord {
                    id: id.clone(),
                    facts: PodFacts {
                        uid: format!("uid-{p:04}"),
                        name: id.clone(),
                        ..Default::default()
                    },
                },
            );
            for (i, r) in requests.iter().enumerate() {
                let cid = format!("{id}-c{i}");
                reg.containers.insert(
                    cid.clone(),
                    ContainerRecord {
                        id: cid,
                        pod_id: id.clone(),
                        name: format!("c{i}"),
                        class: QosClass::Burstable,
                        memory_request: Some(*r),
                        request_source: RequestSource::Annotation,
                        memory_min: 0,
                        memory_low: *r,
                        oom_score_adj: None,
                        cgroups_path: String::new(),
                        kubelet_memory_qos: false,
                    },
                );
            }
        }
        reg
    }

    #[test]
    fn two_huge_requests_do_not_wrap_to_zero() {
        let infos = pod_infos(&registry(&[vec![1 << 63, 1 << 63]]));
        assert_eq!(infos[0].memory_request, Some(u64::MAX));
    }

    proptest! {
        /// Pods alike in all but their containers' requests (any u64, huge
        /// ones included) rank by their true request: a larger one is never
        /// ahead of a smaller one because its sum overflowed.
        #[test]
        fn ranking_never_favours_a_wrapped_request(
            pods in prop::collection::vec(
                prop::collection::vec(prop_oneof![any::<u64>(), (u64::MAX - 8)..=u64::MAX, 0u64..(1 << 40)], 1..4),
                2..8,
            ),
            working_set in any::<u64>(),
        ) {
            let infos = pod_infos(&registry(&pods));
            let true_sum = |uid: &str| -> u128 {
                let p: usize = uid.trim_start_matches("uid-").parse().unwrap();
                pods[p].iter().map(|r| *r as u128).sum()
            };
            for i in &infos {
                let want = true_sum(&i.uid).min(u64::MAX as u128) as u64;
                prop_assert_eq!(i.memory_request, Some(want));
            }
            let cands: Vec<Candidate> = infos
                .iter()
                .map(|i| Candidate {
                    uid: i.uid.clone(),
                    namespace: Some(i.namespace.clone()),
                    name: Some(i.name.clone()),
                    class: QosClass::Burstable,
                    class_source: "registry",
                    working_set,
                    request: i.memory_request.unwrap(),
                    request_source: i.request_source,
                    priority: i.priority,
                    pause_only: false,
                    static_pod: false,
                    path: Default::default(),
                })
                .collect();
            let policy = RankPolicy {
                critical_namespaces: vec![],
                critical_priority: i32::MAX,
                require_pod_info: false,
            };
            let order = rank(&cands, &policy).order;
            for w in order.windows(2) {
                let (ahead, behind) = (&cands[w[0]], &cands[w[1]]);
                prop_assert!(
                    true_sum(&ahead.uid) <= true_sum(&behind.uid)
                        || ahead.request == behind.request,
                    "{} ranked ahead of {}", ahead.brief(), behind.brief()
                );
            }
        }
    }
}
