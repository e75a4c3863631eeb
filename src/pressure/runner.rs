//! Running the monitor: the entry points, the monitor thread with its PSI
//! triggers, and the loop that waits for a wake-up and steps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use super::act::{self, ProcessOps};
use super::triggers::Triggers;
use super::{
    protect, throttle, Clock, Monitor, MonitorConfig, MonitorError, Paths, SystemClock, Wake,
};
use crate::node::cluster;
use crate::node::registry::PodRegistry;
use crate::node::relax::Relaxer;

/// Runs the monitor alone (`nri-qos monitor`) until the future is dropped:
/// no metrics, no API server, memory.high relaxed through the cgroup file.
pub async fn run(
    cfg: MonitorConfig,
    paths: Paths,
    pods: Arc<dyn PodRegistry>,
) -> Result<(), MonitorError> {
    run_in_plugin(
        cfg,
        paths,
        pods,
        None,
        None,
        Arc::new(throttle::FileRelaxer),
    )
    .await
}

/// The monitor in the plugin's process: publishing evictions and PSI to
/// `metrics`, evicting through the API server when `cluster` is given, and
/// relaxing memory.high through `relaxer` (the plugin's chosen route).
pub async fn run_in_plugin(
    cfg: MonitorConfig,
    paths: Paths,
    pods: Arc<dyn PodRegistry>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    cluster: Option<Arc<dyn cluster::ClusterEvictions>>,
    relaxer: Arc<dyn Relaxer>,
) -> Result<(), MonitorError> {
    cfg.validate()?;
    if cfg.lock_memory {
        match protect::lock_memory() {
            Ok(()) => {
                tracing::info!("process memory locked as it is touched (mlockall, MCL_ONFAULT)")
            }
            Err(e) => tracing::warn!(error = %e,
                "not locking the process's memory (needs CAP_IPC_LOCK); under pressure the kernel may page out the monitor's code"),
        }
    }
    let mut monitor = Monitor::new(cfg.clone(), paths.clone(), pods, Arc::new(act::Syscalls))
        .with_relaxer(relaxer);
    if let Some(m) = metrics {
        monitor = monitor.with_metrics(m);
    }
    if let Some(c) = cluster {
        monitor = monitor.with_cluster(c);
    }
    let nice = cfg.nice;
    start(cfg, paths, monitor, Arc::new(SystemClock::default()), nice).await
}

/// `run` with the process syscalls and the clock injected.
pub async fn run_with(
    cfg: MonitorConfig,
    paths: Paths,
    pods: Arc<dyn PodRegistry>,
    ops: Arc<dyn ProcessOps>,
    clock: Arc<dyn Clock>,
) -> Result<(), MonitorError> {
    cfg.validate()?;
    let monitor = Monitor::new(cfg.clone(), paths.clone(), pods, ops);
    start(cfg, paths, monitor, clock, 0).await
}

/// Arms the PSI triggers on the current runtime and runs the loop on a
/// thread of its own. A thread, not a task: a sleeping thread wakes once
/// per check, where tokio's timer wheel wakes twice for every timeout over
/// 64 ms, which was half the idle cost; and a step's blocking file I/O and
/// kill wait never hold up the plugin's NRI handlers.
/// `nice` is applied to the monitor thread alone (0 leaves it).
async fn start(
    cfg: MonitorConfig,
    paths: Paths,
    monitor: Monitor,
    clock: Arc<dyn Clock>,
    nice: i32,
) -> Result<(), MonitorError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(16);
    let mut triggers = Triggers::new(&cfg, &paths, tx.clone(), tokio::runtime::Handle::current());
    triggers.arm();
    tracing::info!(
        cgroup_root = %paths.cgroup_root.display(),
        proc_root = %paths.proc_root.display(),
        kubepods = ?monitor.kubepods(),
        psi_targets_armed = triggers.armed(),
        hard = %cfg.hard_threshold,
        soft = %cfg.soft_threshold,
        dry_run = cfg.dry_run,
        "memory-pressure monitor started"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let thread_stop = stop.clone();
    std::thread::Builder::new()
        .name("nri-qos-monitor".into())
        .spawn(move || {
            if nice != 0 {
                match protect::set_thread_nice(nice) {
                    Ok(()) => tracing::info!(nice, "monitor thread priority raised"),
                    Err(e) => tracing::warn!(nice, error = %e,
                        "cannot set the monitor thread's nice value (needs CAP_SYS_NICE); it competes for CPU like any process"),
                }
            }
            let r = drive(monitor, rx, clock, Some(triggers), &thread_stop);
            let _ = done_tx.send(r);
        })
        .map_err(MonitorError::Spawn)?;
    // Dropping this future (shutdown, select!) stops the thread at once.
    let _stop = StopOnDrop { stop, tx };
    done_rx
        .await
        .map_err(|_| MonitorError::Task("the monitor thread panicked".into()))?
}

struct StopOnDrop {
    stop: Arc<AtomicBool>,
    tx: SyncSender<Wake>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.tx.try_send(Wake::Tick);
    }
}

/// The loop: wait for a wake-up or the next check, then step, until the
/// channel closes or `stop` is set.
fn drive(
    mut monitor: Monitor,
    rx: Receiver<Wake>,
    clock: Arc<dyn Clock>,
    mut triggers: Option<Triggers>,
    stop: &AtomicBool,
) -> Result<(), MonitorError> {
    let mut next = Duration::ZERO;
    loop {
        let wake = match rx.recv_timeout(next) {
            Ok(w) => w,
            Err(RecvTimeoutError::Timeout) => Wake::Tick,
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(t) = triggers.as_mut() {
            match &wake {
                Wake::PsiLost { source } => t.lost(source),
                Wake::Tick => t.arm(),
                Wake::Psi { .. } => {}
            }
        }
        let now = clock.now();
        next = match monitor.quick(&wake, now) {
            Some(quick) => quick,
            None => monitor.step(&wake, now).next_check,
        };
    }
}

/// Drives a monitor on the calling thread from an injected channel of
/// wake-ups until it closes (tests, embedders with their own wake-ups).
pub fn drive_with(
    monitor: Monitor,
    rx: Receiver<Wake>,
    clock: Arc<dyn Clock>,
) -> Result<(), MonitorError> {
    drive(monitor, rx, clock, None, &AtomicBool::new(false))
}
