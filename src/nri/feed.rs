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
                memory_request: (!known.is_empty()).then(|| known.iter().sum()),
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
