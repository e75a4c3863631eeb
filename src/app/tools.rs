//! The node tools: `explain` (what a manifest will get) and `audit` (what
//! the node has).

use std::path::PathBuf;
use std::time::Duration;

use super::{AppError, Context};
use crate::config::Config;

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// The Pod manifest (YAML), or - for standard input.
    pub manifest: PathBuf,
    /// Node memory capacity (MemTotal), a Kubernetes quantity.
    #[arg(long, default_value = "16Gi")]
    pub node_memory: String,
    /// Node allocatable memory (default: the node memory).
    #[arg(long)]
    pub node_allocatable: Option<String>,
    /// Node CPUs (informational; the kubepods cgroup's share).
    #[arg(long, default_value = "8")]
    pub node_cpus: String,
    /// cgroup driver: cgroupfs or systemd.
    #[arg(long, default_value = "cgroupfs")]
    pub cgroup_driver: String,
    /// Page size in bytes.
    #[arg(long, default_value_t = 4096)]
    pub page_size: u64,
    /// Explain for a cgroup v1 node.
    #[arg(long)]
    cgroup_v1: bool,
    /// Output: table or json.
    #[arg(long, default_value = "table")]
    pub output: String,
    // `--help` prints this text: the brackets name a TOML table, not a link.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Config file whose [policy] to use (default: the built-in defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The kubelet's version: its Memory QoS defaults (factor 0.9 before 1.37, none from 1.37).
    #[arg(long, default_value = "1.37")]
    pub kubelet_version: String,
    /// The kubelet's Memory QoS: none, alpha (1.27-1.35) or tiered (1.36+ TieredReservation).
    #[arg(long, default_value = "none")]
    pub kubelet_memory_qos: String,
    /// The kubelet's memoryThrottlingFactor (memory.high), in (0, 1].
    #[arg(long)]
    pub memory_throttling_factor: Option<f64>,
    /// Where the plugin takes memory requests from: `api-server` (it runs
    /// with the Kubernetes API source: the manifest's exact requests),
    /// `runtime` (what the kubelet sends: unified keys, annotation,
    /// oom_score_adj inversion), or `auto`: api-server when --config sets
    /// `[kubernetes] kubeconfig` (and does not disable the source), else
    /// runtime. A DaemonSet using its service account (no kubeconfig) uses
    /// the API source where NODE_NAME is set: say `api-server`. Explain never
    /// contacts an API server.
    #[arg(long, default_value = "auto")]
    pub request_source: String,
}

/// `nri-qos explain`: every kernel value a Pod manifest will get.
pub fn run_explain(args: ExplainArgs) -> Result<(), AppError> {
    let cfg = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let node = explain_node(&args)?;
    if !matches!(args.output.as_str(), "table" | "json") {
        return Err(AppError::Usage(format!(
            "--output must be table or json, not {:?}",
            args.output
        )));
    }
    let kubelet = explain_kubelet(&args)?;
    let api_server = explain_request_source(&args, &cfg)?;
    let yaml = read_manifest(&args.manifest)?;
    let report = crate::explain::explain_with(&yaml, &node, &cfg.policy, &kubelet, api_server)
        .with_context(|| format!("explaining {}", args.manifest.display()))?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", crate::explain::render_table(&report));
    }
    Ok(())
}

/// The node `explain` simulates, from its flags.
fn explain_node(args: &ExplainArgs) -> Result<crate::explain::NodeSpec, AppError> {
    use crate::node::layout::Driver;
    use crate::qos::quantity::{parse_bytes, parse_milli};
    let memory = parse_bytes(&args.node_memory).context("--node-memory")?;
    if memory == 0 {
        return Err(AppError::Usage("--node-memory must be more than 0".into()));
    }
    let allocatable = match &args.node_allocatable {
        Some(a) => parse_bytes(a).context("--node-allocatable")?,
        None => memory,
    };
    if allocatable == 0 {
        return Err(AppError::Usage(
            "--node-allocatable must be more than 0".into(),
        ));
    }
    parse_milli(&args.node_cpus).context("--node-cpus")?;
    let driver = match args.cgroup_driver.as_str() {
        "cgroupfs" => Driver::Cgroupfs,
        "systemd" => Driver::Systemd,
        other => {
            return Err(AppError::Usage(format!(
                "--cgroup-driver must be cgroupfs or systemd, not {other:?}"
            )))
        }
    };
    Ok(crate::explain::NodeSpec {
        memory_capacity: memory,
        memory_allocatable: allocatable.min(memory),
        page_size: args.page_size.max(1),
        driver,
        cgroup_v2: !args.cgroup_v1,
    })
}

/// The kubelet `explain` simulates: its version and Memory QoS mode.
fn explain_kubelet(args: &ExplainArgs) -> Result<crate::explain::KubeletMemoryQosSim, AppError> {
    use crate::explain::KubeletMode;
    let mode = match args.kubelet_memory_qos.as_str() {
        "none" => KubeletMode::None,
        "alpha" => KubeletMode::Alpha,
        "tiered" => KubeletMode::Tiered,
        other => {
            return Err(AppError::Usage(format!(
                "--kubelet-memory-qos must be none, alpha or tiered, not {other:?}"
            )))
        }
    };
    crate::explain::KubeletMemoryQosSim::for_version(
        &args.kubelet_version,
        Some(mode),
        args.memory_throttling_factor,
    )
    .context("--kubelet-version / --kubelet-memory-qos / --memory-throttling-factor")
}

/// Whether the exact requests come from the API server, as the plugin's
/// Kubernetes API source would give them.
fn explain_request_source(args: &ExplainArgs, cfg: &Config) -> Result<bool, AppError> {
    match args.request_source.as_str() {
        "api-server" => Ok(true),
        "runtime" => Ok(false),
        "auto" => Ok(cfg.kubernetes.enabled && cfg.kubernetes.kubeconfig.is_some()),
        other => Err(AppError::Usage(format!(
            "--request-source must be auto, api-server or runtime, not {other:?}"
        ))),
    }
}

fn read_manifest(path: &std::path::Path) -> Result<String, AppError> {
    Ok(if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the manifest from stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    })
}

#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    /// Config file (default: /etc/nri-qos/nri-qos.toml when it exists).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Runtime NRI socket to take the pod list from.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Output: table or json.
    #[arg(long, default_value = "table")]
    pub output: String,
    /// How long to wait for the runtime's Synchronize (1..=3600 seconds).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout_seconds: u64,
    /// With the API source configured (`[kubernetes]` as the plugin has it),
    /// how long to wait for the one list of this node's pods (1..=60 seconds);
    /// past it, audit says so and goes on with the runtime's values.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub api_timeout_seconds: u64,
}

/// `nri-qos audit`: the policy against the node's real cgroup values;
/// exits with status 1 when any value drifts.
pub fn run_audit(args: AuditArgs) -> Result<(), AppError> {
    let mut cfg = Config::locate(args.config.as_deref())?;
    if let Some(s) = args.socket {
        cfg.plugin.socket = s;
    }
    if !matches!(args.output.as_str(), "table" | "json") {
        return Err(AppError::Usage(format!(
            "--output must be table or json, not {:?}",
            args.output
        )));
    }
    let node = crate::node::read_node_facts(
        &cfg.node.proc_root,
        &cfg.node.cgroup_root,
        cfg.node.memory_allocatable,
    )?;
    let rt = super::runtime()?;
    let (snap, quirks) = rt.block_on(crate::audit::collect(
        &cfg.plugin.socket,
        Duration::from_secs(args.timeout_seconds),
        cfg.plugin.sync_budget_bytes(),
    ))?;
    let limit = Duration::from_secs(args.api_timeout_seconds);
    let (api_pods, api_note) = list_api_pods(&cfg, &rt, &snap, limit);
    let mut report = crate::audit::audit(
        &snap,
        &quirks,
        &node,
        &cfg.policy,
        &cfg.hierarchy,
        &cfg.node.cgroup_root,
        &cfg.node.proc_root,
        api_pods
            .as_ref()
            .map(|s| s as &dyn crate::node::registry::ContainerRequests),
    );
    report.api_server = Some(api_note);
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", crate::audit::render_table(&report));
    }
    if report.drift > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// The plugin's API source for audit: one list of this node's pods, by the
/// same `[kubernetes]` settings, credentials and node name as the plugin.
/// Never fails the audit: off or unreachable, the requests come from the
/// runtime's values as without it, and the note says why.
fn list_api_pods(
    cfg: &Config,
    rt: &tokio::runtime::Runtime,
    snap: &crate::audit::Snapshot,
    limit: Duration,
) -> (Option<crate::kube::PodStore>, String) {
    use crate::kube::Plan;
    let fallback = "requests from the runtime's values alone";
    let (credentials, node_name) = match crate::kube::plan_here(&cfg.kubernetes) {
        Ok(Plan::On {
            credentials,
            node_name,
        }) => (credentials, node_name),
        Ok(Plan::Off(why)) => return (None, format!("off ({why}); {fallback}")),
        Err(e) => return (None, format!("not used ({e}); {fallback}")),
    };
    match rt.block_on(crate::kube::list_node_pods(&credentials, &node_name, limit)) {
        Ok(pods) => {
            let listed = pods.len();
            let store = crate::kube::PodStore::default();
            store.replace(pods);
            let matched = snap
                .pods
                .iter()
                .filter(|p| store.get(&p.uid).is_some())
                .count();
            let note = format!(
                "{listed} pods listed for node {node_name}; {matched} of the runtime's {} pods matched by UID take their exact requests from it",
                snap.pods.len()
            );
            (Some(store), note)
        }
        Err(e) => (None, format!("unreachable ({e}); {fallback}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// audit never fails because of the API: off, or an API server that
    /// refuses the connection, gives one line and the runtime's values.
    #[test]
    fn audit_goes_on_without_the_api() {
        let rt = super::super::runtime().unwrap();
        let snap = crate::audit::Snapshot::default();
        let mut cfg = Config::default();
        cfg.kubernetes.enabled = false;
        let (store, note) = list_api_pods(&cfg, &rt, &snap, Duration::from_secs(2));
        assert!(store.is_none());
        assert!(
            note.starts_with("off (kubernetes.enabled is false)"),
            "{note}"
        );

        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"https://127.0.0.1:{port}\"}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"),
        )
        .unwrap();
        cfg.kubernetes.enabled = true;
        cfg.kubernetes.kubeconfig = Some(kubeconfig);
        cfg.kubernetes.node_name = "node-1".into();
        let started = std::time::Instant::now();
        let (store, note) = list_api_pods(&cfg, &rt, &snap, Duration::from_secs(2));
        assert!(store.is_none());
        assert!(note.starts_with("unreachable ("), "{note}");
        assert!(
            note.ends_with("requests from the runtime's values alone"),
            "{note}"
        );
        assert!(!note.contains('\n'), "{note}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
