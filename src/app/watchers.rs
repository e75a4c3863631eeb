//! The node's watchers in one process: the memory.high throttle guard and
//! the node-pressure monitor, each on a thread of its own, sharing one
//! eviction path (one pod in flight across both) and one clock.

use std::future::Future;
use std::sync::Arc;

use super::AppError;
use crate::config::Config;
use crate::evict::{kill, EvictConfig, Evictor, PodTree, SharedEvictor};
use crate::guard::{self, ThrottleConfig};
use crate::metrics::Metrics;
use crate::node::cluster::ClusterEvictions;
use crate::node::registry::PodRegistry;
use crate::node::relax::Relaxer;
use crate::node::time::{Clock, SystemClock};
use crate::pressure::{self, MonitorConfig, Paths};

/// What runs, and what both watchers are handed.
pub struct Watchers {
    /// The throttle guard, when `[throttle] enabled`.
    pub guard: Option<ThrottleConfig>,
    /// The node-pressure monitor, when it runs in this process.
    pub monitor: Option<(MonitorConfig, Paths)>,
    pub evict: EvictConfig,
    pub tree: PodTree,
    pub pods: Arc<dyn PodRegistry>,
    pub cluster: Option<Arc<dyn ClusterEvictions>>,
    pub metrics: Option<Arc<Metrics>>,
    pub relaxer: Arc<dyn Relaxer>,
}

impl Watchers {
    /// The watchers `cfg` asks for (guard: `[throttle] enabled`; monitor:
    /// `monitor`), everything else from `cfg`.
    pub fn from_config(cfg: &Config, monitor: bool, relaxer: Arc<dyn Relaxer>) -> Self {
        Watchers {
            guard: cfg.throttle.enabled.then(|| cfg.throttle.clone()),
            monitor: monitor.then(|| (cfg.monitor.clone(), cfg.monitor_paths())),
            evict: cfg.evict_config(),
            tree: cfg.pod_tree(),
            pods: Arc::new(crate::node::registry::NoPods),
            cluster: None,
            metrics: None,
            relaxer,
        }
    }

    pub fn any(&self) -> bool {
        self.guard.is_some() || self.monitor.is_some()
    }

    /// The two tasks, guard first; `None` for one that does not run. Each
    /// stops when its future is dropped.
    pub fn tasks(self) -> (Option<Task>, Option<Task>) {
        let mut evictor = Evictor::new(self.evict, Arc::new(kill::Syscalls));
        if let Some(c) = &self.cluster {
            evictor = evictor.with_cluster(c.clone());
        }
        if let Some(m) = &self.metrics {
            evictor = evictor.with_metrics(m.clone());
        }
        let evictor: SharedEvictor = evictor.shared();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::default());
        let guard = self.guard.map(|cfg| {
            let with = guard::GuardHandles {
                tree: self.tree,
                pods: self.pods.clone(),
                evictor: evictor.clone(),
                clock: clock.clone(),
                relaxer: self.relaxer,
                cluster: self.cluster,
                metrics: self.metrics.clone(),
            };
            tracing::info!(relax_via = ?cfg.relax_via, "throttle guard relaxes memory.high this way");
            Box::pin(async move { guard::run(cfg, with).await.map_err(AppError::from) }) as Task
        });
        let monitor = self.monitor.map(|(cfg, paths)| {
            let with = pressure::MonitorHandles {
                pods: self.pods,
                evictor,
                clock,
                metrics: self.metrics,
            };
            Box::pin(async move {
                pressure::run(cfg, paths, with)
                    .await
                    .map_err(AppError::from)
            }) as Task
        });
        (guard, monitor)
    }
}

/// A watcher's task.
pub type Task = std::pin::Pin<Box<dyn Future<Output = Result<(), AppError>> + Send>>;

/// Spawns each task on the current runtime; a task that stops is logged
/// and the plugin carries on without it.
pub fn spawn(tasks: (Option<Task>, Option<Task>)) {
    let (guard, monitor) = tasks;
    for (what, task) in [("throttle guard", guard), ("pressure monitor", monitor)] {
        if let Some(task) = task {
            tokio::spawn(async move {
                if let Err(e) = task.await {
                    tracing::error!(error = %e, "{what} stopped");
                }
            });
        }
    }
}

/// Runs `task` to its end; a watcher that does not run never ends.
pub async fn until_stopped(task: Option<Task>) -> Result<(), AppError> {
    match task {
        Some(t) => t.await,
        None => std::future::pending().await,
    }
}
