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
}

/// `nri-qos explain`: every kernel value a Pod manifest will get.
pub fn run_explain(args: ExplainArgs) -> Result<(), AppError> {
    use crate::explain::{self, NodeSpec};
    use crate::node::layout::Driver;
    use crate::qos::quantity::{parse_bytes, parse_milli};
    let cfg = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
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
    if !matches!(args.output.as_str(), "table" | "json") {
        return Err(AppError::Usage(format!(
            "--output must be table or json, not {:?}",
            args.output
        )));
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
        other => {
            return Err(AppError::Usage(format!(
                "--kubelet-memory-qos must be none, alpha or tiered, not {other:?}"
            )))
        }
    };
    let kubelet = explain::KubeletMemoryQosSim::for_version(
        &args.kubelet_version,
        Some(mode),
        args.memory_throttling_factor,
    )
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
    let snap = super::runtime()?.block_on(crate::audit::collect(
        &cfg.plugin.socket,
        Duration::from_secs(args.timeout_seconds),
        cfg.plugin.sync_budget_bytes(),
    ))?;
    let report = crate::audit::audit(
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
        print!("{}", crate::audit::render_table(&report));
    }
    if report.drift > 0 {
        std::process::exit(1);
    }
    Ok(())
}
