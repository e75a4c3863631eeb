//! Node memory numbers, computed the way the kubelet/cAdvisor do, and what
//! memory.reclaim can take from a pod. A pod's own usage and request are
//! the eviction path's ([`crate::evict::pods`]).

use std::path::Path;

use super::{MonitorError, Paths};
use crate::evict::pods::cgroup_working_set;
use crate::node::cgroupfs as stat;

/// Node memory the kubelet way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeMemory {
    /// MemTotal (the kubelet's machineInfo.MemoryCapacity).
    pub capacity: u64,
    pub working_set: u64,
    /// capacity − working set (the kubelet's `memory.available`).
    pub available: u64,
    /// Which formula produced `working_set`.
    pub source: &'static str,
    /// kubepods memory.max − kubepods working set (the kubelet's
    /// `allocatableMemory.available`), when kubepods has a numeric limit.
    pub allocatable_available: Option<u64>,
    /// The kernel's own estimate, `MemAvailable` of /proc/meminfo, when it
    /// is a signal. Unlike the kubelet's formula it counts kernel memory
    /// (slab, page tables, stacks) and unreclaimable page cache as used.
    pub mem_available: Option<u64>,
}

impl NodeMemory {
    /// The signal the thresholds apply to: the smallest of them. The kubelet
    /// copies the hard memory.available threshold onto allocatable too.
    pub fn effective_available(&self) -> u64 {
        [self.allocatable_available, self.mem_available]
            .into_iter()
            .flatten()
            .fold(self.available, u64::min)
    }

    /// Name of the signal `effective_available` came from, for logs.
    pub fn signal(&self) -> &'static str {
        let eff = self.effective_available();
        if eff == self.available {
            "memory.available"
        } else if Some(eff) == self.allocatable_available {
            "allocatableMemory.available"
        } else {
            "MemAvailable"
        }
    }
}

/// `measure_node` plus the allocatable signal of the kubepods cgroup and,
/// with `mem_available`, the kernel's MemAvailable.
pub fn measure(
    paths: &Paths,
    kubepods: Option<&Path>,
    mem_available: bool,
) -> Result<NodeMemory, MonitorError> {
    let mut n = measure_node(paths)?;
    if !mem_available {
        n.mem_available = None;
    }
    n.allocatable_available = kubepods.and_then(|kp| {
        let max = stat::read_single(&kp.join("memory.max")).ok().flatten()?;
        let ws = cgroup_working_set(kp).ok()?;
        Some(max.saturating_sub(ws))
    });
    Ok(n)
}

pub const WS_ROOT_STAT: &str = "root memory.stat anon+file-inactive_file";
pub const WS_MEMINFO: &str = "meminfo MemTotal-MemFree-Inactive(file)";

/// Measures node memory. Prefers the root cgroup's memory.stat
/// (`anon + file − inactive_file`, what cAdvisor computes on cgroup v2);
/// falls back to /proc/meminfo (`MemTotal − MemFree − Inactive(file)`, which
/// also counts kernel memory as used, so it errs towards acting) when the
/// root memory.stat is missing or lacks those keys.
pub fn measure_node(paths: &Paths) -> Result<NodeMemory, MonitorError> {
    let mi_path = paths.meminfo();
    let mi = stat::parse_meminfo(&mi_path, &stat::read(&mi_path)?)?;
    let get = |k: &'static str| {
        mi.get(k).copied().ok_or(MonitorError::Missing {
            path: mi_path.clone(),
            key: k,
        })
    };
    let capacity = get("MemTotal")?;
    let root_stat = stat::read_flat_keyed(&paths.cgroup_root.join("memory.stat")).ok();
    let from_root = root_stat.as_ref().and_then(|s| {
        let (anon, file, inactive) = (s.get("anon")?, s.get("file")?, s.get("inactive_file")?);
        Some(stat::working_set(anon.saturating_add(*file), *inactive))
    });
    let (working_set, source) = match from_root {
        Some(ws) => (ws, WS_ROOT_STAT),
        None => {
            let used = capacity.saturating_sub(get("MemFree")?);
            (stat::working_set(used, get("Inactive(file)")?), WS_MEMINFO)
        }
    };
    Ok(NodeMemory {
        capacity,
        working_set,
        available: capacity.saturating_sub(working_set),
        source,
        allocatable_available: None,
        mem_available: mi.get("MemAvailable").copied(),
    })
}

/// Free swap in bytes (`SwapFree` of meminfo; 0 when unknown).
pub fn swap_free(paths: &Paths) -> u64 {
    stat::read(&paths.meminfo())
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let kb: u64 = l
                    .strip_prefix("SwapFree:")?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()?;
                kb.checked_mul(1024)
            })
        })
        .unwrap_or(0)
}

/// What `memory.reclaim` can take from a cgroup: its page cache except
/// shmem, plus anon and shmem while swap has room. Asking for more makes
/// the kernel scan in vain, and a monitor blocked in that write for a second
/// lets the kernel OOM killer win the race (seen in the VM).
pub fn reclaimable(cg: &Path, swap_free: u64) -> u64 {
    let Ok(st) = stat::read_flat_keyed(&cg.join("memory.stat")) else {
        return 0;
    };
    let get = |k: &str| st.get(k).copied().unwrap_or(0);
    let shmem = get("shmem");
    let cache = get("file").saturating_sub(shmem);
    if swap_free > 0 {
        cache + (get("anon") + shmem).min(swap_free)
    } else {
        cache
    }
}
