//! The optional Kubernetes source of pod facts: a watch of this node's pods
//! on the API server gives the policy exact memory requests, the monitor
//! `spec.priority` and the critical-pod rule, and evictions that move the
//! pod (policy/v1 Eviction plus an Event).
//!
//! Used only when credentials exist (the in-cluster service account, or
//! `[kubernetes] kubeconfig`) and the node name is known; without them the
//! plugin behaves exactly as before. Everything talking to the API server
//! runs on a thread and runtime of its own: the NRI hooks and the monitor
//! read the [`PodStore`] snapshot and never wait for the network.

#[cfg(feature = "kube")]
mod client;
#[cfg(not(feature = "kube"))]
#[path = "client_off.rs"]
mod client;
pub mod facts;
#[cfg(feature = "kube")]
mod list;
pub mod messages;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[cfg(not(feature = "kube"))]
pub use client::list_node_pods;
pub use client::Kube;
pub use facts::ApiPodFacts;
#[cfg(feature = "kube")]
pub use list::list_node_pods;
pub use store::PodStore;

/// Where the kubelet mounts the service account token in a pod.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// The variable the DaemonSet fills from the downward API (`spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// `[kubernetes]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct KubernetesConfig {
    /// Use the API server when credentials exist (false: never).
    pub enabled: bool,
    /// A kubeconfig file; without it, the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name as the API server knows it; empty: `$NODE_NAME`.
    pub node_name: String,
    /// Create an Eviction (and an Event) for each pod the monitor evicts.
    pub evict: bool,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            enabled: true,
            kubeconfig: None,
            node_name: String::new(),
            evict: true,
        }
    }
}

#[derive(Debug, Error)]
pub enum KubeError {
    #[error("kubernetes.node-name {0:?} is not a valid node name (lowercase letters, digits, '-' and '.', at most 253)")]
    NodeName(String),
    #[error("kubernetes.kubeconfig is set but empty")]
    EmptyKubeconfig,
    #[cfg(feature = "kube")]
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[cfg(feature = "kube")]
    #[error("in-cluster service account: {0}")]
    InCluster(#[source] kube::config::InClusterError),
    #[cfg(feature = "kube")]
    #[error("kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[cfg(not(feature = "kube"))]
    #[error("the API source is configured, but this build has no Kubernetes API client (cargo feature `kube`)")]
    NotBuilt,
    /// The API source's own runtime or thread could not start.
    #[error("kubernetes client: {what}: {source}")]
    Start {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the API server did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error(
        "kubernetes.kubeconfig {0} is set but no node name: set kubernetes.node-name or NODE_NAME"
    )]
    NoNodeName(PathBuf),
}

impl KubernetesConfig {
    /// Checks what can be checked without the environment.
    pub fn validate(&self) -> Result<(), KubeError> {
        if self
            .kubeconfig
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(KubeError::EmptyKubeconfig);
        }
        if !self.node_name.is_empty() && !valid_node_name(&self.node_name) {
            return Err(KubeError::NodeName(self.node_name.clone()));
        }
        Ok(())
    }
}

/// A DNS subdomain, as node names are.
pub fn valid_node_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && n.starts_with(|c: char| c.is_ascii_alphanumeric())
        && n.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// How we reach the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    InCluster,
    Kubeconfig(PathBuf),
}

/// What [`plan`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Off, and why (logged once at start).
    Off(&'static str),
    On {
        credentials: Credentials,
        node_name: String,
    },
}

/// Whether the source runs: credentials (a configured kubeconfig, else the
/// service account when the pod has one) and a node name (configured, else
/// `env(NODE_NAME)`). A kubeconfig configured without a node name is an
/// error; missing in-cluster pieces only turn the source off.
pub fn plan(
    cfg: &KubernetesConfig,
    env: impl Fn(&str) -> Option<String>,
    token: &Path,
) -> Result<Plan, KubeError> {
    cfg.validate()?;
    if !cfg.enabled {
        return Ok(Plan::Off("kubernetes.enabled is false"));
    }
    let node_name = if cfg.node_name.is_empty() {
        env(NODE_NAME_ENV).unwrap_or_default()
    } else {
        cfg.node_name.clone()
    };
    let credentials = match &cfg.kubeconfig {
        Some(p) => Credentials::Kubeconfig(p.clone()),
        None if env("KUBERNETES_SERVICE_HOST").is_some() && token.exists() => {
            Credentials::InCluster
        }
        None => {
            return Ok(Plan::Off(
                "no kubeconfig configured and no in-cluster service account",
            ))
        }
    };
    if node_name.is_empty() {
        return match credentials {
            Credentials::Kubeconfig(p) => Err(KubeError::NoNodeName(p)),
            Credentials::InCluster => Ok(Plan::Off(
                "in-cluster credentials but NODE_NAME is not set (the DaemonSet passes it from spec.nodeName)",
            )),
        };
    }
    if !valid_node_name(&node_name) {
        return Err(KubeError::NodeName(node_name));
    }
    Ok(Plan::On {
        credentials,
        node_name,
    })
}

/// [`plan`] with this process's environment and the service account's
/// token path.
pub fn plan_here(cfg: &KubernetesConfig) -> Result<Plan, KubeError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    plan(cfg, env, Path::new(SERVICE_ACCOUNT_TOKEN))
}

/// Starts the source when [`plan`] says so, on its own thread.
pub fn start(
    cfg: &KubernetesConfig,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) -> Result<Option<Kube>, KubeError> {
    match plan_here(cfg)? {
        Plan::Off(why) => {
            tracing::info!(
                why,
                "Kubernetes API source off; pod facts come from the runtime alone"
            );
            Ok(None)
        }
        Plan::On {
            credentials,
            node_name,
        } => Kube::start(credentials, node_name, cfg.evict, metrics).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn off_without_credentials_on_with_them() {
        let cfg = KubernetesConfig::default();
        let none = Path::new("/nonexistent/token");
        assert!(matches!(
            plan(&cfg, env(&[("NODE_NAME", "n1")]), none).unwrap(),
            Plan::Off(_)
        ));
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let incluster = [("NODE_NAME", "n1"), ("KUBERNETES_SERVICE_HOST", "10.0.0.1")];
        assert_eq!(
            plan(&cfg, env(&incluster), tmp.path()).unwrap(),
            Plan::On {
                credentials: Credentials::InCluster,
                node_name: "n1".into()
            }
        );
        // In-cluster without NODE_NAME: off, not an error.
        assert!(matches!(
            plan(&cfg, env(&incluster[1..]), tmp.path()).unwrap(),
            Plan::Off(_)
        ));
        let off = KubernetesConfig {
            enabled: false,
            ..cfg.clone()
        };
        assert!(matches!(
            plan(&off, env(&incluster), tmp.path()).unwrap(),
            Plan::Off(_)
        ));
    }

    #[test]
    fn a_kubeconfig_needs_a_valid_node_name() {
        let cfg = KubernetesConfig {
            kubeconfig: Some("/etc/kube.conf".into()),
            ..Default::default()
        };
        let none = Path::new("/nonexistent");
        assert!(plan(&cfg, env(&[]), none)
            .unwrap_err()
            .to_string()
            .contains("node name"));
        assert!(plan(&cfg, env(&[("NODE_NAME", "Bad_Name")]), none).is_err());
        let named = KubernetesConfig {
            node_name: "node-1.example".into(),
            ..cfg
        };
        assert!(matches!(
            plan(&named, env(&[]), none).unwrap(),
            Plan::On { .. }
        ));
        let bad = KubernetesConfig {
            node_name: "-x".into(),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }
}
