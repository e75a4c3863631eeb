//! The pods under kubepods as eviction candidates: each pod cgroup with its
//! class, usage and memory request, from the registry (what the plugin and
//! the API server know) where it can, else from cgroupfs (what the kubelet
//! wrote). Usage is computed the way the kubelet / cAdvisor do.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::kill;
use super::rank::Candidate;
use super::tree::{Discovery, PodCgroup};
use crate::node::cgroupfs::{self as stat, ReadError};
use crate::node::layout::{find_kubepods, Driver};
use crate::node::registry::{PodRegistry, RequestSource};
use crate::node::QosClass;

/// Bound on pods considered per scan (bounded memory and time).
pub const MAX_PODS: usize = 4096;

/// How a pod's usage is counted, for log lines.
pub const POD_USAGE_SOURCE: &str = "pod memory.current-inactive_file";

#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{path}: no {key}")]
    Missing { path: PathBuf, key: &'static str },
}

/// Where the pods live on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodTree {
    pub cgroup_root: PathBuf,
    /// procfs, for the processes of a pod.
    pub proc_root: PathBuf,
    /// The kubepods cgroup relative to the root, or "auto".
    pub kubepods: String,
}

/// Whether a scan looks at every pod's processes (is only its sandbox
/// left?). Under pressure the kill path checks only the pods it is about
/// to pick, which is cheaper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseCheck {
    EveryPod,
    AtPick,
}

/// Lists the pods and their numbers; remembers which stray cgroups it has
/// already logged.
pub struct PodScanner {
    tree: PodTree,
    pods: Arc<dyn PodRegistry>,
    discovery: Discovery,
}

impl PodScanner {
    pub fn new(tree: PodTree, pods: Arc<dyn PodRegistry>) -> Self {
        PodScanner {
            tree,
            pods,
            discovery: Discovery::default(),
        }
    }

    pub fn tree(&self) -> &PodTree {
        &self.tree
    }

    pub fn registry(&self) -> &dyn PodRegistry {
        self.pods.as_ref()
    }

    pub fn kubepods(&self) -> Option<(PathBuf, Driver)> {
        find_kubepods(&self.tree.cgroup_root, &self.tree.kubepods)
    }

    /// The pod cgroups under kubepods, in UID order, at most [`MAX_PODS`].
    pub fn pod_cgroups(&mut self, kubepods: &Path, driver: Driver) -> Vec<PodCgroup> {
        let mut pods = self.discovery.scan(kubepods, driver);
        pods.truncate(MAX_PODS);
        pods
    }

    /// Every pod under kubepods with its numbers, in UID order.
    pub fn candidates(&mut self, pause: PauseCheck) -> Vec<Candidate> {
        let Some((kp, driver)) = self.kubepods() else {
            tracing::warn!(root = %self.tree.cgroup_root.display(), kubepods = %self.tree.kubepods, "kubepods cgroup not found");
            return Vec::new();
        };
        self.pod_cgroups(&kp, driver)
            .into_iter()
            .filter_map(|pod| self.candidate(pod, pause))
            .collect()
    }

    fn candidate(&self, pod: PodCgroup, pause: PauseCheck) -> Option<Candidate> {
        let ws = match cgroup_working_set(&pod.path) {
            Ok(ws) => ws,
            Err(e) => {
                // Usually a pod that just went away.
                tracing::debug!(pod = %pod.uid, error = %e, "skipping pod without stats");
                return None;
            }
        };
        let info = self.pods.get(&pod.uid);
        let (class, class_source) = match info.as_ref().and_then(|i| i.class) {
            Some(c) => (c, "registry"),
            None => (pod.class, "cgroup-path"),
        };
        let (request, request_source) = match info
            .as_ref()
            .and_then(|i| i.memory_request.map(|r| (r, i.request_source)))
        {
            Some(r) => r,
            None => derive_request(&pod.path, class),
        };
        Some(Candidate {
            namespace: info.as_ref().map(|i| i.namespace.clone()),
            name: info.as_ref().map(|i| i.name.clone()),
            priority: info.as_ref().and_then(|i| i.priority),
            uid: pod.uid,
            class,
            class_source,
            working_set: ws,
            request,
            request_source,
            pause_only: pause == PauseCheck::EveryPod
                && kill::pause_only(&pod.path, &self.tree.proc_root),
            static_pod: info.as_ref().is_some_and(|i| i.static_pod),
            path: pod.path,
        })
    }
}

/// Working set of one cgroup: memory.current − inactive_file.
pub fn cgroup_working_set(cg: &Path) -> Result<u64, UsageError> {
    let cur_path = cg.join("memory.current");
    let current = stat::read_single(&cur_path)?.ok_or(UsageError::Missing {
        path: cur_path,
        key: "number",
    })?;
    let st = stat::read_flat_keyed(&cg.join("memory.stat"))?;
    Ok(stat::working_set(
        current,
        st.get("inactive_file").copied().unwrap_or(0),
    ))
}

fn read_u64_or_zero(path: &Path) -> u64 {
    stat::read_single(path).ok().flatten().unwrap_or(0)
}

/// memory.min if set, else memory.low, of one cgroup.
fn min_or_low(cg: &Path) -> u64 {
    let min = read_u64_or_zero(&cg.join("memory.min"));
    if min > 0 {
        min
    } else {
        read_u64_or_zero(&cg.join("memory.low"))
    }
}

/// Memory request of a pod without plugin metadata, from what the kubelet
/// wrote into cgroupfs.
pub fn derive_request(pod: &Path, class: QosClass) -> (u64, RequestSource) {
    if class == QosClass::BestEffort {
        return (0, RequestSource::BestEffort);
    }
    let children: u64 = std::fs::read_dir(pod)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| min_or_low(&e.path()))
        .fold(0u64, |a, b| a.saturating_add(b));
    if children > 0 {
        return (children, RequestSource::CgroupChildrenMinLow);
    }
    let own = min_or_low(pod);
    if own > 0 {
        return (own, RequestSource::CgroupPodMinLow);
    }
    if class == QosClass::Guaranteed {
        if let Ok(Some(max)) = stat::read_single(&pod.join("memory.max")) {
            return (max, RequestSource::CgroupPodMax);
        }
    }
    (0, RequestSource::Unknown)
}

/// `max` events of the pod cgroup and its direct children (containers hit
/// their own memory.max there), from memory.events.local.
pub fn limit_hits(pod: &Path) -> u64 {
    let one = |cg: &Path| {
        stat::read_flat_keyed(&cg.join("memory.events.local"))
            .ok()
            .and_then(|m| m.get("max").copied())
            .unwrap_or(0)
    };
    let children: u64 = std::fs::read_dir(pod)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| one(&e.path()))
        .fold(0u64, |a, b| a.saturating_add(b));
    one(pod).saturating_add(children)
}
