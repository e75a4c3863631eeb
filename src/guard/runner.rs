//! GuardHandles the guard: a thread of its own that looks, sleeps until the
//! next look (`interval` while a container is under throttle,
//! `check-interval` while none is), and stops when its future is dropped.
//! A thread, not a task, for the reasons the monitor gives (one wake-up
//! per look; blocking file I/O and a kill wait never hold up the plugin's
//! NRI handlers).

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use super::{Guard, GuardError, ThrottleConfig};
use crate::evict::{PodTree, SharedEvictor};
use crate::metrics::Metrics;
use crate::node::cluster::ClusterEvictions;
use crate::node::registry::PodRegistry;
use crate::node::relax::Relaxer;
use crate::node::time::Clock;

/// What the guard runs with besides its settings.
pub struct GuardHandles {
    pub tree: PodTree,
    /// Pod facts: the plugin's registry (and the API server's), or none.
    pub pods: Arc<dyn PodRegistry>,
    /// The eviction path, shared with the node-pressure monitor when it runs.
    pub evictor: SharedEvictor,
    /// The clock the eviction path's other users read too.
    pub clock: Arc<dyn Clock>,
    /// Who writes the relaxed memory.high.
    pub relaxer: Arc<dyn Relaxer>,
    /// `MemoryHighRelaxed` Events, when the API server is configured.
    pub cluster: Option<Arc<dyn ClusterEvictions>>,
    pub metrics: Option<Arc<Metrics>>,
}

/// Runs the guard until the future is dropped.
pub async fn run(cfg: ThrottleConfig, with: GuardHandles) -> Result<(), GuardError> {
    cfg.validate()?;
    let mut guard = Guard::new(cfg.clone(), with.tree.clone(), with.pods, with.evictor)
        .with_relaxer(with.relaxer);
    if let Some(c) = with.cluster {
        guard = guard.with_cluster(c);
    }
    if let Some(m) = with.metrics {
        guard = guard.with_metrics(m);
    }
    tracing::info!(
        cgroup_root = %with.tree.cgroup_root.display(),
        kubepods = %with.tree.kubepods,
        grace = %cfg.grace_period,
        check_interval = %cfg.check_interval,
        dry_run = guard.dry_run,
        "memory.high throttle guard started"
    );
    // Nothing is ever sent: dropping the sender (below) ends the thread's wait.
    let (stop, stopped) = std::sync::mpsc::sync_channel::<()>(1);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let clock = with.clock;
    std::thread::Builder::new()
        .name("nri-qos-guard".into())
        .spawn(move || {
            drive(guard, &stopped, clock.as_ref());
            let _ = done_tx.send(());
        })
        .map_err(GuardError::Spawn)?;
    let _stop_on_drop: SyncSender<()> = stop;
    done_rx
        .await
        .map_err(|_| GuardError::Task("the guard thread panicked".into()))
}

/// Looks until `stopped` says so (its sender dropped).
fn drive(mut guard: Guard, stopped: &Receiver<()>, clock: &dyn Clock) {
    let mut next = Duration::ZERO;
    loop {
        match stopped.recv_timeout(next) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        next = guard.step(clock.now()).next_check;
    }
}
