//! The cgroup v2 interface files nri-qos reads or writes, named once. They
//! are also the keys of the OCI `unified` map a runtime passes through.

/// Hard memory protection.
pub const MEMORY_MIN: &str = "memory.min";
/// Best-effort memory protection.
pub const MEMORY_LOW: &str = "memory.low";
/// The throttle limit (KEP-2570's formula).
pub const MEMORY_HIGH: &str = "memory.high";
/// The hard limit.
pub const MEMORY_MAX: &str = "memory.max";
pub const MEMORY_SWAP_MAX: &str = "memory.swap.max";
pub const MEMORY_CURRENT: &str = "memory.current";
pub const MEMORY_STAT: &str = "memory.stat";
/// Hierarchical event counters (`high`, `max`, `oom`, `oom_kill`).
pub const MEMORY_EVENTS: &str = "memory.events";
/// The same counters for this cgroup alone.
pub const MEMORY_EVENTS_LOCAL: &str = "memory.events.local";
/// Pressure stall information (PSI) for memory.
pub const MEMORY_PRESSURE: &str = "memory.pressure";
/// Proactive reclaim: write a byte count.
pub const MEMORY_RECLAIM: &str = "memory.reclaim";
pub const MEMORY_OOM_GROUP: &str = "memory.oom.group";
pub const CPU_WEIGHT: &str = "cpu.weight";
pub const CPU_MAX: &str = "cpu.max";
/// The processes in a cgroup; every cgroup (v1 hierarchies too) has it.
pub const CGROUP_PROCS: &str = "cgroup.procs";
/// `populated` and `frozen`.
pub const CGROUP_EVENTS: &str = "cgroup.events";
/// Write 1 to kill every process in the cgroup.
pub const CGROUP_KILL: &str = "cgroup.kill";
/// Only the cgroup v2 root and its children have it.
pub const CGROUP_CONTROLLERS: &str = "cgroup.controllers";
