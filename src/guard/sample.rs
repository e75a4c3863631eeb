//! Measurement: reading a container cgroup (and the QoS parents' cheap
//! filter) into the [`Sample`]s the guard decides on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::node::cgroupfs::{self as stat, RELAXED_WITHOUT_LIMIT};
use crate::node::layout::{container_id, Driver};
use crate::node::psi;
use crate::node::QosClass;

/// `memory.events` counters of one cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventCounts {
    pub high: u64,
    pub max: u64,
}

/// One container cgroup as read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Container cgroup directory (the tracking key).
    pub path: PathBuf,
    /// Container id (from the cgroup name); a new id resets the baseline.
    pub id: String,
    pub pod_uid: String,
    pub pod_path: PathBuf,
    pub class: QosClass,
    pub counters: EventCounts,
    pub psi_some_avg10: f64,
    /// memory.high; `None` = "max".
    pub high: Option<u64>,
    /// memory.max; `None` = "max".
    pub max: Option<u64>,
}

impl Sample {
    /// memory.high already as loose as it gets: `max`, equal to
    /// memory.max, or [`RELAXED_WITHOUT_LIMIT`] without a limit. What a
    /// relax leaves behind, so the relaxed state is derived from the tree
    /// and survives a restart.
    pub fn relaxed(&self) -> bool {
        self.high.is_none() || self.high == self.max || self.high == Some(RELAXED_WITHOUT_LIMIT)
    }

    /// The value a relax writes: memory.max, or [`RELAXED_WITHOUT_LIMIT`]
    /// where there is none.
    pub fn relax_value(&self) -> u64 {
        self.max.unwrap_or(RELAXED_WITHOUT_LIMIT)
    }
}

/// The cgroup of a QoS class's parent, where Burstable and BestEffort pods
/// live. Guaranteed pods sit directly under kubepods and are never read.
pub fn qos_parent(kubepods: &Path, driver: Driver, class: QosClass) -> Option<PathBuf> {
    driver.qos_dir(class).map(|name| kubepods.join(name))
}

/// `high` and `max` of a cgroup's `memory.events` (hierarchical: a pod's or
/// QoS parent's counters move whenever any container below them hits its
/// memory.high or memory.max).
pub fn read_counters(cg: &Path) -> Option<EventCounts> {
    let m = stat::read_flat_keyed(&cg.join("memory.events")).ok()?;
    Some(EventCounts {
        high: m.get("high").copied().unwrap_or(0),
        max: m.get("max").copied().unwrap_or(0),
    })
}

/// `some avg10` of a cgroup's memory.pressure; 0 when unreadable.
pub fn read_psi(cg: &Path) -> f64 {
    psi::read(&cg.join("memory.pressure")).map_or(0.0, |p| p.some.avg10)
}

/// One container cgroup read in full, or `None` when it is not worth
/// watching: no finite memory.high below memory.max, not relaxed by us (the
/// guard knows), or unreadable (gone).
pub fn read_container(
    cg: &Path,
    pod_uid: &str,
    pod_path: &Path,
    class: QosClass,
) -> Option<Sample> {
    let name = cg.file_name()?.to_str()?;
    // An emptied cgroup (killed, or exited and not yet removed by the
    // runtime) can neither stall nor be relaxed: judging it would only
    // repeat an eviction decision until the runtime removes it.
    if stat::read_populated(cg).is_ok_and(|populated| !populated) {
        return None;
    }
    let high = stat::read_single(&cg.join("memory.high")).ok()?;
    let max = stat::read_single(&cg.join("memory.max")).ok()?;
    Some(Sample {
        path: cg.to_path_buf(),
        id: container_id(name).to_string(),
        pod_uid: pod_uid.to_string(),
        pod_path: pod_path.to_path_buf(),
        class,
        counters: read_counters(cg)?,
        psi_some_avg10: read_psi(cg),
        high,
        max,
    })
}

/// Container cgroups directly under a pod cgroup.
pub fn containers_of(pod: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(pod)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.path())
        .collect()
}

/// The cheap filter: what a parent cgroup looked like at the last pass.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    seen: HashMap<PathBuf, EventCounts>,
}

impl Filter {
    /// True when `cg`'s hierarchical counters moved since the last look or
    /// its PSI is above `psi_threshold`: something below may be throttled.
    pub fn moved(&mut self, cg: &Path, psi_threshold: f64) -> bool {
        let Some(now) = read_counters(cg) else {
            return false;
        };
        let before = self.seen.insert(cg.to_path_buf(), now);
        before != Some(now) || read_psi(cg) > psi_threshold
    }

    /// Keeps only the given parents (bounded by the pod count).
    pub fn retain(&mut self, keep: impl Fn(&Path) -> bool) {
        self.seen.retain(|p, _| keep(p));
    }
}
