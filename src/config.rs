//! Configuration: defaults, then a TOML file, then `NRI_QOS_*` environment
//! variables ([`Config::apply_env`]), then command-line flags.
//! Unknown keys and unknown `NRI_QOS_*` variables are errors that name them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cgroup::HierarchyConfig;
use crate::kube::KubernetesConfig;
use crate::pressure::throttle::ThrottleConfig;
use crate::pressure::MonitorConfig;
use crate::qos::PolicyConfig;

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
    /// The memory.high throttle guard of the monitor.
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
    pub log_format: String,
    /// Log level or tracing filter, e.g. "info" or "nri_qos=debug".
    pub log_level: String,
    /// Also append logs to this file (stderr always gets them).
    pub log_file: Option<PathBuf>,
    /// Run the node pressure monitor in the plugin process, fed with the
    /// runtime's pod list.
    pub with_monitor: bool,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            name: "nri-qos".into(),
            index: "10".into(),
            socket: PathBuf::from(DEFAULT_SOCKET),
            dry_run: false,
            adjust_existing: true,
            log_format: "text".into(),
            log_level: "info".into(),
            log_file: None,
            with_monitor: false,
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
        reason: String,
    },
}

/// Longest `hierarchy.resync-seconds`: a retry an hour apart is already no
/// retry; beyond that a typo (or i64::MAX) would mean never.
pub const MAX_RESYNC_SECONDS: u64 = 3600;

/// Prefix of the environment variables [`Config::apply_env`] reads.
pub const ENV_PREFIX: &str = "NRI_QOS_";

/// Variables that start with [`ENV_PREFIX`] but are not settings: read by
/// `main` before the file is loaded, skipped by [`Config::apply_env`].
pub const ENV_RESERVED: &[&str] = &["NRI_QOS_CONFIG"];

/// Config tables whose variables [`Config::apply_env`] checks strictly: an
/// unknown `NRI_QOS_<TABLE>_*` is an error. Other `NRI_QOS_*` names are left
/// alone, because our own tooling shares the prefix (`NRI_QOS_E2E` is
/// exported by `scripts/test-all.sh` and inherited by the plugin processes
/// the protocol tests start; `NRI_QOS_BIN`, `NRI_QOS_SKIP_UPSTREAM`).
pub const ENV_TABLES: &[&str] = &[
    "PLUGIN",
    "NODE",
    "HIERARCHY",
    "METRICS",
    "POLICY",
    "MONITOR",
    "KUBERNETES",
];

type EnvSetter = fn(&mut Config, &str) -> Result<(), String>;

/// The environment mapping: `NRI_QOS_<TABLE>_<KEY>` with the key's `-` as `_`
/// sets `<table>.<key>`. `[policy]` is file-only.
const ENV_TABLE: &[(&str, &str, EnvSetter)] = &[
    ("PLUGIN_NAME", "plugin.name", |c, v| {
        c.plugin.name = v.to_string();
        Ok(())
    }),
    ("PLUGIN_INDEX", "plugin.index", |c, v| {
        c.plugin.index = v.to_string();
        Ok(())
    }),
    ("PLUGIN_SOCKET", "plugin.socket", |c, v| {
        c.plugin.socket = non_empty_path(v)?;
        Ok(())
    }),
    ("PLUGIN_DRY_RUN", "plugin.dry-run", |c, v| {
        c.plugin.dry_run = parse_bool(v)?;
        Ok(())
    }),
    (
        "PLUGIN_ADJUST_EXISTING",
        "plugin.adjust-existing",
        |c, v| {
            c.plugin.adjust_existing = parse_bool(v)?;
            Ok(())
        },
    ),
    ("PLUGIN_LOG_FORMAT", "plugin.log-format", |c, v| {
        c.plugin.log_format = v.to_string();
        Ok(())
    }),
    ("PLUGIN_LOG_LEVEL", "plugin.log-level", |c, v| {
        c.plugin.log_level = v.to_string();
        Ok(())
    }),
    ("PLUGIN_LOG_FILE", "plugin.log-file", |c, v| {
        // Empty turns a file's log-file off again.
        c.plugin.log_file = (!v.is_empty()).then(|| PathBuf::from(v));
        Ok(())
    }),
    ("NODE_CGROUP_ROOT", "node.cgroup-root", |c, v| {
        c.node.cgroup_root = non_empty_path(v)?;
        Ok(())
    }),
    ("NODE_PROC_ROOT", "node.proc-root", |c, v| {
        c.node.proc_root = non_empty_path(v)?;
        Ok(())
    }),
    (
        "NODE_MEMORY_ALLOCATABLE",
        "node.memory-allocatable",
        |c, v| {
            c.node.memory_allocatable = parse_num(v)?;
            Ok(())
        },
    ),
    ("HIERARCHY_ENABLED", "hierarchy.enabled", |c, v| {
        c.hierarchy.enabled = parse_bool(v)?;
        Ok(())
    }),
    (
        "HIERARCHY_BUDGET_SHARE",
        "hierarchy.budget-share",
        |c, v| {
            c.hierarchy.budget_share = parse_num(v)?;
            check_budget_share(c.hierarchy.budget_share)?;
            Ok(())
        },
    ),
    (
        "HIERARCHY_RESERVE_BYTES",
        "hierarchy.reserve-bytes",
        |c, v| {
            c.hierarchy.reserve_bytes = parse_num(v)?;
            Ok(())
        },
    ),
    (
        "HIERARCHY_RESYNC_SECONDS",
        "hierarchy.resync-seconds",
        |c, v| {
            c.hierarchy.resync_seconds = parse_num(v)?;
            Ok(())
        },
    ),
    ("METRICS_ENABLED", "metrics.enabled", |c, v| {
        c.metrics.enabled = parse_bool(v)?;
        Ok(())
    }),
    ("METRICS_ADDRESS", "metrics.address", |c, v| {
        c.metrics.address = parse_num(v)?;
        Ok(())
    }),
    ("KUBERNETES_ENABLED", "kubernetes.enabled", |c, v| {
        c.kubernetes.enabled = parse_bool(v)?;
        Ok(())
    }),
    ("KUBERNETES_KUBECONFIG", "kubernetes.kubeconfig", |c, v| {
        c.kubernetes.kubeconfig = (!v.is_empty()).then(|| PathBuf::from(v));
        Ok(())
    }),
    ("KUBERNETES_NODE_NAME", "kubernetes.node-name", |c, v| {
        c.kubernetes.node_name = v.to_string();
        Ok(())
    }),
    ("KUBERNETES_EVICT", "kubernetes.evict", |c, v| {
        c.kubernetes.evict = parse_bool(v)?;
        Ok(())
    }),
];

/// Every environment variable [`Config::apply_env`] understands, with the
/// config value it sets (for docs and tests).
pub fn env_variables() -> impl Iterator<Item = (String, &'static str)> {
    ENV_TABLE
        .iter()
        .map(|(suffix, field, _)| (format!("{ENV_PREFIX}{suffix}"), *field))
}

fn parse_bool(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "{v:?} is not a boolean (true/false, 1/0, yes/no, on/off)"
        )),
    }
}

fn parse_num<T: std::str::FromStr>(v: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    v.parse::<T>().map_err(|e| format!("{v:?}: {e}"))
}

/// `hierarchy.budget-share`: a share of memory, so a finite number in
/// (0, 1]. nan or a negative share would compute a budget of 0 and strip
/// every pod of its protection; `hierarchy.enabled = false` turns it off.
fn check_budget_share(v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(format!(
            "{v} is not a share in (0, 1] (to turn the keeper off: hierarchy.enabled = false)"
        ))
    }
}

fn non_empty_path(v: &str) -> Result<PathBuf, String> {
    if v.is_empty() {
        return Err("empty path".into());
    }
    Ok(PathBuf::from(v))
}

impl Config {
    /// Parses TOML text; `origin` names the source in errors.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_path_buf(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text, path)
    }

    /// Applies `NRI_QOS_*` variables from `vars` (pass `std::env::vars_os()`
    /// converted to strings; tests pass their own). An unknown variable of a
    /// config table (`NRI_QOS_PLUGIN_SOKET`) is an error naming it, as is a
    /// value that does not parse; variables outside [`ENV_TABLES`] are
    /// ignored. Call [`Config::validate`] afterwards.
    pub fn apply_env(
        &mut self,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        for (var, value) in vars {
            let Some(suffix) = var.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let table = suffix.split('_').next().unwrap_or("");
            if ENV_RESERVED.contains(&var.as_str()) || !ENV_TABLES.contains(&table) {
                continue;
            }
            let Some((_, field, set)) = ENV_TABLE.iter().find(|(s, _, _)| *s == suffix) else {
                return Err(ConfigError::UnknownEnv { var });
            };
            set(self, &value).map_err(|reason| ConfigError::Env {
                var: var.clone(),
                field,
                reason,
            })?;
        }
        Ok(())
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
        self.policy
            .validate()
            .map_err(|reason| ConfigError::Invalid {
                field: "policy",
                reason,
            })?;
        check_budget_share(self.hierarchy.budget_share).map_err(|reason| ConfigError::Invalid {
            field: "hierarchy.budget-share",
            reason,
        })?;
        crate::observability::check_level(&self.plugin.log_level).map_err(|reason| {
            ConfigError::Invalid {
                field: "plugin.log-level",
                reason,
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
        let resync = self.hierarchy.resync_seconds;
        if !(1..=MAX_RESYNC_SECONDS).contains(&resync) {
            return Err(ConfigError::Invalid {
                field: "hierarchy.resync-seconds",
                reason: format!("{resync} is not in 1..={MAX_RESYNC_SECONDS}"),
            });
        }
        if !matches!(self.plugin.log_format.as_str(), "text" | "json") {
            return Err(ConfigError::Invalid {
                field: "plugin.log-format",
                reason: format!("{:?} is not \"text\" or \"json\"", self.plugin.log_format),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(
            Config::from_toml("", Path::new("x.toml")).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let err = Config::from_toml("[plugin]\nsockett = \"/x\"\n", Path::new("/etc/x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("sockett"), "{err}");
        assert!(err.contains("/etc/x.toml"), "{err}");
    }

    #[test]
    fn bad_values_name_the_field() {
        let err = Config::from_toml("[plugin]\nindex = \"7\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("plugin.index"), "{err}");
        let err = Config::from_toml("[plugin]\nlog-format = \"xml\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("plugin.log-format"), "{err}");
    }

    #[test]
    fn non_finite_and_out_of_range_shares_are_refused_everywhere() {
        for v in ["nan", "-1.0", "7.0", "0.0", "inf", "-inf"] {
            let text = format!("[hierarchy]\nbudget-share = {v}\n");
            let err = Config::from_toml(&text, Path::new("c.toml"))
                .expect_err(v)
                .to_string();
            assert!(err.contains("hierarchy.budget-share"), "{v}: {err}");
            let err = Config::default()
                .apply_env(env(&[("NRI_QOS_HIERARCHY_BUDGET_SHARE", v)]))
                .expect_err(v)
                .to_string();
            assert!(err.contains("hierarchy.budget-share"), "{v}: {err}");
            // The runtime's drop-in config is checked the same way.
            let err =
                crate::nri::plugin::layer_drop_in(&Default::default(), false, &text).expect_err(v);
            assert!(err.contains("hierarchy.budget-share"), "{v}: {err}");
        }
        // The other float keys already were; keep them so.
        for text in [
            "[policy]\nmemory-throttling-factor = nan\n",
            "[monitor]\nbesteffort-memory-high-factor = nan\n",
            "[monitor]\nhard-threshold = \"nan%\"\n",
            "[monitor]\nsoft-threshold = \"inf%\"\n",
        ] {
            assert!(
                Config::from_toml(text, Path::new("c.toml")).is_err(),
                "{text}"
            );
        }
        let cfg = Config::from_toml("[hierarchy]\nbudget-share = 1.0\n", Path::new("c.toml"));
        assert!(cfg.is_ok());
    }

    #[test]
    fn validation_gaps_are_errors_naming_the_key() {
        let table: &[(&str, &str)] = &[
            ("[plugin]\nlog-level = \"(((\"\n", "plugin.log-level"),
            ("[plugin]\nlog-level = \"\"\n", "plugin.log-level"),
            ("[plugin]\nsocket = \"\"\n", "plugin.socket"),
            ("[node]\ncgroup-root = \"\"\n", "node.cgroup-root"),
            ("[node]\nproc-root = \"\"\n", "node.proc-root"),
            (
                "[hierarchy]\nresync-seconds = 9223372036854775807\n",
                "hierarchy.resync-seconds",
            ),
            (
                "[hierarchy]\nresync-seconds = 0\n",
                "hierarchy.resync-seconds",
            ),
            ("[monitor]\nkubepods = \"../../etc\"\n", "monitor.kubepods"),
            (
                "[monitor]\nkubepods = \"/kubepods.slice/../../etc\"\n",
                "monitor.kubepods",
            ),
            ("[monitor]\ncooldown = \"999999999m\"\n", "monitor.cooldown"),
            (
                "[monitor]\ntransition-period = \"2000000s\"\n",
                "monitor.transition-period",
            ),
            (
                "[monitor]\nhard-threshold = \"300Mi\"\nsoft-threshold = \"100Mi\"\n",
                "monitor.soft-threshold",
            ),
            (
                "[monitor]\nhard-threshold = \"10%\"\nsoft-threshold = \"5%\"\n",
                "monitor.soft-threshold",
            ),
        ];
        for (text, key) in table {
            let err = Config::from_toml(text, Path::new("c.toml"))
                .expect_err(text)
                .to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        for ok in [
            "[monitor]\nkubepods = \"/kubepods.slice\"\n",
            "[monitor]\nsoft-threshold = \"0\"\n",
            "[hierarchy]\nresync-seconds = 3600\n",
            "[plugin]\nlog-level = \"nri_qos=debug,warn\"\n",
        ] {
            Config::from_toml(ok, Path::new("c.toml")).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        // The environment layer ends in the same validation.
        let mut cfg = Config::default();
        cfg.apply_env(env(&[("NRI_QOS_PLUGIN_LOG_LEVEL", "(((")]))
            .unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("plugin.log-level"), "{err}");
    }

    #[test]
    fn metrics_section_parses_and_defaults_off() {
        let cfg = Config::from_toml(
            "[metrics]\nenabled = true\naddress = \"[::1]:9000\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert!(cfg.metrics.enabled);
        assert_eq!(cfg.metrics.address, "[::1]:9000".parse().unwrap());
        let d = MetricsConfig::default();
        assert!(!d.enabled);
        assert_eq!(d.address.to_string(), DEFAULT_METRICS_ADDRESS);
    }

    #[test]
    fn non_loopback_metrics_address_is_refused() {
        for addr in ["0.0.0.0:9464", "10.0.0.1:9464", "[::]:9464"] {
            let text = format!("[metrics]\naddress = \"{addr}\"\n");
            let err = Config::from_toml(&text, Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("metrics.address"), "{addr}: {err}");
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn env_sets_each_field() {
        type Check = fn(&Config) -> bool;
        let table: &[(&str, &str, Check)] = &[
            ("NRI_QOS_PLUGIN_NAME", "qos", |c| c.plugin.name == "qos"),
            ("NRI_QOS_PLUGIN_INDEX", "42", |c| c.plugin.index == "42"),
            ("NRI_QOS_PLUGIN_SOCKET", "/run/x.sock", |c| {
                c.plugin.socket == Path::new("/run/x.sock")
            }),
            ("NRI_QOS_PLUGIN_DRY_RUN", "true", |c| c.plugin.dry_run),
            ("NRI_QOS_PLUGIN_DRY_RUN", "1", |c| c.plugin.dry_run),
            ("NRI_QOS_PLUGIN_DRY_RUN", "YES", |c| c.plugin.dry_run),
            ("NRI_QOS_PLUGIN_ADJUST_EXISTING", "off", |c| {
                !c.plugin.adjust_existing
            }),
            ("NRI_QOS_PLUGIN_LOG_FORMAT", "json", |c| {
                c.plugin.log_format == "json"
            }),
            ("NRI_QOS_PLUGIN_LOG_LEVEL", "nri_qos=debug", |c| {
                c.plugin.log_level == "nri_qos=debug"
            }),
            ("NRI_QOS_PLUGIN_LOG_FILE", "/var/log/q.log", |c| {
                c.plugin.log_file.as_deref() == Some(Path::new("/var/log/q.log"))
            }),
            ("NRI_QOS_PLUGIN_LOG_FILE", "", |c| {
                c.plugin.log_file.is_none()
            }),
            ("NRI_QOS_NODE_CGROUP_ROOT", "/host/sys/fs/cgroup", |c| {
                c.node.cgroup_root == Path::new("/host/sys/fs/cgroup")
            }),
            ("NRI_QOS_NODE_PROC_ROOT", "/host/proc", |c| {
                c.node.proc_root == Path::new("/host/proc")
            }),
            ("NRI_QOS_NODE_MEMORY_ALLOCATABLE", "1073741824", |c| {
                c.node.memory_allocatable == 1 << 30
            }),
            ("NRI_QOS_HIERARCHY_ENABLED", "false", |c| {
                !c.hierarchy.enabled
            }),
            ("NRI_QOS_HIERARCHY_BUDGET_SHARE", "0.5", |c| {
                c.hierarchy.budget_share == 0.5
            }),
            ("NRI_QOS_HIERARCHY_RESERVE_BYTES", "0", |c| {
                c.hierarchy.reserve_bytes == 0
            }),
            ("NRI_QOS_HIERARCHY_RESYNC_SECONDS", "5", |c| {
                c.hierarchy.resync_seconds == 5
            }),
            ("NRI_QOS_METRICS_ENABLED", "on", |c| c.metrics.enabled),
            ("NRI_QOS_METRICS_ADDRESS", "127.0.0.1:1234", |c| {
                c.metrics.address.port() == 1234
            }),
            ("NRI_QOS_KUBERNETES_ENABLED", "false", |c| {
                !c.kubernetes.enabled
            }),
            ("NRI_QOS_KUBERNETES_KUBECONFIG", "/etc/k.conf", |c| {
                c.kubernetes.kubeconfig.as_deref() == Some(Path::new("/etc/k.conf"))
            }),
            ("NRI_QOS_KUBERNETES_NODE_NAME", "n1", |c| {
                c.kubernetes.node_name == "n1"
            }),
            ("NRI_QOS_KUBERNETES_EVICT", "no", |c| !c.kubernetes.evict),
        ];
        for (var, value, check) in table {
            let mut cfg = Config::default();
            cfg.apply_env(env(&[(var, value)]))
                .unwrap_or_else(|e| panic!("{var}={value}: {e}"));
            assert!(check(&cfg), "{var}={value:?} not applied");
        }
        // Every mapped variable is covered by the table above.
        for (var, _) in env_variables() {
            assert!(table.iter().any(|(v, _, _)| *v == var), "{var} untested");
        }
    }

    #[test]
    fn env_errors_name_the_variable_and_field() {
        let table: &[(&str, &str, &[&str])] = &[
            (
                "NRI_QOS_PLUGIN_SOKET",
                "/x",
                &["NRI_QOS_PLUGIN_SOKET", "unknown"],
            ),
            (
                "NRI_QOS_METRICS_ADRESS",
                "127.0.0.1:1",
                &["NRI_QOS_METRICS_ADRESS"],
            ),
            ("NRI_QOS_POLICY_MEMORY_HIGH", "false", &["file-only"]),
            ("NRI_QOS_MONITOR_DRY_RUN", "true", &["file-only"]),
            ("NRI_QOS_NODE", "x", &["NRI_QOS_NODE"]),
            (
                "NRI_QOS_PLUGIN_DRY_RUN",
                "maybe",
                &["NRI_QOS_PLUGIN_DRY_RUN", "plugin.dry-run"],
            ),
            (
                "NRI_QOS_NODE_MEMORY_ALLOCATABLE",
                "-1",
                &["node.memory-allocatable"],
            ),
            (
                "NRI_QOS_HIERARCHY_BUDGET_SHARE",
                "half",
                &["hierarchy.budget-share"],
            ),
            (
                "NRI_QOS_METRICS_ADDRESS",
                "localhost:9464",
                &["metrics.address"],
            ),
            ("NRI_QOS_PLUGIN_SOCKET", "", &["plugin.socket", "empty"]),
        ];
        for (var, value, needles) in table {
            let err = Config::default()
                .apply_env(env(&[(var, value)]))
                .expect_err(var)
                .to_string();
            for n in *needles {
                assert!(err.contains(n), "{var}={value:?}: {err}");
            }
        }
    }

    #[test]
    fn env_ignores_other_variables_and_reserved_ones() {
        let mut cfg = Config::default();
        cfg.apply_env(env(&[
            ("PATH", "/bin"),
            ("NRI_PLUGIN_NAME", "x"),
            ("NRI_QOS_CONFIG", "/etc/other.toml"),
            // Tooling variables sharing our prefix.
            ("NRI_QOS_E2E", "1"),
            ("NRI_QOS_BIN", "/tmp/nri-qos"),
            ("NRI_QOS_SKIP_UPSTREAM", "1"),
            ("NRI_QOS_PLUGINX_NAME", "y"),
            ("nri_qos_plugin_name", "lower"),
        ]))
        .unwrap();
        assert_eq!(cfg, Config::default());
    }

    #[test]
    fn env_overrides_file_and_validation_catches_bad_values() {
        let mut cfg =
            Config::from_toml("[plugin]\ndry-run = false\n", Path::new("c.toml")).unwrap();
        cfg.apply_env(env(&[
            ("NRI_QOS_PLUGIN_DRY_RUN", "true"),
            ("NRI_QOS_METRICS_ADDRESS", "0.0.0.0:9464"),
        ]))
        .unwrap();
        assert!(cfg.plugin.dry_run);
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("metrics.address"), "{err}");
    }
}
