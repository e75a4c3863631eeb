//! `nri-qos monitor --once`: one measurement and ranking as text. The
//! command's flags and their layering live in the config module.

use std::fmt::Write as _;
use std::sync::Arc;

use super::config::MonitorConfig;
use super::{Monitor, MonitorError, Paths};
use crate::evict::{kill, Evictor};
use crate::node::registry::NoPods;

/// `--once`: node memory and the current ranking as text.
pub fn once(cfg: MonitorConfig, paths: Paths) -> Result<String, MonitorError> {
    // Nothing is evicted here; the path is only there to be asked.
    let evictor = Evictor::new((&cfg).into(), Arc::new(kill::Syscalls)).shared();
    let mut m = Monitor::new(cfg.clone(), paths, Arc::new(NoPods), evictor);
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
