//! The `nri.pkg.api.v1alpha1.Plugin` service: thin handlers over the pure
//! QoS policy.
//!
//! Every handler answers in microseconds and never returns an error for a
//! policy reason: a runtime fails container creation on any error status, so
//! odd input gets an empty adjustment and a log line instead.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;
use tracing::{debug, info, warn};
use ttrpc::r#async::TtrpcContext;

use super::convert;
use super::oom_fallback;
use super::proto::api;
use super::proto::api_ttrpc::Plugin;
use super::reassembly::{Complete, SyncReassembler};
use crate::cgroup::keeper::read_protection;
use crate::cgroup::layout::pod_cgroups;
use crate::cgroup::plan::{Protection, PAGE_SIZE};
use crate::metrics::Metrics;
use crate::node::registry::{ContainerRecord, Owner, PodRecord, Registry, SharedRegistry};
use crate::qos::{self, NodeFacts, PolicyConfig, QosClass};

fn class_label(c: QosClass) -> &'static str {
    match c {
        QosClass::Guaranteed => "Guaranteed",
        QosClass::Burstable => "Burstable",
        QosClass::BestEffort => "BestEffort",
    }
}

/// Events we subscribe to. Kept within 0x7FF, the mask every runtime since
/// NRI v0.6.1 accepts (newer bits make old runtimes drop the plugin).
pub const EVENTS: i32 = event_bit(api::Event::RUN_POD_SANDBOX)
    | event_bit(api::Event::REMOVE_POD_SANDBOX)
    | event_bit(api::Event::CREATE_CONTAINER)
    | event_bit(api::Event::POST_START_CONTAINER)
    | event_bit(api::Event::UPDATE_CONTAINER)
    | event_bit(api::Event::STOP_CONTAINER)
    | event_bit(api::Event::REMOVE_CONTAINER);

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
    /// the sandbox tells of its Memory QoS where `unified` is hidden, and
    /// Synchronize leaves a memory.high the throttle guard relaxed alone.
    pub cgroup_root: PathBuf,
}

/// What Configure told us about the runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub name: String,
    pub version: String,
    pub request_timeout: Option<Duration>,
    pub registration_timeout: Option<Duration>,
    /// Runtimes on NRI v0.6.x do not know the oom_score_adj adjustment and
    /// drop it silently; they are also the ones that send no timeouts.
    pub applies_oom_score_adj: bool,
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
    changed: watch::Sender<u64>,
    warned_old_runtime: AtomicBool,
    metrics: Arc<Metrics>,
    /// This node's pods from the API server, when that source runs.
    api_pods: Option<Arc<crate::kube::PodStore>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A handler that panicked cannot leave these maps half-updated in a way
    // that matters more than refusing to serve; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
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
            sync: Mutex::new(SyncReassembler::default()),
            registry: Arc::new(Mutex::new(Registry {
                kubelet_memory_qos,
                ..Registry::default()
            })),
            counters: Mutex::new(Counters::default()),
            configured: watch::channel(false).0,
            changed: watch::channel(0).0,
            warned_old_runtime: AtomicBool::new(false),
            metrics: Arc::new(Metrics::new()),
            api_pods: None,
        }
    }

    /// Exact requests from the API server's pod specs ahead of what the
    /// CRI values let us recover. The hooks read the snapshot only.
    pub fn with_api_pods(mut self, store: Arc<crate::kube::PodStore>) -> Self {
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

    pub fn counters(&self) -> Counters {
        *lock(&self.counters)
    }

    /// Forget the previous session: a reconnect is a new plugin to the
    /// runtime, which re-sends everything in Synchronize.
    pub fn reset_session(&self) {
        *lock(&self.runtime) = None;
        *lock(&self.sync) = SyncReassembler::default();
        self.configured.send_replace(false);
    }

    /// Waits until Configure arrived, or `limit` passed.
    pub async fn wait_configured(&self, limit: Duration) -> bool {
        let mut rx = self.configured.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|c| *c))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
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
        let base = self.settings.policy.clone();
        match layer_drop_in(&base, self.settings.dry_run, text) {
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

    fn applies_oom_score_adj(&self) -> bool {
        lock(&self.runtime)
            .as_ref()
            .map(|r| r.applies_oom_score_adj)
            .unwrap_or(true)
    }

    /// Runs the policy for one container and records the result.
    fn decide_and_record(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
        resources_override: Option<&api::LinuxResources>,
    ) -> qos::Decision {
        let mut pod_facts = convert::pod_from_wire(pod);
        let mut facts = convert::container_from_wire(container);
        if let Some(r) = resources_override {
            facts.resources = convert::resources_from_wire(r);
        }
        if let Some(api) = self.api_pods.as_ref().and_then(|s| s.get(&pod_facts.uid)) {
            facts.api_memory_request = api.container_request(&facts.name);
        }
        let started = Instant::now();
        let policy = self.live().policy;
        pod_facts.kubelet_memory_qos = self.kubelet_owns_pod(&pod.id, &pod_facts, &policy);
        let decision = decide_or_leave_alone(&pod_facts, &facts, &self.settings.node, &policy);
        debug!(
            pod = %format_args!("{}/{}", pod_facts.namespace, pod_facts.name),
            container = %facts.name,
            class = ?decision.class,
            reason = %decision.reason,
            memory_request = ?decision.memory_request,
            request_source = ?decision.request_source,
            cpu_request_milli = decision.cpu_request_milli,
            adjustment = ?decision.adjustment,
            took_us = started.elapsed().as_micros() as u64,
            "policy decision"
        );
        for note in &decision.notes {
            info!(container = %facts.name, pod = %pod_facts.name, "{note}");
        }
        let unified = &decision.adjustment.unified;
        let bytes = |key: &str| {
            unified
                .get(key)
                .or_else(|| facts.resources.unified.get(key))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let record = ContainerRecord {
            id: container.id.clone(),
            pod_id: if container.pod_sandbox_id.is_empty() {
                pod.id.clone()
            } else {
                container.pod_sandbox_id.clone()
            },
            name: container.name.clone(),
            class: decision.class,
            memory_request: decision.memory_request,
            request_source: decision.request_source,
            memory_min: bytes("memory.min"),
            memory_low: bytes("memory.low"),
            kubelet_memory_qos: pod_facts.kubelet_memory_qos
                || qos::policy::kubelet_memory_qos_keys(&facts.resources),
            oom_score_adj: decision.adjustment.oom_score_adj.or(facts.oom_score_adj),
            cgroups_path: facts.cgroups_path.clone(),
        };
        let mut reg = lock(&self.registry);
        reg.pods
            .insert(pod.id.clone(), pod_record(&pod.id, &pod_facts));
        reg.containers.insert(container.id.clone(), record);
        drop(reg);
        self.notify_changed();
        decision
    }

    /// Whether the kubelet's Memory QoS protects this pod where the runtime
    /// hides its keys (auto mode). Decided once per pod cgroup: when the
    /// plugin first sees the pod, protection already in its cgroup is the
    /// kubelet's (it writes it before creating the sandbox; we only write a
    /// pod after we know it); later the keeper's decision stands.
    fn kubelet_owns_pod(&self, pod_id: &str, pod: &qos::PodFacts, policy: &PolicyConfig) -> bool {
        if policy.kubelet_memory_qos != qos::KubeletMemoryQos::Auto || !self.settings.node.cgroup_v2
        {
            return false;
        }
        let Some(cg) = pod_cgroups(&pod.cgroup_parent) else {
            return false;
        };
        let mut reg = lock(&self.registry);
        if let Some(owner) = reg.owners.get(&cg.pod) {
            return *owner == Owner::Kubelet;
        }
        let first_sight = !reg.pods.contains_key(pod_id);
        if !first_sight {
            return false;
        }
        let Protection { min, low } = read_protection(&self.settings.cgroup_root, &cg.pod);
        if min == 0 && low == 0 {
            return false;
        }
        info!(
            cgroup = %cg.pod.display(),
            memory_min = min,
            memory_low = low,
            owner = Owner::Kubelet.label(),
            "pod cgroup protected before its sandbox: the kubelet's Memory QoS owns its protection; container memory.min/low/high left to it"
        );
        reg.owners.insert(cg.pod, Owner::Kubelet);
        true
    }

    /// After a restart nothing says what we wrote before: a pod cgroup with
    /// more protection than our own policy gives its containers was
    /// protected by the kubelet (the keeper and `audit` apply the same rule),
    /// and its containers must not get ours in this Synchronize either.
    fn recover_pod_owners(
        &self,
        buf: &super::reassembly::Snapshot,
        pods: &HashMap<&str, &api::PodSandbox>,
    ) {
        let policy = self.live().policy;
        if policy.kubelet_memory_qos != qos::KubeletMemoryQos::Auto || !self.settings.node.cgroup_v2
        {
            return;
        }
        let sums = own_pod_protection(&buf.containers, pods, &self.settings.node, &policy);
        let mut reg = lock(&self.registry);
        for p in &buf.pods {
            let Some(cg) = pod_cgroups(&p.linux.cgroup_parent) else {
                continue;
            };
            if reg.owners.contains_key(&cg.pod) {
                continue;
            }
            let on_disk = read_protection(&self.settings.cgroup_root, &cg.pod);
            let ours = sums.get(p.id.as_str()).copied().unwrap_or_default();
            if crate::cgroup::plan::exceeds(on_disk, ours) {
                info!(
                    cgroup = %cg.pod.display(),
                    memory_min = on_disk.min,
                    memory_low = on_disk.low,
                    owner = Owner::Kubelet.label(),
                    "pod cgroup holds more protection than nri-qos would write: the kubelet's Memory QoS owns it"
                );
                reg.owners.insert(cg.pod, Owner::Kubelet);
            }
        }
    }

    fn forget_container(&self, id: &str) {
        if lock(&self.registry).containers.remove(id).is_some() {
            self.notify_changed();
        }
    }

    fn forget_pod(&self, id: &str) {
        let mut reg = lock(&self.registry);
        let had = reg.pods.remove(id).is_some();
        reg.containers.retain(|_, c| c.pod_id != id);
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

    /// A running container whose memory.high the monitor's throttle guard
    /// raised keeps it until it restarts or is resized: a plugin restart
    /// must not throttle it again.
    fn keep_relaxed_high(&self, c: &api::Container, adjustment: &mut qos::Adjustment) {
        let Some(want) = adjustment.unified.get("memory.high") else {
            return;
        };
        let cgroups_path = c.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
        let Some(rel) = crate::node::container_cgroup_dir(cgroups_path) else {
            return;
        };
        let dir = self.settings.cgroup_root.join(rel);
        if crate::pressure::throttle::relaxed_in_tree(&dir, want) {
            info!(container = %c.id, wanted = %want, "memory.high was relaxed by the throttle guard; leaving it");
            adjustment.unified.remove("memory.high");
        }
    }

    fn finish_sync(&self, whole: Complete) -> Vec<api::ContainerUpdate> {
        let buf = whole.snapshot;
        let mut skipped = 0usize;
        {
            let mut reg = lock(&self.registry);
            let owners = std::mem::take(&mut reg.owners);
            *reg = Registry {
                owners,
                kubelet_memory_qos: reg.kubelet_memory_qos,
                ..Registry::default()
            };
        }
        let pods: HashMap<&str, &api::PodSandbox> =
            buf.pods.iter().map(|p| (p.id.as_str(), p)).collect();
        self.recover_pod_owners(&buf, &pods);
        // Every pod is known before its containers are decided: in a
        // Synchronize nothing is seen for the first time (the tree rule for
        // restarts above decided who owns them).
        for p in &buf.pods {
            lock(&self.registry)
                .pods
                .entry(p.id.clone())
                .or_insert_with(|| pod_record(&p.id, &convert::pod_from_wire(p)));
        }
        let mut updates = Vec::new();
        for (i, c) in buf.containers.iter().enumerate() {
            // Answer in time with what we have rather than be dropped for
            // being late; the rest is learnt from later events.
            if i % 64 == 0 && whole.answer_by.is_some_and(|t| Instant::now() > t) {
                skipped = buf.containers.len() - i;
                break;
            }
            let Some(pod) = pods.get(c.pod_sandbox_id.as_str()) else {
                debug!(container = %c.id, "synchronized container without a known pod; skipped");
                continue;
            };
            let decision = self.decide_and_record(pod, c, None);
            let running = matches!(
                c.state.enum_value(),
                Ok(api::ContainerState::CONTAINER_RUNNING | api::ContainerState::CONTAINER_CREATED)
            );
            if !self.settings.adjust_existing || self.dry_run() || !running {
                continue;
            }
            let mut adjustment = decision.adjustment.clone();
            self.keep_relaxed_high(c, &mut adjustment);
            // oom_score_adj cannot travel in an update; the runtime applies
            // the rest through UpdateContainerResources.
            if let Some(u) = convert::update_to_wire(&c.id, &adjustment, true) {
                updates.push(u);
            }
        }
        self.notify_changed();
        let mut counters = lock(&self.counters);
        counters.synchronized += buf.containers.len() as u64;
        counters.updated += updates.len() as u64;
        info!(
            pods = buf.pods.len(),
            containers = buf.containers.len(),
            updates = updates.len(),
            "synchronized with the runtime"
        );
        if whole.dropped + skipped > 0 {
            warn!(
                dropped = whole.dropped,
                not_decided = skipped,
                "Synchronize was partial (see the reassembly bounds); the rest is handled as events arrive"
            );
        }
        updates
    }
}

/// What the registry keeps of a pod the runtime described.
fn pod_record(id: &str, facts: &qos::PodFacts) -> PodRecord {
    PodRecord {
        id: id.to_string(),
        uid: facts.uid.clone(),
        namespace: facts.namespace.clone(),
        name: facts.name.clone(),
        cgroup_parent: facts.cgroup_parent.clone(),
    }
}

/// The policy, or no adjustment at all should it ever panic. It is pure and
/// property-tested never to, but a panicking handler never answers, and the
/// runtime turns that into a failed container creation after its timeout:
/// a container without our values is the lesser harm.
fn decide_or_leave_alone(
    pod: &qos::PodFacts,
    container: &qos::ContainerFacts,
    node: &NodeFacts,
    policy: &PolicyConfig,
) -> qos::Decision {
    let run = std::panic::AssertUnwindSafe(|| qos::decide(pod, container, node, policy));
    std::panic::catch_unwind(run).unwrap_or_else(|_| {
        tracing::error!(
            pod = %format_args!("{}/{}", pod.namespace, pod.name),
            container = %container.name,
            "the QoS policy panicked (a bug: please report it with this line); leaving the container as the runtime made it"
        );
        qos::Decision {
            // Unknown to us; Burstable neither protects it nor ranks it first.
            class: QosClass::Burstable,
            reason: "policy failed; no adjustment".into(),
            memory_request: None,
            request_source: qos::RequestSource::Unknown,
            cpu_request_milli: 0,
            adjustment: qos::Adjustment::default(),
            notes: Vec::new(),
        }
    })
}

/// Per pod id, the protection nri-qos itself would give the pod cgroup: the
/// sum of its containers' memory.min/low under our policy, in whole pages.
pub fn own_pod_protection(
    containers: &[api::Container],
    pods: &HashMap<&str, &api::PodSandbox>,
    node: &NodeFacts,
    policy: &PolicyConfig,
) -> HashMap<String, Protection> {
    let mut sums: HashMap<String, Protection> = HashMap::new();
    for c in containers {
        let Some(pod) = pods.get(c.pod_sandbox_id.as_str()) else {
            continue;
        };
        let facts = convert::container_from_wire(c);
        let d = decide_or_leave_alone(&convert::pod_from_wire(pod), &facts, node, policy);
        let eff = qos::policy::effective(&facts.resources, &d.adjustment);
        let bytes = |k: &str| {
            eff.unified
                .get(k)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let e = sums.entry(c.pod_sandbox_id.clone()).or_default();
        e.min = e.min.saturating_add(bytes("memory.min"));
        e.low = e.low.saturating_add(bytes("memory.low"));
    }
    for p in sums.values_mut() {
        p.min -= p.min % PAGE_SIZE;
        p.low -= p.low % PAGE_SIZE;
    }
    sums
}

/// `base` with the drop-in's `[policy]` keys and `plugin.dry-run` on top.
/// The whole text is validated as a config file first (unknown keys and bad
/// values are errors that name them).
pub fn layer_drop_in(
    base: &PolicyConfig,
    base_dry_run: bool,
    text: &str,
) -> Result<(PolicyConfig, bool), String> {
    let origin = std::path::Path::new("<runtime drop-in config>");
    crate::config::Config::from_toml(text, origin).map_err(|e| e.to_string())?;
    let overlay: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut policy = toml::Table::try_from(base).map_err(|e| e.to_string())?;
    if let Some(toml::Value::Table(p)) = overlay.get("policy") {
        policy.extend(p.clone());
    }
    let policy: PolicyConfig = toml::Value::Table(policy)
        .try_into()
        .map_err(|e: toml::de::Error| e.to_string())?;
    policy.validate()?;
    let dry_run = overlay
        .get("plugin")
        .and_then(|p| p.get("dry-run"))
        .and_then(toml::Value::as_bool)
        .unwrap_or(base_dry_run);
    Ok((policy, dry_run))
}

/// A node-sized Synchronize decodes megabytes that are garbage right after;
/// glibc keeps such freed memory mapped unless asked to give it back.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn unimplemented<T>(method: &str) -> ttrpc::Result<T> {
    // UNIMPLEMENTED (not codegen's NOT_FOUND) makes NRI v0.12 runtimes fall
    // back to StateChange, the path every runtime version has.
    Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
        ttrpc::Code::UNIMPLEMENTED,
        format!("nri-qos handles {method} through StateChange"),
    )))
}

/// The timeout a request carries (`None`: the runtime sent none).
pub fn request_timeout(ctx: &TtrpcContext) -> Option<Duration> {
    u64::try_from(ctx.timeout_nano)
        .ok()
        .filter(|n| *n > 0)
        .map(Duration::from_nanos)
}

fn ms(v: i64) -> Option<Duration> {
    u64::try_from(v)
        .ok()
        .filter(|v| *v > 0)
        .map(Duration::from_millis)
}

#[async_trait]
impl Plugin for QosPlugin {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let info = RuntimeInfo {
            name: req.runtime_name.clone(),
            version: req.runtime_version.clone(),
            request_timeout: ms(req.request_timeout),
            registration_timeout: ms(req.registration_timeout),
            // Timeouts and the oom_score_adj adjustment both arrived in NRI v0.7.0.
            applies_oom_score_adj: req.request_timeout > 0 || req.registration_timeout > 0,
        };
        info!(
            runtime = %info.name,
            version = %info.version,
            request_timeout_ms = info.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT).as_millis() as u64,
            oom_score_adj_supported = info.applies_oom_score_adj,
            config_bytes = req.config.len(),
            "configured by the runtime"
        );
        *lock(&self.runtime) = Some(info);
        self.apply_runtime_config(&req.config);
        self.configured.send_replace(true);
        Ok(api::ConfigureResponse {
            events: EVENTS,
            ..Default::default()
        })
    }

    async fn synchronize(
        &self,
        ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        let timeout = request_timeout(ctx);
        let whole = lock(&self.sync).push(req, timeout, Instant::now());
        let Some(whole) = whole else {
            // Every chunk but the last must be answered with more=true and no
            // updates, or the runtime drops the plugin.
            return Ok(api::SynchronizeResponse {
                more: true,
                ..Default::default()
            });
        };
        let update = self.finish_sync(whole);
        release_freed_memory();
        Ok(api::SynchronizeResponse {
            update,
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        info!("runtime asked us to shut down");
        Ok(api::Empty::new())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        let started = Instant::now();
        let decision = self.decide_and_record(&req.pod, &req.container, None);
        let mut resp = api::CreateContainerResponse::new();
        let dry_run = self.dry_run();
        let mut counters = lock(&self.counters);
        counters.created += 1;
        if dry_run {
            info!(container = %req.container.name, adjustment = ?decision.adjustment, "dry run: adjustment not returned");
            self.record(decision.class, "dry_run", started);
            return Ok(resp);
        }
        if decision.adjustment.is_empty() {
            self.record(decision.class, "unchanged", started);
        } else {
            counters.adjusted += 1;
            self.record(decision.class, "applied", started);
        }
        resp.adjust = protobuf::MessageField::some(convert::adjustment_to_wire(
            &decision.adjustment,
            self.applies_oom_score_adj(),
        ));
        Ok(resp)
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        let decision =
            self.decide_and_record(&req.pod, &req.container, req.linux_resources.as_ref());
        let mut resp = api::UpdateContainerResponse::new();
        if self.dry_run() {
            return Ok(resp);
        }
        // Our update replaces the CRI request, so start from what was asked
        // and overlay the policy's values.
        let mut adj = decision.adjustment;
        if let Some(r) = req.linux_resources.as_ref() {
            let asked = convert::resources_from_wire(r);
            adj.cpu_shares = adj.cpu_shares.or(asked.cpu_shares);
            adj.cpu_quota = adj.cpu_quota.or(asked.cpu_quota);
            adj.cpu_period = adj.cpu_period.or(asked.cpu_period);
            adj.memory_limit = adj.memory_limit.or(asked.memory_limit);
            for (k, v) in asked.unified {
                adj.unified.entry(k).or_insert(v);
            }
        }
        if let Some(u) = convert::update_to_wire(&req.container.id, &adj, false) {
            lock(&self.counters).updated += 1;
            resp.update.push(u);
        }
        Ok(resp)
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        // A stopped container holds no memory: its protection leaves the
        // pod and QoS cgroups (the keeper lowers them on the change). The
        // runtime reports exits of killed containers here too.
        debug!(container = %req.container.id, "container stopped; forgetting its protection");
        self.forget_container(&req.container.id);
        Ok(api::StopContainerResponse::new())
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        match req.event.enum_value() {
            Ok(api::Event::POST_START_CONTAINER) => self.oom_fallback(&req.container),
            Ok(api::Event::REMOVE_CONTAINER) => self.forget_container(&req.container.id),
            Ok(api::Event::REMOVE_POD_SANDBOX) => self.forget_pod(&req.pod.id),
            Ok(api::Event::RUN_POD_SANDBOX) => {
                let facts = convert::pod_from_wire(&req.pod);
                self.kubelet_owns_pod(&req.pod.id, &facts, &self.live().policy);
                lock(&self.registry)
                    .pods
                    .insert(req.pod.id.clone(), pod_record(&req.pod.id, &facts));
                self.notify_changed();
            }
            other => debug!(event = ?other, "state change ignored"),
        }
        Ok(api::Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        _req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        unimplemented("RunPodSandbox")
    }
    async fn post_update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        _req: api::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::PostUpdatePodSandboxResponse> {
        unimplemented("PostUpdatePodSandbox")
    }
    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        _req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        unimplemented("StopPodSandbox")
    }
    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        _req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        unimplemented("RemovePodSandbox")
    }
    async fn post_create_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::PostCreateContainerRequest,
    ) -> ttrpc::Result<api::PostCreateContainerResponse> {
        unimplemented("PostCreateContainer")
    }
    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        unimplemented("StartContainer")
    }
    async fn post_start_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::PostStartContainerRequest,
    ) -> ttrpc::Result<api::PostStartContainerResponse> {
        unimplemented("PostStartContainer")
    }
    async fn post_update_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::PostUpdateContainerRequest,
    ) -> ttrpc::Result<api::PostUpdateContainerResponse> {
        unimplemented("PostUpdateContainer")
    }
    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        _req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        unimplemented("RemoveContainer")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drop_in_overrides_only_the_keys_it_sets() {
        use crate::qos::{Reservation, WeightConversion};
        let base = PolicyConfig {
            memory_reservation: Reservation::Min,
            memory_throttling_factor: 0.8,
            ..Default::default()
        };
        let (p, dry) = layer_drop_in(&base, true, "[policy]\ncpu-weight = \"linear\"\n").unwrap();
        assert_eq!(p.cpu_weight, WeightConversion::Linear);
        assert_eq!(p.memory_reservation, Reservation::Min, "kept from the file");
        assert_eq!(p.memory_throttling_factor, 0.8);
        assert!(dry, "dry-run kept when the drop-in does not say");
        let (_, dry) = layer_drop_in(&base, true, "[plugin]\ndry-run = false\n").unwrap();
        assert!(!dry);
        assert!(
            layer_drop_in(&base, false, "[policy]\ncpu-wieght = \"linear\"\n")
                .unwrap_err()
                .contains("cpu-wieght")
        );
        assert!(layer_drop_in(&base, false, "[policy]\nmemory-throttling-factor = 7.0\n").is_err());
    }

    fn kubelet_pod(root: &std::path::Path, id: &str, low: u64) -> api::PodSandbox {
        let cg = root.join(format!("kubepods/burstable/pod{id}"));
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("memory.min"), "0").unwrap();
        std::fs::write(cg.join("memory.low"), low.to_string()).unwrap();
        let mut linux = api::LinuxPodSandbox::new();
        linux.cgroup_parent = format!("/kubepods/burstable/pod{id}");
        api::PodSandbox {
            id: id.into(),
            name: id.into(),
            linux: protobuf::MessageField::some(linux),
            ..Default::default()
        }
    }

    /// A Burstable 64Mi → 512Mi container as containerd < 2.2 shows it: no
    /// `unified`, the kubelet's oom_score_adj (997 on 16 GiB).
    fn hidden_container(id: &str, pod: &str) -> api::Container {
        let mut mem = api::LinuxMemory::new();
        mem.limit = protobuf::MessageField::some(api::OptionalInt64 {
            value: 512 << 20,
            ..Default::default()
        });
        let mut res = api::LinuxResources::new();
        res.memory = protobuf::MessageField::some(mem);
        let mut linux = api::LinuxContainer::new();
        linux.resources = protobuf::MessageField::some(res);
        linux.oom_score_adj = protobuf::MessageField::some(api::OptionalInt {
            value: 997,
            ..Default::default()
        });
        api::Container {
            id: id.into(),
            pod_sandbox_id: pod.into(),
            name: "app".into(),
            state: protobuf::EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING),
            linux: protobuf::MessageField::some(linux),
            ..Default::default()
        }
    }

    fn plugin(root: &std::path::Path) -> QosPlugin {
        QosPlugin::new(PluginSettings {
            policy: PolicyConfig::default(),
            node: NodeFacts {
                memory_capacity: 16 << 30,
                memory_allocatable: 15 << 30,
                page_size: 4096,
                cgroup_v2: true,
            },
            dry_run: false,
            adjust_existing: true,
            proc_root: "/nonexistent".into(),
            cgroup_root: root.to_path_buf(),
        })
    }

    #[test]
    fn a_pod_the_kubelet_protected_before_its_sandbox_keeps_the_kubelets_values() {
        let dir = tempfile::tempdir().unwrap();
        let p = plugin(dir.path());
        let policy = p.live().policy;
        // First sight (RunPodSandbox): the kubelet's memory.low is already there.
        let kp = kubelet_pod(dir.path(), "k", 64 << 20);
        assert!(p.kubelet_owns_pod("k", &convert::pod_from_wire(&kp), &policy));
        let d = p.decide_and_record(&kp, &hidden_container("c1", "k"), None);
        for key in ["memory.min", "memory.low", "memory.high"] {
            assert!(!d.adjustment.unified.contains_key(key), "{key}: {d:?}");
        }
        assert!(lock(&p.registry).containers["c1"].kubelet_memory_qos);
        // A pod with nothing in its cgroup is ours, as before.
        let ours = kubelet_pod(dir.path(), "n", 0);
        assert!(!p.kubelet_owns_pod("n", &convert::pod_from_wire(&ours), &policy));
        let d = p.decide_and_record(&ours, &hidden_container("c2", "n"), None);
        assert!(d.adjustment.unified.contains_key("memory.low"), "{d:?}");

        // A restarted plugin reaches the same decision from the tree: the
        // kubelet's 64Mi is above our 49.2Mi estimate; our own value is not.
        std::fs::write(
            dir.path().join("kubepods/burstable/podn/memory.low"),
            "51380224",
        )
        .unwrap();
        let p2 = plugin(dir.path());
        let updates = p2.finish_sync(Complete {
            snapshot: super::super::reassembly::Snapshot {
                pods: vec![kp, ours],
                containers: vec![hidden_container("c1", "k"), hidden_container("c2", "n")],
            },
            ..Default::default()
        });
        let reg = lock(&p2.registry);
        assert!(reg.containers["c1"].kubelet_memory_qos);
        assert!(!reg.containers["c2"].kubelet_memory_qos);
        assert_eq!(reg.owners.len(), 1, "{:?}", reg.owners);
        drop(reg);
        let touched: Vec<&str> = updates.iter().map(|u| u.container_id.as_str()).collect();
        assert!(
            updates.iter().filter(|u| u.container_id == "c1").all(|u| u
                .linux
                .resources
                .as_ref()
                .is_none_or(|r| !r.unified.contains_key("memory.low")
                    && !r.unified.contains_key("memory.high"))),
            "{touched:?}"
        );
    }

    #[test]
    fn event_mask_is_accepted_by_nri_v0_6_runtimes() {
        assert_eq!(EVENTS & !0x7FF, 0, "mask {EVENTS:#x}");
        // CreateContainer, UpdateContainer and PostStartContainer are the ones we act on.
        assert_ne!(EVENTS & 0x8, 0);
        assert_ne!(EVENTS & 0x80, 0);
        assert_ne!(EVENTS & 0x40, 0);
    }
}
