//! A container a Synchronize found created but not started gets its values
//! as an update of the runtime's record of it, which its start applies.
//! A start already under way reads the record before the update lands
//! (containerd: a kubelet starting a sidecar while a DaemonSet's new
//! plugin synchronized): the runtime then holds our values and the kernel
//! the ones from before. At the container's start the plugin compares the
//! cgroup files with what it sent and writes the ones that differ, which
//! makes the kernel agree with the runtime's own record.

use std::collections::{BTreeMap, HashMap};

use tracing::{info, warn};

use super::api;
use super::QosPlugin;
use crate::node::cgroupfs;
use crate::node::layout::container_cgroup_dir_in;
use crate::node::lock;

/// By container id: the `unified` values (cgroup file → value) the last
/// Synchronize sent a container it found created. Bounded by that
/// Synchronize's containers; an entry goes at the container's start or
/// removal.
pub(super) type CreatedAtSync = HashMap<String, BTreeMap<String, String>>;

impl QosPlugin {
    /// PostStartContainer: a container the last Synchronize updated before
    /// it started gets the values it was sent where its cgroup lacks them.
    pub(super) fn repair_start_race(&self, container: &api::Container) {
        let Some(sent) = lock(&self.created_at_sync).remove(&container.id) else {
            return;
        };
        if self.live().dry_run {
            return;
        }
        let path = container
            .linux
            .as_ref()
            .map_or("", |l| l.cgroups_path.as_str());
        let Some(dir) = container_cgroup_dir_in(&self.settings.cgroup_root, path) else {
            return;
        };
        let mut written = Vec::new();
        for (file, value) in &sent {
            let at = dir.join(file);
            if cgroupfs::read_trimmed(&at).is_some_and(|now| now == *value) {
                continue;
            }
            match cgroupfs::write_file(&at, value) {
                Ok(()) => written.push(format!("{file}={value}")),
                Err(e) => warn!(container = %container.id, file = %file, error = %e,
                    "could not write a value its start missed"),
            }
        }
        if !written.is_empty() {
            info!(
                container = %container.id,
                cgroup = %dir.display(),
                written = %written.join(" "),
                "the container started without the values the Synchronize sent it (its start raced the update); written to its cgroup"
            );
        }
    }
}
