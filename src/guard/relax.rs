//! Stage 1's write: memory.high up to memory.max (without a limit, to
//! `node::cgroupfs::RELAXED_WITHOUT_LIMIT`), through the cgroup file unless
//! the runtime route was chosen (`crate::nri::relax`).

use super::sample::Sample;
use crate::node::cgroupfs as stat;
use crate::node::relax::{RelaxError, RelaxRequest, Relaxer};

/// memory.high as written to the file: bytes, or "max".
pub fn high_value(v: Option<u64>) -> String {
    v.map_or_else(|| "max".to_string(), |b| b.to_string())
}

impl Sample {
    /// What relaxing this container asks for: memory.high up to
    /// [`Sample::relax_value`].
    pub fn relax_request(&self) -> RelaxRequest {
        RelaxRequest {
            container_id: self.id.clone(),
            cgroup: self.path.clone(),
            value: self.relax_value().to_string(),
        }
    }
}

/// Writes memory.high of the container cgroup (the default route, and the
/// only one without an NRI session to tell the runtime through).
#[derive(Debug, Default)]
pub struct FileRelaxer;

impl Relaxer for FileRelaxer {
    fn relax(&self, r: &RelaxRequest) -> Result<&'static str, RelaxError> {
        stat::write_file(&r.cgroup.join("memory.high"), &r.value)?;
        Ok("cgroup-file")
    }
}
