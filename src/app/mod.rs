//! The commands' wiring: each loads its configuration through
//! [`crate::config`] and starts its tasks. `main` only parses the command
//! line and calls one of these.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{self, Config, Launch, MonitorArgs, RunArgs};
use crate::node::registry::PodRegistry;
use crate::node::relax::{RelaxVia, Relaxer};
use crate::node::NodeFacts;
use crate::nri::{Identity, PluginSettings, QosPlugin, Transport};

mod error;
mod tools;
mod watchers;

pub use error::{AppError, Context};
pub use tools::{run_audit, run_explain, AuditArgs, ExplainArgs};

/// One thread is plenty: the loops sleep in epoll and run I/O on the
/// blocking pool (the NRI trunk, the guard and the monitor have their own
/// threads).
fn runtime() -> Result<tokio::runtime::Runtime, AppError> {
    one_malloc_arena();
    large_allocations_mapped();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// glibc gives each thread that allocates an arena of its own; the NRI
/// trunk thread's kept ~0.5 MiB more resident after a Synchronize. Our
/// threads take turns rather than contend, so they share one.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before the
    // runtime starts any thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// glibc serves an allocation of 128 KiB or more with a mapping of its
/// own, returned on free, but raises that threshold to the largest one
/// freed (up to 32 MiB), after which a Synchronize's 4 MiB messages and
/// its held buffer come from the heap and stay resident after it. Fixed
/// at its default, they always go back.
fn large_allocations_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before the
    // runtime starts any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

/// `nri-qos monitor`: the node memory-pressure monitor, with the throttle
/// guard beside it unless `[throttle] enabled = false`, outside the plugin.
pub fn run_monitor(args: MonitorArgs) -> Result<(), AppError> {
    use crate::pressure;
    let settings = args
        .resolve(config::process_env())
        .context("monitor configuration")?;
    crate::observability::init(
        settings.log_format,
        &settings.log_level,
        None,
        crate::observability::Journal::Off,
    )
    .context("setting up logging")?;
    crate::node::require_cgroup_v2("the pressure monitor", &settings.paths.cgroup_root)?;
    if settings.throttle.relax_via == RelaxVia::Runtime {
        tracing::warn!("throttle.relax-via = \"runtime\" needs the plugin's NRI session; the monitor alone writes the cgroup file");
    }
    if args.once {
        print!("{}", pressure::cli::once(settings.monitor, settings.paths)?);
        return Ok(());
    }
    let watchers = watchers::Watchers {
        guard: settings.throttle.enabled.then_some(settings.throttle),
        evict: (&settings.monitor).into(),
        tree: settings.monitor.pod_tree(&settings.paths),
        monitor: Some((settings.monitor, settings.paths)),
        pods: Arc::new(crate::node::registry::NoPods),
        cluster: None,
        metrics: None,
        relaxer: Arc::new(crate::guard::FileRelaxer),
    };
    let (guard, monitor) = watchers.tasks();
    runtime()?.block_on(async move {
        tokio::select! {
            r = watchers::until_stopped(monitor) => r.context("monitor"),
            r = watchers::until_stopped(guard) => r.context("throttle guard"),
            _ = shutdown_signal() => Ok(()),
        }
    })
}

/// `nri-qos run` (and no command): the NRI plugin with its tasks.
pub fn run_plugin(args: RunArgs) -> Result<(), AppError> {
    let launch = Launch::from_process();
    let prelaunched = launch.socket_fd.is_some();
    let cfg = Config::for_plugin(&args, config::process_env(), &launch)
        .map_err(|e| refused_to_start(e, prelaunched))?;
    init_logging(&cfg, prelaunched)?;
    let transport = transport(&launch, &cfg)?;
    let identity = Identity::new(&cfg.plugin.name, &cfg.plugin.index)?;
    let node = crate::node::read_node_facts(
        &cfg.node.proc_root,
        &cfg.node.cgroup_root,
        cfg.node.memory_allocatable,
    )?;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        name = %identity.name,
        index = %identity.index,
        transport = ?transport,
        memory_capacity = node.memory_capacity,
        cgroup_v2 = node.cgroup_v2,
        dry_run = cfg.plugin.dry_run,
        with_monitor = cfg.plugin.with_monitor,
        throttle_guard = cfg.throttle.enabled,
        "nri-qos starting"
    );
    let (plugin, kube) = build_plugin(&cfg, node);
    runtime()?.block_on(async move {
        start_tasks(&cfg, &plugin, kube.as_ref(), node);
        if !prelaunched {
            await_api_pods(kube.as_ref()).await;
        }
        tokio::select! {
            r = crate::nri::session::run(transport, plugin, identity) => r.map_err(AppError::from),
            _ = shutdown_signal() => {
                tracing::info!("signal received; exiting");
                Ok(())
            }
        }
    })
}

/// The configuration was refused: said on stderr (by `main`) and, for a
/// pre-launched plugin, whose stderr the runtime discards, in the journal
/// too, before the process exits. The node then runs without the plugin:
/// the runtime's values, and no memory.high at all.
fn refused_to_start(e: config::ConfigError, prelaunched: bool) -> AppError {
    if prelaunched {
        let journal = crate::observability::Journal::IfPresent;
        if crate::observability::init(crate::observability::LogFormat::Text, "info", None, journal)
            .is_ok()
        {
            tracing::error!(error = %e, "nri-qos refuses to start: its configuration is not valid; the runtime runs containers without it");
        }
    }
    AppError::from(e)
}

fn init_logging(cfg: &Config, prelaunched: bool) -> Result<(), AppError> {
    crate::observability::init(
        cfg.plugin.log_format,
        &cfg.plugin.log_level,
        cfg.plugin.log_file.as_deref(),
        // The runtime discards a pre-launched plugin's stderr.
        if prelaunched {
            crate::observability::Journal::IfPresent
        } else {
            crate::observability::Journal::Off
        },
    )
    .context("setting up logging")
}

/// The socket the runtime handed a pre-launched plugin, else the one to
/// connect to.
fn transport(launch: &Launch, cfg: &Config) -> Result<Transport, AppError> {
    let Some(fd) = &launch.socket_fd else {
        return Ok(Transport::Socket(cfg.plugin.socket.clone()));
    };
    let fd: i32 = fd
        .parse()
        .with_context(|| format!("NRI_PLUGIN_SOCKET={fd:?} is not a file descriptor"))?;
    if fd < 0 {
        return Err(AppError::Usage(format!(
            "NRI_PLUGIN_SOCKET={fd} is not a file descriptor"
        )));
    }
    Ok(Transport::InheritedFd(fd))
}

/// The plugin, with the API source's pods when that source starts.
/// How long an external plugin waits for the API server's first list of
/// pods before it registers: the runtime's existing containers are decided
/// once, at Synchronize, and with the list they get the exact requests.
/// A pre-launched plugin must register within the runtime's timeout and
/// does not wait.
const API_PODS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

async fn await_api_pods(kube: Option<&crate::kube::Kube>) {
    let Some(k) = kube else { return };
    let started = std::time::Instant::now();
    if k.store().first_list(API_PODS_WAIT).await {
        tracing::info!(
            waited = ?started.elapsed(),
            "registering with the API server's pods listed"
        );
    } else {
        tracing::warn!(
            waited_s = API_PODS_WAIT.as_secs(),
            "registering before the API server's first list: running containers keep the runtime's facts until they are updated"
        );
    }
}

fn build_plugin(cfg: &Config, node: NodeFacts) -> (Arc<QosPlugin>, Option<crate::kube::Kube>) {
    let mut plugin = QosPlugin::new(PluginSettings {
        policy: cfg.policy.clone(),
        node,
        dry_run: cfg.plugin.dry_run,
        adjust_existing: cfg.plugin.adjust_existing,
        proc_root: cfg.node.proc_root.clone(),
        cgroup_root: cfg.node.cgroup_root.clone(),
    })
    .with_sync_budget(cfg.plugin.sync_budget_bytes())
    .with_drop_in(config::drop_in_layer(cfg));
    // Optional and never required: without credentials, or when they do not
    // work, the plugin runs on the runtime's facts alone.
    let kube = match crate::kube::start(&cfg.kubernetes, Some(plugin.metrics())) {
        Ok(k) => k,
        Err(e) => {
            tracing::error!(error = %e, "Kubernetes API source not started; running on the runtime's pod facts alone");
            None
        }
    };
    if let Some(k) = &kube {
        plugin = plugin.with_api_pods(k.store());
    }
    (Arc::new(plugin), kube)
}

/// The plugin's tasks beside its NRI session: the metrics endpoint, the
/// hierarchy keeper, the throttle guard and the node-pressure monitor.
fn start_tasks(
    cfg: &Config,
    plugin: &Arc<QosPlugin>,
    kube: Option<&crate::kube::Kube>,
    node: NodeFacts,
) {
    if cfg.metrics.enabled {
        // Same thread as the NRI session: a wedged session fails /healthz too.
        let metrics = plugin.metrics();
        let addr = cfg.metrics.address;
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(addr, metrics).await {
                tracing::error!(error = %e, "metrics endpoint stopped");
            }
        });
    }
    if cfg.hierarchy.enabled && node.cgroup_v2 && !cfg.plugin.dry_run {
        let keeper = crate::keeper::Keeper::new(
            cfg.node.cgroup_root.clone(),
            cfg.hierarchy.clone(),
            node.memory_capacity,
        );
        tokio::spawn(crate::keeper::run(
            keeper,
            plugin.registry(),
            plugin.subscribe_changes(),
            Duration::from_secs(cfg.hierarchy.resync_seconds.max(1)),
            Some(plugin.metrics()),
        ));
    }
    if !node.cgroup_v2 {
        tracing::warn!("{}", crate::node::cgroup_v1_notice(&cfg.node.cgroup_root));
    }
    let watched = "the throttle guard and the pressure monitor";
    match crate::node::require_cgroup_v2(watched, &cfg.node.cgroup_root) {
        Ok(()) => start_watchers(cfg, plugin, kube),
        Err(e) => tracing::error!(error = %e, "throttle guard and pressure monitor not started"),
    }
}

/// The throttle guard (unless `[throttle] enabled = false`) and the
/// node-pressure monitor (`with-monitor`), fed the plugin's pods.
fn start_watchers(cfg: &Config, plugin: &Arc<QosPlugin>, kube: Option<&crate::kube::Kube>) {
    let (relaxer, relax_task) = throttle_relaxer(cfg.throttle.relax_via);
    let mut w = watchers::Watchers::from_config(cfg, cfg.plugin.with_monitor, relaxer);
    if !w.any() {
        tracing::warn!(
            "neither the throttle guard nor the node-pressure monitor runs in this process"
        );
        return;
    }
    if let Some(task) = relax_task.filter(|_| w.guard.is_some()) {
        tokio::spawn(task);
    }
    // The API server's facts (exact request, priority, static pods) first;
    // the runtime's for pods it does not know (yet).
    let pods: Arc<dyn PodRegistry> = plugin.registry();
    w.pods = match kube {
        Some(k) => Arc::new(crate::node::registry::Layered(vec![k.store(), pods])),
        None => pods,
    };
    w.cluster =
        kube.map(|k| Arc::new(k.clone()) as Arc<dyn crate::node::cluster::ClusterEvictions>);
    w.metrics = cfg.metrics.enabled.then(|| plugin.metrics());
    watchers::spawn(w.tasks());
}

/// The throttle guard's relax route (`[throttle] relax-via`): the cgroup
/// file, unless the operator opted into the runtime's UpdateContainers
/// (deadlock-prone before containerd/nri#301, see [`RelaxVia`]), which
/// needs its task spawned on the plugin's runtime.
fn throttle_relaxer(via: RelaxVia) -> (Arc<dyn Relaxer>, Option<impl Future<Output = ()>>) {
    let file = Arc::new(crate::guard::FileRelaxer);
    match via {
        RelaxVia::CgroupFile => (file, None),
        RelaxVia::Runtime => {
            let (relaxer, task) = crate::nri::relax::relaxer(file);
            (Arc::new(relaxer), Some(task))
        }
    }
}

/// `nri-qos check-config FILE`: the effective configuration as TOML.
pub fn check_config(file: &std::path::Path) -> Result<(), AppError> {
    let cfg = Config::load(file)?;
    cfg.check_guarded()?;
    println!(
        "{}",
        toml::to_string_pretty(&cfg).context("rendering config")?
    );
    eprintln!("{}: ok", file.display());
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::relax::RelaxRequest;

    fn container() -> (tempfile::TempDir, RelaxRequest) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("memory.high"), "247463936\n").unwrap();
        let r = RelaxRequest {
            container_id: "abc".into(),
            cgroup: dir.path().to_path_buf(),
            value: "268435456".into(),
        };
        (dir, r)
    }

    /// By default nothing goes to the runtime: no UpdateContainers task,
    /// and the relax is the cgroup file's new value.
    #[test]
    fn throttle_relax_defaults_to_the_cgroup_file() {
        let via = crate::guard::ThrottleConfig::default().relax_via;
        assert_eq!(via, RelaxVia::CgroupFile);
        let (relaxer, task) = throttle_relaxer(via);
        assert!(task.is_none());
        let (dir, r) = container();
        assert_eq!(relaxer.relax(&r).unwrap(), "cgroup-file");
        let v = std::fs::read_to_string(dir.path().join("memory.high")).unwrap();
        assert_eq!(v.trim(), "268435456");
    }

    /// Only the explicit opt-in builds the UpdateContainers route.
    #[test]
    fn throttle_relax_via_runtime_is_opt_in() {
        let cfg: crate::guard::ThrottleConfig = crate::guard::ThrottleConfig::from_toml(
            "[throttle]\nrelax-via = \"runtime\"\n",
            "test",
        )
        .unwrap();
        assert_eq!(cfg.relax_via, RelaxVia::Runtime);
        let (_relaxer, task) = throttle_relaxer(cfg.relax_via);
        assert!(task.is_some());
        let bad = crate::guard::ThrottleConfig::from_toml(
            "[throttle]\nrelax-via = \"update-containers\"\n",
            "test",
        );
        assert!(bad.unwrap_err().to_string().contains("relax-via"));
    }
}
