//! The kubelet's Memory QoS read from a started container's cgroup, where
//! the runtime hides the CRI's `unified` map from plugins (NRI before
//! v0.10: containerd 1.7 and 2.1) and the kubelet did not protect the pod
//! cgroup before its sandbox.

use std::path::Path;

use super::*;
use crate::node::layout::{container_cgroup_dir_in, pod_class};

/// The protection keys the kubelet's Memory QoS sets on a container.
const KUBELET_KEYS: [&str; 3] = ["memory.min", "memory.low", "memory.high"];

/// The first of memory.min / memory.low / memory.high that the container
/// cgroup at `dir` holds although nri-qos did not ask for it and the
/// runtime request did not carry it (`known`, in that order: the bytes
/// asked or carried, 0 for neither; [`NOT_THE_KUBELETS`] for a key the
/// kubelet never sets there), with its value. Nothing but the
/// kubelet's Memory QoS sets these on a container, through keys the
/// runtime hid from us. Only the keys not known are read; 0, `max` and an
/// unreadable file are the kernel's defaults, not a signal.
pub fn hidden_kubelet_key(dir: &Path, known: [u64; 3]) -> Option<(&'static str, u64)> {
    // One path for the whole container: the file name is swapped.
    let mut path = dir.join(KUBELET_KEYS[0]);
    KUBELET_KEYS
        .into_iter()
        .zip(known)
        .filter(|(_, k)| *k == 0)
        .find_map(|(key, _)| {
            path.set_file_name(key);
            let value = cgroupfs::read_single(&path).ok().flatten()?;
            (value > 0).then_some((key, value))
        })
}

/// In [`hidden_kubelet_key`]'s `known`: a key the kubelet's Memory QoS
/// never sets on the container, so its file is not read.
pub const NOT_THE_KUBELETS: u64 = u64::MAX;

/// Which of [`KUBELET_KEYS`] the kubelet's Memory QoS may set on a
/// container of a pod it placed in `class`, in any version (1.22 alpha,
/// 1.27-1.35 alpha, 1.36+ TieredReservation, the 1.37 BestEffort
/// memory.high fix; `explain/kubelet.rs` simulates them): memory.min needs
/// a memory request, which BestEffort has not; memory.low is Burstable's
/// only (TieredReservation); memory.high is never set where request equals
/// limit, as on every Guaranteed container. A Synchronize skips the other
/// files: the kubelet cannot have hidden a key there.
pub fn kubelet_may_set(class: QosClass) -> [bool; 3] {
    match class {
        QosClass::Guaranteed => [true, false, false],
        QosClass::Burstable => [true, true, true],
        QosClass::BestEffort => [false, false, true],
    }
}

/// What nri-qos asked for or the runtime carried, per [`KUBELET_KEYS`]
/// (as the registry keeps it; no copy of the resources, a Synchronize
/// asks this for every running container), and [`NOT_THE_KUBELETS`] for
/// a key the kubelet never sets on a container of a pod it placed in
/// `kubelet_class` (`None`: not the kubelet's layout, every key counts).
/// `report_current`: the runtime's report of the container holds what it
/// applied last (not CRI-O's after a restart, see `forgets_resizes`);
/// where such a report shows the CRI's `unified` map
/// ([`qos::policy::runtime_shows_unified`]: NRI v0.10 on, containerd 2.2
/// and later), nothing is hidden and no key is read.
pub(super) fn known_keys(
    kubelet_class: Option<QosClass>,
    facts: &qos::ContainerFacts,
    decision: &qos::Decision,
    report_current: bool,
) -> [u64; 3] {
    if report_current && qos::policy::runtime_shows_unified(&facts.resources) {
        return [NOT_THE_KUBELETS; 3];
    }
    let known = KUBELET_KEYS.map(|k| {
        qos::policy::effective_unified(&facts.resources, &decision.adjustment, k)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    });
    only_the_kubelets(kubelet_class, known)
}

/// `known` with [`NOT_THE_KUBELETS`] for the keys the kubelet never sets on
/// a container of a pod it placed in `kubelet_class` (`None`: not the
/// kubelet's layout, every key counts).
fn only_the_kubelets(kubelet_class: Option<QosClass>, mut known: [u64; 3]) -> [u64; 3] {
    let may_set = kubelet_class.map_or([true; 3], kubelet_may_set);
    for (k, may) in known.iter_mut().zip(may_set) {
        if !may {
            *k = NOT_THE_KUBELETS;
        }
    }
    known
}

/// The pods (sandbox ids) with a running container whose cgroup holds a
/// key nri-qos would not set ([`hidden_kubelet_key`]): the plugin's rule
/// for `nri-qos audit`, which has the runtime's view and the tree only.
/// Empty unless `[policy] kubelet-memory-qos` is `auto` on cgroup v2.
pub fn pods_with_hidden_kubelet_keys(
    containers: &[api::Container],
    pods: &HashMap<&str, &api::PodSandbox>,
    (node, policy): (&NodeFacts, &PolicyConfig),
    cgroup_root: &Path,
    api_pods: Option<&dyn ContainerRequests>,
) -> std::collections::HashSet<String> {
    let mut out = std::collections::HashSet::new();
    if policy.kubelet_memory_qos != qos::KubeletMemoryQos::Auto || !node.cgroup_v2 {
        return out;
    }
    for c in containers {
        let running = c.state.enum_value() == Ok(api::ContainerState::CONTAINER_RUNNING);
        let Some(pod) = pods.get(c.pod_sandbox_id.as_str()).filter(|_| running) else {
            continue;
        };
        let path = c.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
        let Some(rel) = container_cgroup_dir(path).filter(|_| !out.contains(&pod.id)) else {
            continue;
        };
        let pod_facts = convert::pod_from_wire(pod);
        let (facts, d) = decide_wire(&pod_facts, c, None, (node, policy), api_pods);
        let class = pod_class(&pod_facts.cgroup_parent);
        // The audit does not ask which runtime reported: it reads every
        // container as if the report could be stale.
        let known = known_keys(class, &facts, &d, false);
        if hidden_kubelet_key(&cgroup_root.join(rel), known).is_some() {
            out.insert(pod.id.clone());
        }
    }
    out
}

impl QosPlugin {
    /// PostStartContainer: a started container whose cgroup holds a
    /// protection key we neither set nor saw (memory.min on a Burstable
    /// container, where we set memory.low) tells that the kubelet's Memory
    /// QoS manages its pod; only the keys the kubelet may set on the pod's
    /// class count ([`kubelet_may_set`]). A few small reads, once per
    /// container until its pod is decided.
    pub(super) fn learn_owner_after_start(&self, container: &api::Container) {
        if !self.owners_from_tree(&self.live().policy) {
            return;
        }
        let (pod_id, parent, path, known) = {
            let reg = lock(&self.registry);
            let Some(c) = reg.containers.get(&container.id) else {
                return;
            };
            // Keys the runtime showed already made the pod the kubelet's.
            if c.kubelet_memory_qos {
                return;
            }
            let Some(pod) = reg.pods.get(&*c.pod_id) else {
                return;
            };
            let known = [c.memory_min, c.memory_low, c.memory_high];
            (
                c.pod_id.to_string(),
                pod.cgroup_parent.to_string(),
                c.cgroups_path.to_string(),
                only_the_kubelets(pod_class(&pod.cgroup_parent), known),
            )
        };
        if self.kubelet_keys_in_started(&pod_id, &parent, &path, known) {
            self.notify_changed();
        }
    }

    /// Where the plugin may learn owners from the tree: the setting leaves
    /// it to us (`auto`) and the node has cgroup v2.
    pub(super) fn owners_from_tree(&self, policy: &PolicyConfig) -> bool {
        policy.kubelet_memory_qos == qos::KubeletMemoryQos::Auto && self.settings.node.cgroup_v2
    }

    /// Records the pod cgroup under `parent` as the kubelet's when the
    /// started container at `cgroups_path` holds a key it sets that nri-qos
    /// did not (`known`, see [`hidden_kubelet_key`]); true when it did now.
    /// Said once per pod cgroup; its containers are marked as with the
    /// kubelet's Memory QoS, so the keeper stays off the pod.
    pub(super) fn kubelet_keys_in_started(
        &self,
        pod_id: &str,
        parent: &str,
        cgroups_path: &str,
        known: [u64; 3],
    ) -> bool {
        match pod_cgroups(parent) {
            Some(cg) => self.kubelet_keys_in_started_below(pod_id, &cg.pod, cgroups_path, known),
            None => false,
        }
    }

    /// [`Self::kubelet_keys_in_started`] for the pod cgroup `pod_cg`, known
    /// already (a Synchronize asks for every running container of a pod).
    pub(super) fn kubelet_keys_in_started_below(
        &self,
        pod_id: &str,
        pod_cg: &Path,
        cgroups_path: &str,
        known: [u64; 3],
    ) -> bool {
        // No key left to read (ours, carried, or never the kubelet's on
        // this class): no path to build either.
        if !known.contains(&0) {
            return false;
        }
        let Some(dir) = container_cgroup_dir_in(&self.settings.cgroup_root, cgroups_path) else {
            return false;
        };
        // The keeper hands back its decisions: nri-qos may still give way.
        let decided = |reg: &Registry| reg.owners.get(pod_cg) == Some(&Owner::Kubelet);
        if decided(&lock(&self.registry)) {
            return false;
        }
        let Some((key, value)) = hidden_kubelet_key(&dir, known) else {
            return false;
        };
        let mut reg = lock(&self.registry);
        if decided(&reg) {
            return false;
        }
        info!(
            cgroup = %pod_cg.display(),
            container_cgroup = %dir.display(),
            key,
            value,
            owner = Owner::Kubelet.label(),
            "a started container holds a memory key nri-qos did not set: the kubelet's Memory QoS owns its pod's protection; later containers' memory.min/low/high left to it"
        );
        reg.owners.insert(pod_cg.to_path_buf(), Owner::Kubelet);
        for c in reg.containers.values_mut().filter(|c| &*c.pod_id == pod_id) {
            c.kubelet_memory_qos = true;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_key_neither_asked_nor_carried_and_set_in_the_kernel_counts() {
        let d = tempfile::tempdir().unwrap();
        let write = |f: &str, v: &str| std::fs::write(d.path().join(f), v).unwrap();
        // Nothing there (a container cgroup gone): no signal.
        assert_eq!(hidden_kubelet_key(d.path(), [0, 0, 0]), None);
        write("memory.min", "0\n");
        write("memory.low", "66387968\n");
        write("memory.high", "max\n");
        // Our memory.low, the kernel's defaults elsewhere.
        assert_eq!(hidden_kubelet_key(d.path(), [0, 66387968, 0]), None);
        // The kubelet's alpha memory.min on a Burstable container.
        write("memory.min", "268435456\n");
        assert_eq!(
            hidden_kubelet_key(d.path(), [0, 66387968, 509943808]),
            Some(("memory.min", 268435456))
        );
        // A key we asked for holds our value (or the kubelet's over it).
        assert_eq!(hidden_kubelet_key(d.path(), [268435456, 1, 1]), None);
        // memory.high where we set none (Guaranteed, or memory-high off).
        write("memory.high", "510025728\n");
        assert_eq!(
            hidden_kubelet_key(d.path(), [268435456, 66387968, 0]),
            Some(("memory.high", 510025728))
        );
        // Junk is no signal either.
        write("memory.high", "lots\n");
        assert_eq!(hidden_kubelet_key(d.path(), [268435456, 66387968, 0]), None);
    }
}
