//! `nri-qos`: the NRI plugin (default command), plus tools.
//!
//! Pre-launched by the runtime it gets no arguments and only the
//! `NRI_PLUGIN_NAME`, `NRI_PLUGIN_IDX` and `NRI_PLUGIN_SOCKET` variables.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use nri_qos::config::{Config, DEFAULT_CONFIG_PATH};
use nri_qos::nri::{Identity, PluginSettings, QosPlugin, Transport};

#[derive(Parser, Debug)]
#[command(
    name = "nri-qos",
    version,
    about = "Kubernetes QoS made real in the kernel, through NRI"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the NRI plugin (the default when no command is given).
    Run(RunArgs),
    /// Print every kernel value a Pod manifest will get on a node.
    Explain(ExplainArgs),
    /// Compare what the policy wants with the node's real cgroup values.
    /// Exits with status 1 when any value drifts.
    Audit(AuditArgs),
    /// Run the node memory-pressure monitor alone (see also `plugin.with-monitor`).
    Monitor(nri_qos::pressure::cli::MonitorArgs),
    /// Validate a config file and print the effective configuration.
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
    /// Probe the local metrics endpoint's /healthz (for exec liveness probes).
    Health {
        /// Metrics address to probe.
        #[arg(long, default_value = nri_qos::config::DEFAULT_METRICS_ADDRESS)]
        address: std::net::SocketAddr,
        /// Give up after this many seconds (1..=3600).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout_seconds: u64,
    },
}

#[derive(Args, Debug, Default)]
struct RunArgs {
    /// Config file (default: /etc/nri-qos/nri-qos.toml when it exists).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Runtime NRI socket to connect to (external mode).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Plugin name to register with.
    #[arg(long)]
    name: Option<String>,
    /// Two-digit plugin index.
    #[arg(long)]
    index: Option<String>,
    /// Compute and log adjustments without returning them.
    #[arg(long)]
    dry_run: bool,
    /// Log format: text or json.
    #[arg(long)]
    log_format: Option<String>,
    /// Log level or tracing filter.
    #[arg(long)]
    log_level: Option<String>,
}

#[derive(Args, Debug)]
struct ExplainArgs {
    /// The Pod manifest (YAML), or - for standard input.
    manifest: PathBuf,
    /// Node memory capacity (MemTotal), a Kubernetes quantity.
    #[arg(long, default_value = "16Gi")]
    node_memory: String,
    /// Node allocatable memory (default: the node memory).
    #[arg(long)]
    node_allocatable: Option<String>,
    /// Node CPUs (informational; the kubepods cgroup's share).
    #[arg(long, default_value = "8")]
    node_cpus: String,
    /// cgroup driver: cgroupfs or systemd.
    #[arg(long, default_value = "cgroupfs")]
    cgroup_driver: String,
    /// Page size in bytes.
    #[arg(long, default_value_t = 4096)]
    page_size: u64,
    /// Explain for a cgroup v1 node.
    #[arg(long)]
    cgroup_v1: bool,
    /// Output: table or json.
    #[arg(long, default_value = "table")]
    output: String,
    /// Config file whose [policy] to use (default: the built-in defaults).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The kubelet's version: its Memory QoS defaults (factor 0.9 before 1.37, none from 1.37).
    #[arg(long, default_value = "1.37")]
    kubelet_version: String,
    /// The kubelet's Memory QoS: none, alpha (1.27-1.35) or tiered (1.36+ TieredReservation).
    #[arg(long, default_value = "none")]
    kubelet_memory_qos: String,
    /// The kubelet's memoryThrottlingFactor (memory.high), in (0, 1].
    #[arg(long)]
    memory_throttling_factor: Option<f64>,
}

fn run_explain(args: ExplainArgs) -> anyhow::Result<()> {
    use nri_qos::qos::explain::{self, Driver, NodeSpec};
    use nri_qos::qos::quantity::{parse_bytes, parse_milli};
    let cfg = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let memory = parse_bytes(&args.node_memory).context("--node-memory")?;
    if memory == 0 {
        bail!("--node-memory must be more than 0");
    }
    let allocatable = match &args.node_allocatable {
        Some(a) => parse_bytes(a).context("--node-allocatable")?,
        None => memory,
    };
    if allocatable == 0 {
        bail!("--node-allocatable must be more than 0");
    }
    parse_milli(&args.node_cpus).context("--node-cpus")?;
    let driver = match args.cgroup_driver.as_str() {
        "cgroupfs" => Driver::Cgroupfs,
        "systemd" => Driver::Systemd,
        other => bail!("--cgroup-driver must be cgroupfs or systemd, not {other:?}"),
    };
    if !matches!(args.output.as_str(), "table" | "json") {
        bail!("--output must be table or json, not {:?}", args.output);
    }
    let yaml = if args.manifest.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the manifest from stdin")?
    } else {
        std::fs::read_to_string(&args.manifest)
            .with_context(|| format!("reading {}", args.manifest.display()))?
    };
    let node = NodeSpec {
        memory_capacity: memory,
        memory_allocatable: allocatable.min(memory),
        page_size: args.page_size.max(1),
        driver,
        cgroup_v2: !args.cgroup_v1,
    };
    let mode = match args.kubelet_memory_qos.as_str() {
        "none" => explain::KubeletMode::None,
        "alpha" => explain::KubeletMode::Alpha,
        "tiered" => explain::KubeletMode::Tiered,
        other => bail!("--kubelet-memory-qos must be none, alpha or tiered, not {other:?}"),
    };
    let kubelet = explain::KubeletMemoryQosSim::for_version(
        &args.kubelet_version,
        Some(mode),
        args.memory_throttling_factor,
    )
    .map_err(anyhow::Error::msg)
    .context("--kubelet-version / --kubelet-memory-qos / --memory-throttling-factor")?;
    let report = explain::explain_with(&yaml, &node, &cfg.policy, &kubelet)
        .with_context(|| format!("explaining {}", args.manifest.display()))?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", explain::render_table(&report));
    }
    Ok(())
}

#[derive(Args, Debug)]
struct AuditArgs {
    /// Config file (default: /etc/nri-qos/nri-qos.toml when it exists).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Runtime NRI socket to take the pod list from.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Output: table or json.
    #[arg(long, default_value = "table")]
    output: String,
    /// How long to wait for the runtime's Synchronize (1..=3600 seconds).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout_seconds: u64,
}

fn run_audit(args: AuditArgs) -> anyhow::Result<()> {
    let mut cfg = load_config(args.config.as_deref())?;
    if let Some(s) = args.socket {
        cfg.plugin.socket = s;
    }
    if !matches!(args.output.as_str(), "table" | "json") {
        bail!("--output must be table or json, not {:?}", args.output);
    }
    let node = nri_qos::node::read_node_facts(
        &cfg.node.proc_root,
        &cfg.node.cgroup_root,
        cfg.node.memory_allocatable,
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let snap = rt.block_on(nri_qos::audit::collect(
        &cfg.plugin.socket,
        std::time::Duration::from_secs(args.timeout_seconds),
    ))?;
    let report = nri_qos::audit::audit(
        &snap,
        &node,
        &cfg.policy,
        &cfg.hierarchy,
        &cfg.node.cgroup_root,
        &cfg.node.proc_root,
    );
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", nri_qos::audit::render_table(&report));
    }
    if report.drift > 0 {
        std::process::exit(1);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        None => run_plugin(RunArgs::default()),
        Some(Command::Run(args)) => run_plugin(args),
        Some(Command::Audit(args)) => run_audit(args),
        Some(Command::Explain(args)) => run_explain(args),
        Some(Command::Monitor(args)) => run_monitor(args),
        Some(Command::CheckConfig { file }) => {
            let cfg = Config::load(&file)?;
            println!(
                "{}",
                toml::to_string_pretty(&cfg).context("rendering config")?
            );
            eprintln!("{}: ok", file.display());
            Ok(())
        }
        Some(Command::Health {
            address,
            timeout_seconds,
        }) => {
            nri_qos::metrics::check_health(
                address,
                std::time::Duration::from_secs(timeout_seconds.max(1)),
            )?;
            println!("ok");
            Ok(())
        }
    }
}

fn run_monitor(args: nri_qos::pressure::cli::MonitorArgs) -> anyhow::Result<()> {
    use nri_qos::pressure::{self, cli::LogFormat};
    let format = match args.log_format {
        LogFormat::Json => "json",
        LogFormat::Text => "text",
    };
    nri_qos::observability::init(format, "info", None, nri_qos::observability::Journal::Off)
        .context("setting up logging")?;
    let (cfg, paths) = args.resolve().context("monitor configuration")?;
    if args.once {
        print!("{}", pressure::cli::once(cfg, paths)?);
        return Ok(());
    }
    // One thread is plenty: the loop sleeps in epoll and runs I/O on the
    // blocking pool.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        tokio::select! {
            r = pressure::run(cfg, paths, Arc::new(nri_qos::node::registry::NoPods)) => r.context("monitor"),
            _ = shutdown_signal() => Ok(()),
        }
    })
}

/// `NRI_QOS_*` variables of this process, as strings (non-UTF-8 lossily).
fn process_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    })
}

fn load_config(explicit: Option<&Path>) -> anyhow::Result<Config> {
    match explicit {
        Some(p) => Ok(Config::load(p)?),
        None if Path::new(DEFAULT_CONFIG_PATH).is_file() => {
            Ok(Config::load(Path::new(DEFAULT_CONFIG_PATH))?)
        }
        None => Ok(Config::default()),
    }
}

fn run_plugin(args: RunArgs) -> anyhow::Result<()> {
    // Layers: defaults, file, NRI_QOS_* environment, flags.
    let config_path = args
        .config
        .clone()
        .or_else(|| std::env::var_os("NRI_QOS_CONFIG").map(PathBuf::from));
    let mut cfg = load_config(config_path.as_deref())?;
    cfg.apply_env(process_env())?;
    if let Some(s) = args.socket {
        cfg.plugin.socket = s;
    }
    if let Some(n) = args.name {
        cfg.plugin.name = n;
    }
    if let Some(i) = args.index {
        cfg.plugin.index = i;
    }
    if let Some(f) = args.log_format {
        cfg.plugin.log_format = f;
    }
    if let Some(l) = args.log_level {
        cfg.plugin.log_level = l;
    }
    cfg.plugin.dry_run |= args.dry_run;

    // Pre-launched: the runtime names us and hands over fd NRI_PLUGIN_SOCKET.
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let (Some(name), Some(idx)) = (env("NRI_PLUGIN_NAME"), env("NRI_PLUGIN_IDX")) {
        cfg.plugin.name = name;
        cfg.plugin.index = idx;
    } else if let Some(id) = std::env::args()
        .next()
        .and_then(|a| {
            Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .and_then(|f| Identity::from_file_name(&f))
    {
        cfg.plugin.name = id.name;
        cfg.plugin.index = id.index;
    }
    cfg.validate()?;
    let prelaunched = env("NRI_PLUGIN_SOCKET").is_some();
    nri_qos::observability::init(
        &cfg.plugin.log_format,
        &cfg.plugin.log_level,
        cfg.plugin.log_file.as_deref(),
        // The runtime discards a pre-launched plugin's stderr.
        if prelaunched {
            nri_qos::observability::Journal::IfPresent
        } else {
            nri_qos::observability::Journal::Off
        },
    )
    .context("setting up logging")?;

    let transport = match env("NRI_PLUGIN_SOCKET") {
        Some(fd) => {
            let fd: i32 = fd
                .parse()
                .with_context(|| format!("NRI_PLUGIN_SOCKET={fd:?} is not a file descriptor"))?;
            if fd < 0 {
                bail!("NRI_PLUGIN_SOCKET={fd} is not a file descriptor");
            }
            Transport::InheritedFd(fd)
        }
        None => Transport::Socket(cfg.plugin.socket.clone()),
    };
    let identity = Identity::new(&cfg.plugin.name, &cfg.plugin.index)?;
    let node = nri_qos::node::read_node_facts(
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
    });
    // Optional and never required: without credentials, or when they do not
    // work, the plugin runs on the runtime's facts alone, as it always did.
    let kube = match nri_qos::kube::start(&cfg.kubernetes, Some(plugin.metrics())) {
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

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        if cfg.metrics.enabled {
            // Same thread as the NRI session: a wedged session fails /healthz too.
            let metrics = plugin.metrics();
            let addr = cfg.metrics.address;
            tokio::spawn(async move {
                if let Err(e) = nri_qos::metrics::serve(addr, metrics).await {
                    tracing::error!(error = %e, "metrics endpoint stopped");
                }
            });
        }
        if cfg.hierarchy.enabled && node.cgroup_v2 && !cfg.plugin.dry_run {
            let keeper = nri_qos::cgroup::Keeper::new(
                cfg.node.cgroup_root.clone(),
                cfg.hierarchy.clone(),
                node.memory_capacity,
            );
            tokio::spawn(nri_qos::cgroup::keeper::run(
                keeper,
                plugin.registry(),
                plugin.subscribe_changes(),
                std::time::Duration::from_secs(cfg.hierarchy.resync_seconds.max(1)),
                Some(plugin.metrics()),
            ));
        }
        if !node.cgroup_v2 {
            tracing::warn!(
                cgroup_root = %cfg.node.cgroup_root.display(),
                "cgroup v1 node: cpu.weight and memory.min/low/high are skipped (runc rejects unified keys there), \
                 the hierarchy keeper is off; CPU clamps and oom_score_adj still apply"
            );
        }
        if cfg.plugin.with_monitor {
            let pods: Arc<dyn nri_qos::node::registry::PodRegistry> = plugin.registry();
            let paths = nri_qos::pressure::Paths {
                cgroup_root: cfg.node.cgroup_root.clone(),
                proc_root: cfg.node.proc_root.clone(),
            };
            let mut monitor_cfg = cfg.monitor.clone();
            monitor_cfg.throttle = cfg.throttle.clone();
            let metrics = cfg.metrics.enabled.then(|| plugin.metrics());
            // The API server's facts (exact request, priority, static pods)
            // first; the runtime's for pods it does not know (yet).
            let registry: Arc<dyn nri_qos::node::registry::PodRegistry> = match &kube {
                Some(k) => Arc::new(nri_qos::node::registry::Layered(vec![k.store(), pods])),
                None => pods,
            };
            let cluster = kube
                .clone()
                .map(|k| Arc::new(k) as Arc<dyn nri_qos::node::cluster::ClusterEvictions>);
            let (relaxer, relax_task) =
                nri_qos::nri::relax::relaxer(Arc::new(nri_qos::pressure::throttle::FileRelaxer));
            tokio::spawn(relax_task);
            tokio::spawn(async move {
                if let Err(e) = nri_qos::pressure::run_in_plugin(
                    monitor_cfg,
                    paths,
                    registry,
                    metrics,
                    cluster,
                    Arc::new(relaxer),
                )
                .await
                {
                    tracing::error!(error = %e, "pressure monitor stopped");
                }
            });
        }
        tokio::select! {
            r = nri_qos::nri::session::run(transport, plugin, identity) => r.map_err(anyhow::Error::from),
            _ = shutdown_signal() => {
                tracing::info!("signal received; exiting");
                Ok(())
            }
        }
    })
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
