//! The environment layer: `NRI_QOS_<TABLE>_<KEY>` variables over the file.

use std::path::PathBuf;

use thiserror::Error;

use super::{check_budget_share, BudgetShareError, Config, ConfigError};
use crate::observability::UnknownLogFormat;

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

/// Why an environment variable's value cannot set its config value.
#[derive(Debug, Error)]
pub enum EnvValueError {
    #[error("{0:?} is not a boolean (true/false, 1/0, yes/no, on/off)")]
    NotBool(String),
    #[error("{value:?}: {reason}")]
    Unparsable {
        value: String,
        reason: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("empty path")]
    EmptyPath,
    #[error(transparent)]
    BudgetShare(#[from] BudgetShareError),
    #[error(transparent)]
    LogFormat(#[from] UnknownLogFormat),
}

type EnvSetter = fn(&mut Config, &str) -> Result<(), EnvValueError>;

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
    (
        "PLUGIN_SYNC_BUDGET_MIB",
        "plugin.sync-budget-mib",
        |c, v| {
            c.plugin.sync_budget_mib = parse_num(v)?;
            Ok(())
        },
    ),
    ("PLUGIN_LOG_FORMAT", "plugin.log-format", |c, v| {
        c.plugin.log_format = v.parse()?;
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

fn parse_bool(v: &str) -> Result<bool, EnvValueError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(EnvValueError::NotBool(v.to_string())),
    }
}

fn parse_num<T: std::str::FromStr>(v: &str) -> Result<T, EnvValueError>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    v.parse::<T>().map_err(|e| EnvValueError::Unparsable {
        value: v.to_string(),
        reason: Box::new(e),
    })
}

fn non_empty_path(v: &str) -> Result<PathBuf, EnvValueError> {
    if v.is_empty() {
        return Err(EnvValueError::EmptyPath);
    }
    Ok(PathBuf::from(v))
}

/// `NRI_QOS_*` variables of this process, as strings (non-UTF-8 lossily).
pub fn process_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    })
}

impl Config {
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
}
