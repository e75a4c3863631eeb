//! Configuration, every layer in one place: defaults, then a TOML file
//! ([`Config::locate`]), then `NRI_QOS_*` environment variables
//! ([`Config::apply_env`]), then the runtime's drop-in config
//! ([`layer_drop_in`], policy and dry-run only), then command-line flags
//! ([`Config::for_plugin`], [`MonitorArgs::resolve`]).
//! Unknown keys and unknown `NRI_QOS_*` variables are errors that name them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::evict::{EvictConfig, PodTree};
use crate::guard::{ThrottleConfig, UnguardedMemoryHigh};
use crate::keeper::HierarchyConfig;
use crate::kube::KubernetesConfig;
use crate::pressure::MonitorConfig;
use crate::qos::policy::PolicyError;
use crate::qos::PolicyConfig;

mod env;
mod flags;
#[cfg(test)]
mod tests;

pub use crate::observability::LogFormat;
pub use env::{env_variables, process_env, EnvValueError, ENV_PREFIX, ENV_RESERVED, ENV_TABLES};
pub use flags::{Launch, MonitorArgs, MonitorSettings, RunArgs};

/// Where the runtime's NRI socket lives by default (containerd and CRI-O).
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// Config file read when no `--config` is given and the file exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/nri-qos/nri-qos.toml";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Config {
    pub plugin: PluginConfig,
    pub node: NodeConfig,
    pub policy: PolicyConfig,
    pub hierarchy: HierarchyConfig,
    pub monitor: MonitorConfig,
    /// The memory.high throttle guard, in the plugin's process.
    pub throttle: ThrottleConfig,
    pub metrics: MetricsConfig,
    pub kubernetes: KubernetesConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct PluginConfig {
    /// Name we register with (pre-launched: the runtime's NRI_PLUGIN_NAME wins).
    pub name: String,
    /// Two-digit index deciding our place among plugins.
    pub index: String,
    /// NRI socket for the external launch mode.
    pub socket: PathBuf,
    /// Compute and log adjustments without returning them.
    pub dry_run: bool,
    /// Apply the policy to containers that already run when we connect.
    pub adjust_existing: bool,
    /// Log format: "text" or "json".
    pub log_format: LogFormat,
    /// Log level or tracing filter, e.g. "info" or "nri_qos=debug".
    pub log_level: String,
    /// Also append logs to this file (stderr always gets them).
    pub log_file: Option<PathBuf>,
    /// Run the node pressure monitor in the plugin process, fed with the
    /// runtime's pod list. (The throttle guard runs there whatever this
    /// says, unless `[throttle] enabled = false`.)
    pub with_monitor: bool,
    /// Most a chunked Synchronize may hold while it is reassembled, in MiB
    /// (plugin and `audit`); past it we answer with what fits.
    pub sync_budget_mib: u64,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            name: "nri-qos".into(),
            index: "10".into(),
            socket: PathBuf::from(DEFAULT_SOCKET),
            dry_run: false,
            adjust_existing: true,
            log_format: LogFormat::Text,
            log_level: "info".into(),
            log_file: None,
            with_monitor: true,
            sync_budget_mib: DEFAULT_SYNC_BUDGET_MIB,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct NodeConfig {
    /// cgroup v2 mount point (read to detect v1/v2; the hierarchy keeper writes below it).
    pub cgroup_root: PathBuf,
    /// procfs mount point.
    pub proc_root: PathBuf,
    /// Node allocatable memory in bytes; 0 = MemTotal.
    pub memory_allocatable: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            proc_root: PathBuf::from("/proc"),
            memory_allocatable: 0,
        }
    }
}

/// Default address of the metrics endpoint (loopback only, see [`MetricsConfig`]).
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9464";

/// `[metrics]`: the optional Prometheus endpoint of [`crate::metrics`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MetricsConfig {
    /// Serve `GET /metrics` and `GET /healthz`.
    pub enabled: bool,
    /// Where to listen; must be a loopback address (we run as root next to
    /// the runtime, so nothing listens beyond localhost).
    pub address: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: false,
            address: SocketAddr::from(([127, 0, 0, 1], 9464)),
        }
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `message` names the key (`plugin.log-format: …`) when the
    /// problem is a key's.
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config value {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error(
        "unknown environment variable {var}: not one of the NRI_QOS_* settings ([policy] and [monitor] are file-only)"
    )]
    UnknownEnv { var: String },
    #[error("invalid environment variable {var} (config value {field}): {reason}")]
    Env {
        var: String,
        field: &'static str,
        reason: EnvValueError,
    },
    #[error(
        "policy.memory-high = true puts memory.high on Burstable and BestEffort containers, but {guard_off}: \
         no throttle guard would relax a container stuck between memory.high and memory.max, which the kernel \
         never resolves. Turn the guard on ([throttle] enabled = true, dry-run = false), or set [policy] \
         memory-high = false, or accept the risk with [throttle] unguarded-memory-high = \"accept\""
    )]
    Unguarded {
        /// The key(s) that leave memory.high unguarded, as set.
        guard_off: String,
    },
}

/// A `hierarchy.budget-share` that is not a share of memory.
#[derive(Debug, Clone, Copy, PartialEq, Error)]
#[error("{0} is not a share in (0, 1] (to turn the keeper off: hierarchy.enabled = false)")]
pub struct BudgetShareError(pub f64);

/// Why the runtime's drop-in config was not applied.
#[derive(Debug, Error)]
pub enum DropInError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// `plugin.sync-budget-mib`: a node of 1,000 pods / 3,000 containers takes
/// about 5.5 MiB, and a Synchronize as large as 8 MiB admits is decided and
/// answered inside the runtime's 2 s on a loaded 2-core node, 64 MiB's is
/// not (docs/protocol.md, "The Synchronize budget"); 1 GiB would already
/// be a peer's attack, not a node.
pub const DEFAULT_SYNC_BUDGET_MIB: u64 = 8;
pub const MAX_SYNC_BUDGET_MIB: u64 = 1024;

impl PluginConfig {
    /// The reassembly budget in bytes (validated to 1..=1024 MiB).
    pub fn sync_budget_bytes(&self) -> usize {
        usize::try_from(self.sync_budget_mib.min(MAX_SYNC_BUDGET_MIB) << 20).unwrap_or(usize::MAX)
    }
}

/// Longest `hierarchy.resync-seconds`: a retry an hour apart is already no
/// retry; beyond that a typo (or i64::MAX) would mean never.
pub const MAX_RESYNC_SECONDS: u64 = 3600;

/// `hierarchy.budget-share`: a share of memory, so a finite number in
/// (0, 1]. nan or a negative share would compute a budget of 0 and strip
/// every pod of its protection; `hierarchy.enabled = false` turns it off.
fn check_budget_share(v: f64) -> Result<(), BudgetShareError> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(BudgetShareError(v))
    }
}

impl Config {
    /// Parses TOML text; `origin` names the source in errors, and a bad
    /// value its key.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let cfg: Config =
            serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
                let key = e.path().to_string();
                let message = e.into_inner().to_string().trim().replace('\n', " ");
                ConfigError::Parse {
                    path: origin.to_path_buf(),
                    message: match key.as_str() {
                        "." => message,
                        key => format!("{key}: {message}"),
                    },
                }
            })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The file layer: `explicit`, else [`DEFAULT_CONFIG_PATH`] when it
    /// exists, else the defaults.
    pub fn locate(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        match explicit {
            Some(p) => Config::load(p),
            None if Path::new(DEFAULT_CONFIG_PATH).is_file() => {
                Config::load(Path::new(DEFAULT_CONFIG_PATH))
            }
            None => Ok(Config::default()),
        }
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text, path)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::nri::Identity::new(&self.plugin.name, &self.plugin.index).map_err(|e| {
            ConfigError::Invalid {
                field: "plugin.name/plugin.index",
                reason: e.to_string(),
            }
        })?;
        self.monitor.validate().map_err(|e| ConfigError::Invalid {
            field: "monitor",
            reason: e.to_string(),
        })?;
        self.throttle.validate().map_err(|e| ConfigError::Invalid {
            field: "throttle",
            reason: e.to_string(),
        })?;
        self.policy.validate().map_err(|e| ConfigError::Invalid {
            field: "policy",
            reason: e.to_string(),
        })?;
        check_budget_share(self.hierarchy.budget_share).map_err(|e| ConfigError::Invalid {
            field: "hierarchy.budget-share",
            reason: e.to_string(),
        })?;
        crate::observability::check_level(&self.plugin.log_level).map_err(|e| {
            ConfigError::Invalid {
                field: "plugin.log-level",
                reason: e.to_string(),
            }
        })?;
        for (field, path) in [
            ("plugin.socket", &self.plugin.socket),
            ("node.cgroup-root", &self.node.cgroup_root),
            ("node.proc-root", &self.node.proc_root),
        ] {
            if path.as_os_str().is_empty() {
                return Err(ConfigError::Invalid {
                    field,
                    reason: "empty path".into(),
                });
            }
        }
        let budget = self.plugin.sync_budget_mib;
        if !(1..=MAX_SYNC_BUDGET_MIB).contains(&budget) {
            return Err(ConfigError::Invalid {
                field: "plugin.sync-budget-mib",
                reason: format!("{budget} is not in 1..={MAX_SYNC_BUDGET_MIB}"),
            });
        }
        let resync = self.hierarchy.resync_seconds;
        if !(1..=MAX_RESYNC_SECONDS).contains(&resync) {
            return Err(ConfigError::Invalid {
                field: "hierarchy.resync-seconds",
                reason: format!("{resync} is not in 1..={MAX_RESYNC_SECONDS}"),
            });
        }
        self.kubernetes
            .validate()
            .map_err(|e| ConfigError::Invalid {
                field: "kubernetes",
                reason: e.to_string(),
            })?;
        if !self.metrics.address.ip().is_loopback() {
            return Err(ConfigError::Invalid {
                field: "metrics.address",
                reason: format!(
                    "{} is not a loopback address; the endpoint only listens on localhost",
                    self.metrics.address
                ),
            });
        }
        Ok(())
    }
}

impl Config {
    /// The eviction path's settings (`[monitor]`'s safeguards), for the
    /// node-pressure monitor and the throttle guard alike.
    pub fn evict_config(&self) -> EvictConfig {
        (&self.monitor).into()
    }

    /// Where the monitor reads the node from.
    pub fn monitor_paths(&self) -> crate::pressure::Paths {
        crate::pressure::Paths {
            cgroup_root: self.node.cgroup_root.clone(),
            proc_root: self.node.proc_root.clone(),
        }
    }

    /// Where the pods live, for the monitor and the guard.
    pub fn pod_tree(&self) -> PodTree {
        self.monitor.pod_tree(&self.monitor_paths())
    }

    /// The plugin's own rule: memory.high only where a throttle guard acts
    /// on it, unless the operator accepts the risk outright. Checked at
    /// start and by `check-config`; `nri-qos monitor` sets no memory.high.
    pub fn check_guarded(&self) -> Result<(), ConfigError> {
        unguarded(
            &self.policy,
            self.plugin.dry_run,
            &self.throttle,
            self.monitor.dry_run,
        )
    }
}

/// [`Config::check_guarded`] on its parts (the runtime's drop-in may bring
/// its own `[policy]` and dry-run).
fn unguarded(
    policy: &PolicyConfig,
    plugin_dry_run: bool,
    guard: &ThrottleConfig,
    monitor_dry_run: bool,
) -> Result<(), ConfigError> {
    let sets_high = policy.memory_high && !plugin_dry_run;
    let accepted = guard.unguarded_memory_high == UnguardedMemoryHigh::Accept;
    if !sets_high || accepted || guard.acts(monitor_dry_run) {
        return Ok(());
    }
    let off = [
        (!guard.enabled, "throttle.enabled = false"),
        (guard.dry_run, "throttle.dry-run = true"),
        (monitor_dry_run, "monitor.dry-run = true"),
    ];
    let guard_off: Vec<&str> = off.iter().filter(|(on, _)| *on).map(|(_, k)| *k).collect();
    Err(ConfigError::Unguarded {
        guard_off: guard_off.join(" and "),
    })
}

/// The runtime drop-in layer: `base` with the drop-in's `[policy]` keys and
/// `plugin.dry-run` on top. The whole text is validated as a config file
/// first (unknown keys and bad values are errors that name them).
pub fn layer_drop_in(
    base: &PolicyConfig,
    base_dry_run: bool,
    text: &str,
) -> Result<(PolicyConfig, bool), DropInError> {
    let origin = Path::new("<runtime drop-in config>");
    Config::from_toml(text, origin)?;
    let overlay: toml::Table = toml::from_str(text)?;
    let mut policy = toml::Table::try_from(base).map_err(|e| ConfigError::Invalid {
        field: "policy",
        reason: e.to_string(),
    })?;
    if let Some(toml::Value::Table(p)) = overlay.get("policy") {
        policy.extend(p.clone());
    }
    let policy: PolicyConfig = toml::Value::Table(policy).try_into()?;
    policy.validate()?;
    let dry_run = overlay
        .get("plugin")
        .and_then(|p| p.get("dry-run"))
        .and_then(toml::Value::as_bool)
        .unwrap_or(base_dry_run);
    Ok((policy, dry_run))
}

/// [`layer_drop_in`] over `base`'s policy and dry-run as the plugin's
/// [`crate::nri::plugin::DropInLayer`]. A drop-in that would set
/// memory.high where `base` runs no guard is refused like the file.
pub fn drop_in_layer(base: &Config) -> crate::nri::plugin::DropInLayer {
    let (policy, dry_run) = (base.policy.clone(), base.plugin.dry_run);
    let (guard, monitor_dry_run) = (base.throttle.clone(), base.monitor.dry_run);
    std::sync::Arc::new(move |text: &str| {
        let (p, d) = layer_drop_in(&policy, dry_run, text)?;
        unguarded(&p, d, &guard, monitor_dry_run).map_err(DropInError::from)?;
        Ok((p, d))
    })
}
