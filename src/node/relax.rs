//! How the throttle guard raises a container's memory.high without knowing
//! who carries it out: the cgroup file (the default, and the only way
//! outside the plugin), or the runtime through NRI (`nri::relax`, only with
//! `[throttle] relax-via = "runtime"`). The guard calls a [`Relaxer`]; the
//! app wires the concrete one from [`RelaxVia`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[throttle] relax-via`: who writes the relaxed memory.high.
///
/// The cgroup file by default: a plugin-initiated NRI `UpdateContainers`
/// can deadlock containerd for good (containerd/containerd#13733: the call
/// takes NRI's adaptation lock, then containerd's NRI lock; CRI lifecycle
/// and update events take them in the other order), fixed only by
/// containerd/nri#301, which containerd 1.7.24 and 2.1.9 do not carry. The
/// kernel value is what ends the stall, and the plugin leaves a relaxed
/// memory.high alone on Synchronize and UpdateContainer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RelaxVia {
    /// Write memory.high of the container's cgroup.
    #[default]
    CgroupFile,
    /// NRI `Runtime/UpdateContainers` (read back; the file where the value
    /// did not arrive). Only for runtimes known to carry containerd/nri#301.
    Runtime,
}

/// One relax: the container, its cgroup directory, the memory.high to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaxRequest {
    pub container_id: String,
    pub cgroup: PathBuf,
    /// The memory.high text: bytes, or "max".
    pub value: String,
}

/// Why a relax did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RelaxError {
    /// The cgroup file could not be written.
    #[error(transparent)]
    File(#[from] crate::node::cgroupfs::WriteError),
    /// The runtime route's queue is full: relaxes are already waiting for
    /// the runtime, so this one is dropped and the guard looks again.
    #[error("relax queue full ({0} waiting for the runtime)")]
    QueueFull(usize),
    /// The task that talks to the runtime has stopped.
    #[error("relax queue closed: the runtime route's task has stopped")]
    QueueClosed,
}

/// How a relax reaches the kernel. The guard calls it from its own
/// thread, never from an NRI handler; it must not block for long.
pub trait Relaxer: Send + Sync {
    /// Raises the container's memory.high to the request's value.
    /// Returns the route taken, for the decision's log line.
    fn relax(&self, r: &RelaxRequest) -> Result<&'static str, RelaxError>;
}
