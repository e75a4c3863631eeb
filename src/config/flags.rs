//! The last layers: the command line's flags, and for the plugin the name
//! the runtime gives it. The `run` and `monitor` flags are defined here,
//! beside the layering they end, so each setting has one home.

use std::path::{Path, PathBuf};

use super::{Config, ConfigError};
use crate::guard::ThrottleConfig;
use crate::nri::Identity;
use crate::observability::LogFormat;
use crate::pressure::config::{HumanDuration, MonitorConfig, SizeOrPercent};
use crate::pressure::Paths;

/// Flags of `nri-qos run` (the default command).
#[derive(clap::Args, Debug, Default)]
pub struct RunArgs {
    /// Config file (default: /etc/nri-qos/nri-qos.toml when it exists).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Runtime NRI socket to connect to (external mode).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Plugin name to register with.
    #[arg(long)]
    pub name: Option<String>,
    /// Two-digit plugin index.
    #[arg(long)]
    pub index: Option<String>,
    /// Compute and log adjustments without returning them.
    #[arg(long)]
    pub dry_run: bool,
    /// Log format: text or json.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log level or tracing filter.
    #[arg(long)]
    pub log_level: Option<String>,
}

/// What the runtime tells a plugin it starts: `NRI_PLUGIN_NAME`,
/// `NRI_PLUGIN_IDX`, `NRI_PLUGIN_SOCKET` (empty values count as unset), and
/// the name it was started under (`10-nri-qos`).
#[derive(Debug, Clone, Default)]
pub struct Launch {
    pub name: Option<String>,
    pub index: Option<String>,
    pub socket_fd: Option<String>,
    pub program: Option<String>,
}

impl Launch {
    /// This process's launch facts.
    pub fn from_process() -> Launch {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Launch {
            name: env("NRI_PLUGIN_NAME"),
            index: env("NRI_PLUGIN_IDX"),
            socket_fd: env("NRI_PLUGIN_SOCKET"),
            program: std::env::args().next().and_then(|a| {
                Path::new(&a)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
            }),
        }
    }
}

impl Config {
    /// The plugin's configuration: defaults, the file (`--config`,
    /// `$NRI_QOS_CONFIG`, or [`super::DEFAULT_CONFIG_PATH`] when it exists),
    /// `NRI_QOS_*` variables from `env`, the flags, then the name the runtime
    /// gave us (pre-launched: its variables; otherwise our file name).
    pub fn for_plugin(
        args: &RunArgs,
        env: impl Iterator<Item = (String, String)>,
        launch: &Launch,
    ) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = env.collect();
        let file = args.config.clone().or_else(|| {
            env.iter()
                .find(|(k, _)| k == "NRI_QOS_CONFIG")
                .map(|(_, v)| PathBuf::from(v))
        });
        let mut cfg = Config::locate(file.as_deref())?;
        cfg.apply_env(env.into_iter())?;
        if let Some(s) = &args.socket {
            cfg.plugin.socket = s.clone();
        }
        if let Some(n) = &args.name {
            cfg.plugin.name = n.clone();
        }
        if let Some(i) = &args.index {
            cfg.plugin.index = i.clone();
        }
        if let Some(f) = args.log_format {
            cfg.plugin.log_format = f;
        }
        if let Some(l) = &args.log_level {
            cfg.plugin.log_level = l.clone();
        }
        cfg.plugin.dry_run |= args.dry_run;
        if let (Some(name), Some(idx)) = (&launch.name, &launch.index) {
            cfg.plugin.name = name.clone();
            cfg.plugin.index = idx.clone();
        } else if let Some(id) = launch.program.as_deref().and_then(Identity::from_file_name) {
            cfg.plugin.name = id.name;
            cfg.plugin.index = id.index;
        }
        cfg.validate()?;
        cfg.check_guarded()?;
        Ok(cfg)
    }
}

/// Node memory-pressure monitor (and the memory.high throttle guard beside
/// it): PSI-triggered, kills whole pods in the kubelet's order before the
/// kernel OOM killer fires.
#[derive(Debug, Clone, clap::Args)]
pub struct MonitorArgs {
    /// cgroup v2 mount point (default: node.cgroup-root, /sys/fs/cgroup).
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
    /// procfs mount point (meminfo, pressure/memory, PID/comm; default:
    /// node.proc-root, /proc).
    #[arg(long)]
    pub proc_root: Option<PathBuf>,
    // `--help` prints this text: the brackets name TOML tables, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Config file (default: /etc/nri-qos/nri-qos.toml when it exists); the
    /// monitor and the throttle guard beside it use its [monitor],
    /// [throttle] and [node] tables and plugin.log-level.
    #[arg(long, short = 'c', env = "NRI_QOS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log what would be done; no reclaim, memory.high or kill (PSI triggers
    /// are still armed: they change nothing).
    #[arg(long)]
    pub dry_run: bool,
    /// Overrides hard-threshold, e.g. 100Mi or 2%.
    #[arg(long)]
    pub hard_threshold: Option<SizeOrPercent>,
    /// Overrides soft-threshold (0 = off).
    #[arg(long)]
    pub soft_threshold: Option<SizeOrPercent>,
    /// Overrides soft-grace-period, e.g. 2s.
    #[arg(long)]
    pub soft_grace_period: Option<HumanDuration>,
    /// Overrides cooldown after a kill, e.g. 1s.
    #[arg(long)]
    pub cooldown: Option<HumanDuration>,
    /// Overrides the kubepods cgroup path ("auto" or relative to the root).
    #[arg(long)]
    pub kubepods: Option<String>,
    /// Overrides the calm-state check interval, e.g. 5s.
    #[arg(long)]
    pub check_interval: Option<HumanDuration>,
    /// Measure and rank once, print, exit (no action).
    #[arg(long)]
    pub once: bool,
    /// Log format (default: plugin.log-format, text).
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log level or tracing filter (default: plugin.log-level, info).
    #[arg(long)]
    pub log_level: Option<String>,
}

/// What `nri-qos monitor` runs with.
#[derive(Debug, Clone)]
pub struct MonitorSettings {
    pub monitor: MonitorConfig,
    /// The throttle guard beside it (`[throttle]`).
    pub throttle: ThrottleConfig,
    pub paths: Paths,
    pub log_format: LogFormat,
    pub log_level: String,
}

impl MonitorArgs {
    /// The monitor's settings through the same layers as the plugin's:
    /// defaults, the file, `NRI_QOS_*` variables from `env`, the flags.
    pub fn resolve(
        &self,
        env: impl Iterator<Item = (String, String)>,
    ) -> Result<MonitorSettings, ConfigError> {
        let mut cfg = Config::locate(self.config.as_deref())?;
        cfg.apply_env(env)?;
        if let Some(p) = &self.cgroup_root {
            cfg.node.cgroup_root = p.clone();
        }
        if let Some(p) = &self.proc_root {
            cfg.node.proc_root = p.clone();
        }
        if let Some(f) = self.log_format {
            cfg.plugin.log_format = f;
        }
        if let Some(l) = &self.log_level {
            cfg.plugin.log_level = l.clone();
        }
        let m = &mut cfg.monitor;
        m.dry_run |= self.dry_run;
        if let Some(q) = self.hard_threshold {
            m.hard_threshold = q;
        }
        if let Some(q) = self.soft_threshold {
            m.soft_threshold = q;
        }
        if let Some(d) = self.soft_grace_period {
            m.soft_grace_period = d;
        }
        if let Some(d) = self.cooldown {
            m.cooldown = d;
        }
        if let Some(k) = &self.kubepods {
            m.kubepods = k.clone();
        }
        if let Some(d) = self.check_interval {
            m.check_interval = d;
        }
        cfg.validate()?;
        Ok(MonitorSettings {
            monitor: cfg.monitor.clone(),
            throttle: cfg.throttle.clone(),
            paths: cfg.monitor_paths(),
            log_format: cfg.plugin.log_format,
            log_level: cfg.plugin.log_level,
        })
    }
}
