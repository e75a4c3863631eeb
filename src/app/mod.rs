//! The commands' wiring: each loads its configuration through
//! [`crate::config`] and starts its tasks. `main` only parses the command
//! line and calls one of these.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{self, Config, Launch, MonitorArgs, RunArgs};
use crate::node::relax::{RelaxVia, Relaxer};
use crate::nri::{Identity, PluginSettings, QosPlugin, Transport};

mod error;
mod tools;

pub use error::{AppError, Context};
pub use tools::{run_audit, run_explain, AuditArgs, ExplainArgs};

/// One thread is plenty: the loops sleep in epoll and run I/O on the
/// blocking pool (the NRI trunk and the monitor have their own threads).
fn runtime() -> Result<tokio::runtime::Runtime, AppError> {
    one_malloc_arena();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// glibc gives each thread that allocates an arena of its own; the NRI
/// trunk thread's kept ~0.5 MiB more resident after a Synchronize (issue
/// 17). Our threads take turns rather than contend, so they share one.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before the
    // runtime starts any thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// `nri-qos monitor`: the node memory-pressure monitor alone.
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
    let (cfg, paths) = (settings.monitor, settings.paths);
    crate::node::require_cgroup_v2("the pressure monitor", &paths.cgroup_root)?;
    if cfg.throttle.relax_via == RelaxVia::Runtime {
        tracing::warn!("throttle.relax-via = \"runtime\" needs the plugin's NRI session; the monitor alone writes the cgroup file");
    }
    if args.once {
        print!("{}", pressure::cli::once(cfg, paths)?);
        return Ok(());
    }
    runtime()?.block_on(async {
        tokio::select! {
            r = pressure::run(cfg, paths, Arc::new(crate::node::registry::NoPods)) => r.context("monitor"),
            _ = shutdown_signal() => Ok(()),
        }
    })
}

/// `nri-qos run` (and no command): the NRI plugin with its optional tasks.
pub fn run_plugin(args: RunArgs) -> Result<(), AppError> {
    let launch = Launch::from_process();
    let cfg = Config::for_plugin(&args, config::process_env(), &launch)?;
    let prelaunched = launch.socket_fd.is_some();
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
    .context("setting up logging")?;

    let transport = match launch.socket_fd {
        Some(fd) => {
            let fd: i32 = fd
                .parse()
                .with_context(|| format!("NRI_PLUGIN_SOCKET={fd:?} is not a file descriptor"))?;
            if fd < 0 {
                return Err(AppError::Usage(format!(
                    "NRI_PLUGIN_SOCKET={fd} is not a file descriptor"
                )));
            }
            Transport::InheritedFd(fd)
        }
        None => Transport::Socket(cfg.plugin.socket.clone()),
    };
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
        "nri-qos starting"
    );
    let mut plugin = QosPlugin::new(PluginSettings {
        policy: cfg.policy.clone(),
        node,
        dry_run: cfg.plugin.dry_run,
        adjust_existing: cfg.plugin.adjust_existing,
        proc_root: cfg.node.proc_root.clone(),
        cgroup_root: cfg.node.cgroup_root.clone(),
    })
    .with_sync_budget(cfg.plugin.sync_budget_bytes())
    .with_drop_in(config::drop_in_layer(
        cfg.policy.clone(),
        cfg.plugin.dry_run,
    ));
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
    let plugin = Arc::new(plugin);

    runtime()?.block_on(async move {
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
        let with_monitor = cfg.plugin.with_monitor
            && crate::node::require_cgroup_v2("the pressure monitor", &cfg.node.cgroup_root)
                .map_err(|e| tracing::error!(error = %e, "pressure monitor not started"))
                .is_ok();
        if with_monitor {
            let pods: Arc<dyn crate::node::registry::PodRegistry> = plugin.registry();
            let paths = cfg.monitor_paths();
            let monitor_cfg = cfg.monitor_config();
            let metrics = cfg.metrics.enabled.then(|| plugin.metrics());
            // The API server's facts (exact request, priority, static pods)
            // first; the runtime's for pods it does not know (yet).
            let registry: Arc<dyn crate::node::registry::PodRegistry> = match &kube {
                Some(k) => Arc::new(crate::node::registry::Layered(vec![k.store(), pods])),
                None => pods,
            };
            let cluster = kube
                .clone()
                .map(|k| Arc::new(k) as Arc<dyn crate::node::cluster::ClusterEvictions>);
            let via = monitor_cfg.throttle.relax_via;
            let (relaxer, relax_task) = throttle_relaxer(via);
            if let Some(task) = relax_task {
                tokio::spawn(task);
            }
            tracing::info!(relax_via = ?via, "throttle guard relaxes memory.high this way");
            tokio::spawn(async move {
                if let Err(e) = crate::pressure::run_in_plugin(
                    monitor_cfg,
                    paths,
                    registry,
                    metrics,
                    cluster,
                    relaxer,
                )
                .await
                {
                    tracing::error!(error = %e, "pressure monitor stopped");
                }
            });
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

/// The throttle guard's relax route (`[throttle] relax-via`): the cgroup
/// file, unless the operator opted into the runtime's UpdateContainers
/// (deadlock-prone before containerd/nri#301, see [`RelaxVia`]), which
/// needs its task spawned on the plugin's runtime.
fn throttle_relaxer(via: RelaxVia) -> (Arc<dyn Relaxer>, Option<impl Future<Output = ()>>) {
    let file = Arc::new(crate::pressure::throttle::FileRelaxer);
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
        let via = crate::pressure::throttle::ThrottleConfig::default().relax_via;
        assert_eq!(via, RelaxVia::CgroupFile);
        let (relaxer, task) = throttle_relaxer(via);
        assert!(task.is_none());
        let (dir, r) = container();
        assert_eq!(relaxer.relax(&r), Ok("cgroup-file"));
        let v = std::fs::read_to_string(dir.path().join("memory.high")).unwrap();
        assert_eq!(v.trim(), "268435456");
    }

    /// Only the explicit opt-in builds the UpdateContainers route.
    #[test]
    fn throttle_relax_via_runtime_is_opt_in() {
        let cfg: crate::pressure::throttle::ThrottleConfig =
            crate::pressure::throttle::ThrottleConfig::from_toml(
                "[throttle]\nrelax-via = \"runtime\"\n",
                "test",
            )
            .unwrap();
        assert_eq!(cfg.relax_via, RelaxVia::Runtime);
        let (_relaxer, task) = throttle_relaxer(cfg.relax_via);
        assert!(task.is_some());
        let bad = crate::pressure::throttle::ThrottleConfig::from_toml(
            "[throttle]\nrelax-via = \"update-containers\"\n",
            "test",
        );
        assert!(bad.unwrap_err().to_string().contains("relax-via"));
    }
}
