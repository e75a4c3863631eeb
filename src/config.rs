//! Configuration: defaults, then a TOML file, then command-line flags.
//! Unknown keys are an error that names the key and the file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cgroup::HierarchyConfig;
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
        self.policy
            .validate()
            .map_err(|reason| ConfigError::Invalid {
                field: "policy",
                reason,
            })?;
        if !matches!(self.plugin.log_format.as_str(), "text" | "json") {
            return Err(ConfigError::Invalid {
                field: "plugin.log-format",
                reason: format!("{:?} is not \"text\" or \"json\"", self.plugin.log_format),
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
}
