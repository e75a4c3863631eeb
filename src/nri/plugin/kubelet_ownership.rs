//! The kubelet's Memory QoS read from a started container's cgroup, where
//! the runtime hides the CRI's `unified` map from plugins (NRI before
//! v0.10: containerd 1.7 and 2.1) and the kubelet did not protect the pod
//! cgroup before its sandbox. The rules are `nri::view`'s, which
//! `nri-qos audit` applies too.

use std::path::Path;

use tracing::info;

use super::api;
use super::QosPlugin;
use crate::node::cgroupfs::Owner;
use crate::node::layout::{container_cgroup_dir_in, pod_cgroups, pod_class};
use crate::node::lock;
use crate::node::registry::Registry;
use crate::nri::view::{hidden_kubelet_key, only_the_kubelets};
use crate::qos::{self, PolicyConfig};

impl QosPlugin {
    /// PostStartContainer: a started container whose cgroup holds a
    /// protection key we neither set nor saw (memory.min on a Burstable
    /// container, where we set memory.low) tells that the kubelet's Memory
    /// QoS manages its pod; only the keys the kubelet may set on the pod's
    /// class count ([`crate::nri::view::kubelet_may_set`]). A few small reads, once per
    /// container until its pod is decided.
    pub(super) fn learn_owner_after_start(&self, container: &api::Container) {
        // A runtime that shows the CRI's `unified` map (NRI v0.10 on) showed
        // the kubelet's keys at creation: nothing is hidden to read.
        if !self.owners_from_tree(&self.live().policy) || self.quirks().shows_unified {
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
