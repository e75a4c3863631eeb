//! The snapshot the hooks and the monitor read: pod facts by UID, replaced
//! whole on every (re)list and updated per watch event. Readers take a read
//! lock for a map lookup; nothing here waits for the API server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::facts::ApiPodFacts;
use crate::node::registry::{ContainerRequests, PodInfo, PodRegistry};

#[derive(Debug, Default)]
pub struct PodStore {
    pods: RwLock<HashMap<String, Arc<ApiPodFacts>>>,
    /// A list completed and the watch has not failed since.
    connected: AtomicBool,
    /// Pods listed or watched since the start (for tests and logs).
    events: AtomicU64,
}

impl PodStore {
    /// A pod by the UID the runtime knows ([`ApiPodFacts::runtime_uid`]).
    pub fn get(&self, uid: &str) -> Option<Arc<ApiPodFacts>> {
        self.pods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.pods.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every pod, in no particular order.
    pub fn all(&self) -> Vec<Arc<ApiPodFacts>> {
        self.pods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub fn upsert(&self, facts: ApiPodFacts) {
        self.events.fetch_add(1, Ordering::Relaxed);
        let mut m = self.pods.write().unwrap_or_else(|e| e.into_inner());
        m.insert(facts.runtime_uid.clone(), Arc::new(facts));
    }

    /// Forgets a pod by its [`ApiPodFacts::runtime_uid`].
    pub fn remove(&self, uid: &str) {
        self.events.fetch_add(1, Ordering::Relaxed);
        let mut m = self.pods.write().unwrap_or_else(|e| e.into_inner());
        m.remove(uid);
    }

    /// A relist: the pods gone while the watch was down go too.
    pub fn replace(&self, pods: Vec<ApiPodFacts>) {
        let map: HashMap<_, _> = pods
            .into_iter()
            .map(|p| (p.runtime_uid.clone(), Arc::new(p)))
            .collect();
        self.events.fetch_add(map.len() as u64, Ordering::Relaxed);
        *self.pods.write().unwrap_or_else(|e| e.into_inner()) = map;
    }

    pub fn set_connected(&self, up: bool) {
        self.connected.store(up, Ordering::Relaxed);
    }

    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Waits at most `limit` for a list to complete; true when one did.
    pub async fn first_list(&self, limit: Duration) -> bool {
        let until = tokio::time::Instant::now() + limit;
        while !self.connected() {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }

    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }
}

impl ContainerRequests for PodStore {
    fn container_request(&self, pod_uid: &str, container: &str) -> Option<u64> {
        PodStore::get(self, pod_uid)?.container_request(container)
    }
}

impl PodRegistry for PodStore {
    fn get(&self, uid: &str) -> Option<PodInfo> {
        PodStore::get(self, uid).map(|p| p.pod_info())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::QosClass;

    fn pod(uid: &str) -> ApiPodFacts {
        ApiPodFacts {
            runtime_uid: uid.into(),
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            priority: None,
            static_pod: false,
            class: QosClass::BestEffort,
            memory_request: 0,
            containers: Vec::new(),
        }
    }

    #[test]
    fn a_relist_drops_what_went_away() {
        let s = PodStore::default();
        s.upsert(pod("a"));
        s.upsert(pod("b"));
        s.replace(vec![pod("b"), pod("c")]);
        assert!(s.get("a").is_none() && s.get("b").is_some() && s.get("c").is_some());
        s.remove("b");
        assert_eq!(s.len(), 1);
        assert_eq!(PodRegistry::get(&s, "c").unwrap().name, "c");
    }

    #[tokio::test]
    async fn the_first_list_is_awaited_within_its_limit() {
        let s = Arc::new(PodStore::default());
        assert!(!s.first_list(Duration::from_millis(120)).await);
        let listed = Arc::clone(&s);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            listed.set_connected(true);
        });
        let started = std::time::Instant::now();
        assert!(s.first_list(Duration::from_secs(5)).await);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
