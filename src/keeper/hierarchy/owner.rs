//! Who owns a cgroup's memory protection: the kubelet's Memory QoS or
//! nri-qos, decided once per cgroup and never handed back.

use std::path::Path;

use tracing::info;

use super::Keeper;
use crate::keeper::plan;
use crate::node::cgroupfs::{exceeds, Owner, Protection};
use crate::qos::KubeletMemoryQos;

impl Keeper {
    /// Decides (or confirms) who owns `cg`. `kubelet_signal`: the runtime's
    /// view says the kubelet protects it; `tree_check`: whether a value on
    /// disk above anything we would write counts before we ever wrote there.
    pub(super) fn decide_owner(
        &mut self,
        cg: &Path,
        kubelet_signal: bool,
        current: Protection,
        targets: &[Protection],
        tree_check: bool,
    ) -> Owner {
        let before = self.owners.get(cg).copied();
        if before == Some(Owner::Kubelet) {
            return Owner::Kubelet;
        }
        let ours = self.ours.get(cg).copied();
        let kubelet = match self.kubelet_memory_qos {
            KubeletMemoryQos::Alpha | KubeletMemoryQos::Tiered => true,
            KubeletMemoryQos::None => false,
            KubeletMemoryQos::Auto => {
                kubelet_signal
                    || match ours {
                        Some(_) => plan::foreign(current, ours, targets),
                        None => {
                            tree_check
                                && exceeds(
                                    current,
                                    targets.iter().copied().fold(Protection::default(), |a, t| {
                                        Protection {
                                            min: a.min.max(t.min),
                                            low: a.low.max(t.low),
                                        }
                                    }),
                                )
                        }
                    }
            }
        };
        let owner = if kubelet {
            Owner::Kubelet
        } else {
            Owner::NriQos
        };
        if before != Some(owner) {
            info!(
                cgroup = %cg.display(),
                owner = owner.label(),
                memory_min = current.min,
                memory_low = current.low,
                "memory protection owner decided{}",
                if kubelet { ": the kubelet's Memory QoS writes it, nri-qos never will" } else { "" }
            );
            self.owners.insert(cg.to_path_buf(), owner);
        }
        if owner == Owner::NriQos && ours.is_none() {
            // What is there now is ours to change; a later change by anyone else is not.
            self.ours.insert(cg.to_path_buf(), current);
        }
        owner
    }
}
