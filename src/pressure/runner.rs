//! MonitorHandles the monitor: the entry point, the monitor thread with its PSI
//! triggers, and the loop that waits for a wake-up and steps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use super::triggers::Triggers;
use super::{protect, Clock, Monitor, MonitorConfig, MonitorError, Paths, Wake};
use crate::evict::SharedEvictor;
use crate::node::registry::PodRegistry;

/// What the monitor runs with besides its settings.
pub struct MonitorHandles {
    /// Pod facts: the plugin's registry (and the API server's), or none.
    pub pods: Arc<dyn PodRegistry>,
    /// The eviction path, shared with the throttle guard when it runs.
    pub evictor: SharedEvictor,
    /// The clock the eviction path's other users read too.
    pub clock: Arc<dyn Clock>,
    /// Publishes node PSI averages, when the endpoint is on.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
}

/// Runs the monitor until the future is dropped: `nri-qos monitor`, and
/// the plugin's node-pressure monitor (`with-monitor`).
pub async fn run(
    cfg: MonitorConfig,
    paths: Paths,
    with: MonitorHandles,
) -> Result<(), MonitorError> {
    cfg.validate()?;
    let mut monitor = Monitor::new(cfg.clone(), paths.clone(), with.pods, with.evictor);
    if let Some(m) = with.metrics {
        monitor = monitor.with_metrics(m);
    }
    start(cfg, paths, monitor, with.clock).await
}

/// `[monitor] lock-memory` and `nice`, on the monitor's own thread: mlockall
/// walks every mapping of the process, and on the plugin's one async thread
/// it could hold up the registration the runtime gives 5 s.
fn protect_this_thread(lock_memory: bool, nice: i32) {
    if lock_memory {
        match protect::lock_memory() {
            Ok(()) => {
                tracing::info!("process memory locked as it is touched (mlockall, MCL_ONFAULT)")
            }
            Err(e) => tracing::warn!(error = %e,
                "not locking the process's memory (needs CAP_IPC_LOCK or an unlimited RLIMIT_MEMLOCK); under pressure the kernel may page out the monitor's code"),
        }
    }
    if nice != 0 {
        match protect::set_thread_nice(nice) {
            Ok(()) => tracing::info!(nice, "monitor thread priority raised"),
            Err(e) => tracing::warn!(nice, error = %e,
                "cannot set the monitor thread's nice value (needs CAP_SYS_NICE or RLIMIT_NICE); it competes for CPU like any process"),
        }
    }
}

/// Arms the PSI triggers on the current runtime and runs the loop on a
/// thread of its own. A thread, not a task: a sleeping thread wakes once
/// per check, where tokio's timer wheel wakes twice for every timeout over
/// 64 ms, which was half the idle cost; and a step's blocking file I/O and
/// kill wait never hold up the plugin's NRI handlers.
async fn start(
    cfg: MonitorConfig,
    paths: Paths,
    monitor: Monitor,
    clock: Arc<dyn Clock>,
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
    let (lock_memory, nice) = (cfg.lock_memory, cfg.nice);
    std::thread::Builder::new()
        .name("nri-qos-monitor".into())
        .spawn(move || {
            protect_this_thread(lock_memory, nice);
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
