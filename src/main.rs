//! `nri-qos`: the NRI plugin (default command), plus tools.
//!
//! Pre-launched by the runtime it gets no arguments and only the
//! `NRI_PLUGIN_NAME`, `NRI_PLUGIN_IDX` and `NRI_PLUGIN_SOCKET` variables.
//! This file only parses the command line: `nri_qos::app` wires the tasks,
//! `nri_qos::config` layers the settings.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use nri_qos::app::{self, AuditArgs, ExplainArgs};
use nri_qos::config::{MonitorArgs, RunArgs};

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
    Monitor(MonitorArgs),
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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        None => app::run_plugin(RunArgs::default())?,
        Some(Command::Run(args)) => app::run_plugin(args)?,
        Some(Command::Audit(args)) => app::run_audit(args)?,
        Some(Command::Explain(args)) => app::run_explain(args)?,
        Some(Command::Monitor(args)) => app::run_monitor(args)?,
        Some(Command::CheckConfig { file }) => app::check_config(&file)?,
        Some(Command::Health {
            address,
            timeout_seconds,
        }) => {
            nri_qos::metrics::check_health(
                address,
                std::time::Duration::from_secs(timeout_seconds.max(1)),
            )?;
            println!("ok");
        }
    }
    Ok(())
}
