//! How the monitor's throttle guard raises a container's memory.high
//! without knowing who carries it out: the cgroup file alone (standalone
//! monitor), or the runtime through NRI (`nri::relax`). The monitor calls a
//! [`Relaxer`]; the app wires the concrete one.

use std::path::PathBuf;

/// One relax: the container, its cgroup directory, the memory.high to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaxRequest {
    pub container_id: String,
    pub cgroup: PathBuf,
    /// The memory.high text: bytes, or "max".
    pub value: String,
}

/// How a relax reaches the kernel. The monitor calls it from its own
/// thread, never from an NRI handler; it must not block for long.
pub trait Relaxer: Send + Sync {
    /// Raises the container's memory.high to the request's value.
    /// Returns the route taken, for the decision's log line.
    fn relax(&self, r: &RelaxRequest) -> Result<&'static str, String>;
}
