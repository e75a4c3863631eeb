use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nri_qos::pressure::{self, cli::LogFormat};

#[derive(Parser)]
#[command(
    name = "nri-qos",
    version,
    about = "Kubernetes QoS made real in the kernel"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Node memory-pressure monitor.
    Monitor(pressure::cli::MonitorArgs),
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn monitor(args: pressure::cli::MonitorArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
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
        .context("tokio runtime")?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("SIGTERM handler")?;
        tokio::select! {
            r = pressure::run(cfg, paths, Arc::new(pressure::NoPods)) => r.context("monitor"),
            _ = tokio::signal::ctrl_c() => Ok(()),
            _ = term.recv() => Ok(()),
        }
    })
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Monitor(args) => monitor(args),
    }
}
