//! Who owns a cgroup's memory protection: the kubelet's Memory QoS or
//! nri-qos, decided once per cgroup and never handed back.

use std::path::Path;

use tracing::info;

use super::Keeper;
use crate::keeper::plan;
use crate::node::cgroupfs::{exceeds, Owner, Protection};
use crate::qos::KubeletMemoryQos;

/// Whether what the keeper knows besides the tree says the kubelet protects
/// a cgroup: the runtime showed a pod's container with its Memory QoS, or
/// one of a parent's pods is the kubelet's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KubeletSignal {
    Present,
    Absent,
}

/// What a value found in a cgroup nri-qos never wrote says about its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FoundValue {
    /// Above anything nri-qos would write: the kubelet wrote it (pod
    /// cgroups, which the kubelet protects before their sandbox exists).
    KubeletsIfAboveTargets,
    /// Ours to change from now on (QoS and kubepods cgroups).
    Adopted,
}

impl Keeper {
    /// Decides (or confirms) who owns `cg`, whose protection is `current`
    /// and whose targets nri-qos would write are `targets`.
    pub(super) fn decide_owner(
        &mut self,
        cg: &Path,
        signal: KubeletSignal,
        current: Protection,
        targets: &[Protection],
        found: FoundValue,
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
                signal == KubeletSignal::Present
                    || match ours {
                        Some(_) => plan::foreign(current, ours, targets),
                        None => {
                            found == FoundValue::KubeletsIfAboveTargets
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
