//! The `nri.pkg.api.v1alpha1.Plugin` service: thin handlers over the pure
//! QoS policy.
//!
//! Every handler answers in microseconds and never returns an error for a
//! policy reason: a runtime fails container creation on any error status, so
//! odd input gets an empty adjustment and a log line instead.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;
use tracing::{debug, info, warn};
use ttrpc::r#async::TtrpcContext;

use super::convert;
use super::oom_fallback;
use super::proto::api;
use super::proto::api_ttrpc::Plugin;
use super::reassembly::{Complete, SyncReassembler, SYNC_BUDGET_BYTES};
use crate::metrics::Metrics;
use crate::node::cgroupfs::{self, read_protection, Owner, Protection};
use crate::node::layout::{container_cgroup_dir, pod_cgroups};
use crate::node::lock;
use crate::node::registry::{
    ContainerRecord, ContainerRequests, PodRecord, Registry, SharedRegistry,
};
use crate::node::runtime::RuntimeQuirks;
use crate::qos::{self, NodeFacts, PolicyConfig, QosClass};

#[cfg(test)]
mod event_tests;
mod events;
mod handlers;
mod kubelet_ownership;
mod record;
mod start_race;
mod sync;
#[cfg(test)]
mod tests;

pub use events::EventPath;

fn class_label(c: QosClass) -> &'static str {
    match c {
        QosClass::Guaranteed => "Guaranteed",
        QosClass::Burstable => "Burstable",
        QosClass::BestEffort => "BestEffort",
    }
}

/// Events we subscribe to on every runtime. Kept within 0x7FF, the mask
/// every runtime since NRI v0.6.1 accepts (newer bits make old runtimes
/// drop the plugin).
pub const EVENTS: i32 = event_bit(api::Event::RUN_POD_SANDBOX)
    | event_bit(api::Event::REMOVE_POD_SANDBOX)
    | event_bit(api::Event::CREATE_CONTAINER)
    | event_bit(api::Event::POST_START_CONTAINER)
    | event_bit(api::Event::UPDATE_CONTAINER)
    | event_bit(api::Event::STOP_CONTAINER)
    | event_bit(api::Event::REMOVE_CONTAINER);

/// [`EVENTS`] and, where the runtime knows it (NRI v0.10 on), the pod-level
/// resize (UpdatePodSandbox; its Post form carries nothing more).
pub fn event_mask(quirks: &RuntimeQuirks) -> i32 {
    if quirks.pod_update_events {
        EVENTS | event_bit(api::Event::UPDATE_POD_SANDBOX)
    } else {
        EVENTS
    }
}

const fn event_bit(e: api::Event) -> i32 {
    1 << (e as i32 - 1)
}

pub use super::reassembly::DEFAULT_REQUEST_TIMEOUT;
/// Registration timeout the runtime uses when Configure does not say.
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything the handlers need that does not change during a session.
#[derive(Debug, Clone)]
pub struct PluginSettings {
    pub policy: PolicyConfig,
    pub node: NodeFacts,
    /// Compute and log adjustments without returning them.
    pub dry_run: bool,
    /// Bring containers that already run into line on Synchronize.
    pub adjust_existing: bool,
    /// Where `/proc` is, for the oom_score_adj fallback on old runtimes.
    pub proc_root: PathBuf,
    /// The cgroup v2 mount point: a pod cgroup the kubelet protected before
    /// the sandbox, or a started container's cgroup holding a key it set,
    /// tells of its Memory QoS where `unified` is hidden, and
    /// Synchronize leaves a memory.high the throttle guard relaxed alone.
    pub cgroup_root: PathBuf,
}

/// What Configure told us about the runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub quirks: RuntimeQuirks,
    pub request_timeout: Option<Duration>,
    pub registration_timeout: Option<Duration>,
}

#[derive(Debug, Clone)]
struct LiveSettings {
    policy: Arc<PolicyConfig>,
    dry_run: bool,
}

/// Counters a test or the metrics endpoint can read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub created: u64,
    pub adjusted: u64,
    pub updated: u64,
    pub synchronized: u64,
    pub oom_fallback_writes: u64,
}

/// The Plugin service implementation.
pub struct QosPlugin {
    settings: PluginSettings,
    /// Policy and dry-run as currently in force: the runtime's drop-in
    /// config (sent in Configure) may replace what we started with.
    live: RwLock<LiveSettings>,
    runtime: Mutex<Option<RuntimeInfo>>,
    sync: Mutex<SyncReassembler>,
    registry: SharedRegistry,
    counters: Mutex<Counters>,
    configured: watch::Sender<bool>,
    synchronized: watch::Sender<bool>,
    changed: watch::Sender<u64>,
    warned_old_runtime: AtomicBool,
    /// The event paths ([`EventPath`]) this session has used, as bits.
    paths_seen: AtomicU8,
    metrics: Arc<Metrics>,
    /// This node's pods from the API server, when that source runs.
    api_pods: Option<Arc<dyn ContainerRequests>>,
    /// Layers the runtime's drop-in config over ours; none: it is ignored.
    drop_in: Option<DropInLayer>,
    /// The values the last Synchronize sent containers it found created
    /// but not started, checked when they start ([`start_race`]).
    created_at_sync: Mutex<start_race::CreatedAtSync>,
}

/// Layers config text the runtime sends in Configure over the plugin's own
/// and returns the `[policy]` and `plugin.dry-run` to use, or why the text
/// is refused. The config layering owns it (and its error type, a floor
/// above); the app wires it in.
pub type DropInLayer = Arc<
    dyn Fn(&str) -> Result<(PolicyConfig, bool), Box<dyn std::error::Error + Send + Sync>>
        + Send
        + Sync,
>;

/// Waits until `flag` is true, or `limit` passed.
async fn wait_for(flag: &watch::Sender<bool>, limit: Duration) -> bool {
    let mut rx = flag.subscribe();
    tokio::time::timeout(limit, rx.wait_for(|set| *set))
        .await
        .is_ok_and(|r| r.is_ok())
}

impl QosPlugin {
    pub fn new(settings: PluginSettings) -> Self {
        let kubelet_memory_qos = settings.policy.kubelet_memory_qos;
        QosPlugin {
            live: RwLock::new(LiveSettings {
                policy: Arc::new(settings.policy.clone()),
                dry_run: settings.dry_run,
            }),
            settings,
            runtime: Mutex::new(None),
            sync: Mutex::new(SyncReassembler::new(SYNC_BUDGET_BYTES, sync::sync_cost)),
            registry: Arc::new(Mutex::new(Registry {
                kubelet_memory_qos,
                ..Registry::default()
            })),
            counters: Mutex::new(Counters::default()),
            configured: watch::channel(false).0,
            synchronized: watch::channel(false).0,
            changed: watch::channel(0).0,
            warned_old_runtime: AtomicBool::new(false),
            paths_seen: AtomicU8::new(0),
            metrics: Arc::new(Metrics::new()),
            api_pods: None,
            drop_in: None,
            created_at_sync: Mutex::new(HashMap::new()),
        }
    }

    /// How the runtime's drop-in config is layered over ours (see
    /// [`QosPlugin::apply_runtime_config`]).
    pub fn with_drop_in(mut self, layer: DropInLayer) -> Self {
        self.drop_in = Some(layer);
        self
    }

    /// Bytes a Synchronize may take (`plugin.sync-budget-mib`).
    pub fn with_sync_budget(self, bytes: usize) -> Self {
        *lock(&self.sync) = SyncReassembler::new(bytes, sync::sync_cost);
        self
    }

    /// Exact requests from the API server's pod specs ahead of what the
    /// CRI values let us recover. The hooks read the snapshot only.
    pub fn with_api_pods(mut self, store: Arc<dyn ContainerRequests>) -> Self {
        self.api_pods = Some(store);
        self
    }

    /// The plugin's metrics (served by the metrics endpoint when enabled).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    fn record(&self, class: QosClass, result: &str, started: Instant) {
        self.metrics.record_adjustment(class_label(class), result);
        self.metrics.observe_hook(started.elapsed());
    }

    pub fn settings(&self) -> &PluginSettings {
        &self.settings
    }

    /// The shared registry of pods and containers.
    pub fn registry(&self) -> SharedRegistry {
        self.registry.clone()
    }

    /// Ticks whenever the registry changed (for the hierarchy keeper).
    pub fn subscribe_changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn runtime_info(&self) -> Option<RuntimeInfo> {
        lock(&self.runtime).clone()
    }

    /// The runtime's quirks; an unknown runtime's before Configure.
    pub fn quirks(&self) -> RuntimeQuirks {
        lock(&self.runtime)
            .as_ref()
            .map(|r| r.quirks.clone())
            .unwrap_or_default()
    }

    pub fn counters(&self) -> Counters {
        *lock(&self.counters)
    }

    /// Forget the previous session: a reconnect is a new plugin to the
    /// runtime, which re-sends everything in Synchronize.
    pub fn reset_session(&self) {
        *lock(&self.runtime) = None;
        self.paths_seen.store(0, Ordering::Relaxed);
        lock(&self.sync).start_over();
        self.configured.send_replace(false);
        self.synchronized.send_replace(false);
    }

    /// Waits until Configure arrived, or `limit` passed.
    pub async fn wait_configured(&self, limit: Duration) -> bool {
        wait_for(&self.configured, limit).await
    }

    /// Waits until a whole Synchronize was answered, or `limit` passed.
    pub async fn wait_synchronized(&self, limit: Duration) -> bool {
        wait_for(&self.synchronized, limit).await
    }

    fn live(&self) -> LiveSettings {
        self.live.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn dry_run(&self) -> bool {
        self.live().dry_run
    }

    /// Applies the config text the runtime sends in Configure (the plugin's
    /// drop-in file for pre-launched plugins) as one more layer: only the
    /// `[policy]` keys and `plugin.dry-run` it sets replace what we started
    /// with (defaults, file, environment, flags). Invalid text keeps what we have.
    pub fn apply_runtime_config(&self, text: &str) {
        if text.trim().is_empty() {
            return;
        }
        let Some(layer) = &self.drop_in else {
            warn!("ignoring the runtime's drop-in config; no config layering wired in");
            return;
        };
        match layer(text) {
            Ok((policy, dry_run)) => {
                lock(&self.registry).kubelet_memory_qos = policy.kubelet_memory_qos;
                let mut live = self.live.write().unwrap_or_else(|p| p.into_inner());
                live.policy = Arc::new(policy);
                live.dry_run = dry_run;
                info!(
                    dry_run = live.dry_run,
                    "runtime's drop-in config applied over the plugin's own"
                );
            }
            Err(e) => {
                warn!(error = %e, "ignoring the runtime's drop-in config; keeping the current one")
            }
        }
    }

    fn notify_changed(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Before Configure nothing says otherwise: the adjustment is sent.
    fn applies_oom_score_adj(&self) -> bool {
        lock(&self.runtime)
            .as_ref()
            .is_none_or(|r| r.quirks.applies_oom_score_adj)
    }

    fn forget_container(&self, id: &str) {
        if lock(&self.registry).containers.remove(id).is_some() {
            self.notify_changed();
        }
    }

    fn forget_pod(&self, id: &str) {
        let mut reg = lock(&self.registry);
        let had = reg.pods.remove(id).is_some();
        reg.containers.retain(|_, c| &*c.pod_id != id);
        drop(reg);
        if had {
            self.notify_changed();
        }
    }

    /// On runtimes that drop the oom_score_adj adjustment, write it into the
    /// started container's init process ourselves.
    fn oom_fallback(&self, container: &api::Container) {
        if self.applies_oom_score_adj() || self.dry_run() || container.pid == 0 {
            return;
        }
        let wanted = lock(&self.registry)
            .containers
            .get(&container.id)
            .and_then(|c| c.oom_score_adj);
        let Some(adj) = wanted else { return };
        let current = container
            .linux
            .as_ref()
            .and_then(|l| l.oom_score_adj.as_ref())
            .map(|o| o.value);
        if current == Some(adj) {
            return;
        }
        if !self.warned_old_runtime.swap(true, Ordering::Relaxed) {
            warn!("runtime speaks NRI v0.6 and drops oom_score_adj adjustments; writing /proc/<pid>/oom_score_adj at container start instead");
        }
        let cgroups_path = container
            .linux
            .as_ref()
            .map(|l| l.cgroups_path.as_str())
            .unwrap_or_default();
        let pid = container.pid;
        match oom_fallback::write_oom_score_adj(&self.settings.proc_root, pid, cgroups_path, adj) {
            Ok(()) => {
                lock(&self.counters).oom_fallback_writes += 1;
                debug!(pid, adj, "oom_score_adj written");
            }
            Err(e) => warn!(pid, adj, error = %e, "could not write oom_score_adj"),
        }
    }
}
