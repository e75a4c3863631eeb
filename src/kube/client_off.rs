//! A build without the Kubernetes API client (cargo feature `kube` off):
//! the source cannot start, so no [`Kube`] value ever exists and the plugin,
//! the monitor and `nri-qos audit` run on the runtime's facts, as with the
//! source off.

use std::sync::Arc;
use std::time::Duration;

use super::facts::ApiPodFacts;
use super::store::PodStore;
use super::{Credentials, KubeError};
use crate::metrics::Metrics;
use crate::node::cluster::{ClusterEvictions, EvictOutcome, EvictionNotice, RelaxNotice};

/// A running API source; uninhabited in this build.
#[derive(Debug, Clone)]
pub enum Kube {}

impl Kube {
    /// Always [`KubeError::NotBuilt`]: the caller logs it and goes on
    /// without the source.
    pub fn start(
        _credentials: Credentials,
        _node_name: String,
        _evict: bool,
        _metrics: Option<Arc<Metrics>>,
    ) -> Result<Kube, KubeError> {
        Err(KubeError::NotBuilt)
    }

    pub fn store(&self) -> Arc<PodStore> {
        match *self {}
    }
}

/// Always [`KubeError::NotBuilt`] (`nri-qos audit` notes it and uses the
/// runtime's values).
pub async fn list_node_pods(
    _credentials: &Credentials,
    _node_name: &str,
    _limit: Duration,
) -> Result<Vec<ApiPodFacts>, KubeError> {
    Err(KubeError::NotBuilt)
}

impl ClusterEvictions for Kube {
    fn evict(&self, _notice: &EvictionNotice, _limit: Duration) -> EvictOutcome {
        match *self {}
    }

    fn evict_after_kill(&self, _notice: EvictionNotice) {
        match *self {}
    }

    fn memory_high_relaxed(&self, _notice: RelaxNotice) {
        match *self {}
    }
}
