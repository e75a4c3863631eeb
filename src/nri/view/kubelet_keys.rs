//! The kubelet's Memory QoS keys read from a container's cgroup, where the
//! runtime hides the CRI's `unified` map from plugins (NRI before v0.10:
//! containerd 1.7 and 2.1) or a report cannot tell whose its keys are.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::{decide, Rules, Source};
use crate::node::cgroup_files::{MEMORY_HIGH, MEMORY_LOW, MEMORY_MIN};
use crate::node::cgroupfs;
use crate::node::layout::{container_cgroup_dir, pod_class};
use crate::node::registry::ContainerRequests;
use crate::node::runtime::RuntimeQuirks;
use crate::nri::convert;
use crate::nri::proto::api;
use crate::qos::{self, QosClass};

/// The protection keys the kubelet's Memory QoS sets on a container.
const KUBELET_KEYS: [&str; 3] = [MEMORY_MIN, MEMORY_LOW, MEMORY_HIGH];

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
/// applied last (not after a restart of a runtime that forgets resizes);
/// where such a report shows the CRI's whole `unified` map
/// ([`qos::ContainerFacts::unified_shown`]), nothing is hidden and no key
/// is read.
pub fn known_keys(
    kubelet_class: Option<QosClass>,
    facts: &qos::ContainerFacts,
    decision: &qos::Decision,
    report_current: bool,
) -> [u64; 3] {
    if report_current && facts.unified_shown {
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
pub fn only_the_kubelets(kubelet_class: Option<QosClass>, mut known: [u64; 3]) -> [u64; 3] {
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
    quirks: &RuntimeQuirks,
    (node, policy): Rules<'_>,
    cgroup_root: &Path,
    api_pods: Option<&dyn ContainerRequests>,
) -> HashSet<String> {
    let mut out = HashSet::new();
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
        let rules = (node, policy);
        let (facts, d) = decide(&pod_facts, c, Source::Reported, quirks, rules, api_pods);
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
