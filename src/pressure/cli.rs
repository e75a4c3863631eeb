//! Arguments of `nri-qos monitor` (clap derive), kept here so `main.rs`
//! only needs one enum variant and one call.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use super::config::{HumanDuration, MonitorConfig, Quantity};
use super::{act, Monitor, MonitorError, Paths};
use crate::node::registry::NoPods;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Node memory-pressure monitor: PSI-triggered, kills whole pods in the
/// kubelet's order before the kernel OOM killer fires.
#[derive(Debug, Clone, clap::Args)]
pub struct MonitorArgs {
    /// cgroup v2 mount point.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// procfs mount point (meminfo, pressure/memory, PID/comm).
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
    /// TOML file; its monitor table is read, other tables are ignored.
    #[arg(long, short = 'c', env = "NRI_QOS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log what would be done; no reclaim, memory.high or kill (PSI triggers
    /// are still armed: they change nothing).
    #[arg(long)]
    pub dry_run: bool,
    /// Overrides hard-threshold, e.g. 100Mi or 2%.
    #[arg(long)]
    pub hard_threshold: Option<Quantity>,
    /// Overrides soft-threshold (0 = off).
    #[arg(long)]
    pub soft_threshold: Option<Quantity>,
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
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

impl MonitorArgs {
    /// The config file (or defaults) with the flags applied.
    pub fn resolve(&self) -> Result<(MonitorConfig, Paths), MonitorError> {
        let mut cfg = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| MonitorError::Config(format!("read {}: {e}", p.display())))?;
                MonitorConfig::from_toml(&text, &p.display().to_string())?
            }
            None => MonitorConfig::default(),
        };
        cfg.dry_run |= self.dry_run;
        if let Some(q) = self.hard_threshold {
            cfg.hard_threshold = q;
        }
        if let Some(q) = self.soft_threshold {
            cfg.soft_threshold = q;
        }
        if let Some(d) = self.soft_grace_period {
            cfg.soft_grace_period = d;
        }
        if let Some(d) = self.cooldown {
            cfg.cooldown = d;
        }
        if let Some(k) = &self.kubepods {
            cfg.kubepods = k.clone();
        }
        if let Some(d) = self.check_interval {
            cfg.check_interval = d;
        }
        cfg.validate()?;
        let paths = Paths {
            cgroup_root: self.cgroup_root.clone(),
            proc_root: self.proc_root.clone(),
        };
        Ok((cfg, paths))
    }
}

/// `--once`: node memory and the current ranking as text.
pub fn once(cfg: MonitorConfig, paths: Paths) -> Result<String, MonitorError> {
    let mut m = Monitor::new(
        cfg.clone(),
        paths,
        Arc::new(NoPods),
        Arc::new(act::Syscalls),
    );
    let (node, cands, ranking) = m.snapshot()?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "capacity={} working_set={} available={} source=\"{}\" hard={} soft={}",
        node.capacity,
        node.working_set,
        node.available,
        node.source,
        cfg.hard_threshold.resolve(node.capacity),
        cfg.soft_threshold.resolve(node.capacity)
    );
    let _ = writeln!(out, "kubepods={:?}", m.kubepods());
    for (n, &i) in ranking.order.iter().enumerate() {
        let _ = writeln!(
            out,
            "#{} {} class_source={} path={}",
            n + 1,
            cands[i].brief(),
            cands[i].class_source,
            cands[i].path.display()
        );
    }
    for (i, why) in &ranking.excluded {
        let _ = writeln!(out, "excluded {} {:?}", cands[*i].brief(), why);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: MonitorArgs,
    }

    #[test]
    fn pressure_cli_flags_override_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nri-qos.toml");
        std::fs::write(
            &file,
            "[policy]\n[monitor]\nhard-threshold = \"200Mi\"\ncooldown = \"3s\"\n",
        )
        .unwrap();
        let w = Wrap::try_parse_from([
            "x",
            "--cgroup-root",
            "/tmp/cg",
            "-c",
            file.to_str().unwrap(),
            "--dry-run",
            "--soft-threshold",
            "0",
            "--check-interval",
            "250ms",
        ])
        .unwrap();
        let (cfg, paths) = w.args.resolve().unwrap();
        assert_eq!(paths.cgroup_root, PathBuf::from("/tmp/cg"));
        assert_eq!(paths.proc_root, PathBuf::from("/proc"));
        assert!(cfg.dry_run);
        assert_eq!(cfg.hard_threshold, Quantity::Bytes(200 << 20));
        assert_eq!(cfg.soft_threshold, Quantity::Bytes(0));
        assert_eq!(cfg.cooldown.to_string(), "3s");
        assert_eq!(cfg.check_interval.to_string(), "250ms");
        assert!(Wrap::try_parse_from(["x", "--hard-threshold", "lots"]).is_err());
        let bad = Wrap::try_parse_from(["x", "-c", "/nonexistent/x.toml"]).unwrap();
        assert!(bad
            .args
            .resolve()
            .unwrap_err()
            .to_string()
            .contains("/nonexistent/x.toml"));
    }
}
