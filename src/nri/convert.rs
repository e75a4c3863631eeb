//! Conversion between NRI wire messages and the policy's plain facts.
//!
//! The runtime converts CRI values to NRI with explicit zeros ("0 = not set"
//! in CRI), so zeros and negative "unlimited" markers become `None` here.

use std::collections::{BTreeMap, HashMap};

use protobuf::MessageField;

use super::proto::api;
use crate::qos::{Adjustment, ContainerFacts, PodFacts, Resources};

fn sorted(map: &HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Resources as the policy sees them.
pub fn resources_from_wire(r: &api::LinuxResources) -> Resources {
    let cpu = r.cpu.as_ref();
    let mem = r.memory.as_ref();
    Resources {
        cpu_shares: cpu
            .and_then(|c| c.shares.as_ref())
            .map(|v| v.value)
            .filter(|v| *v > 0),
        cpu_quota: cpu
            .and_then(|c| c.quota.as_ref())
            .map(|v| v.value)
            .filter(|v| *v > 0),
        cpu_period: cpu
            .and_then(|c| c.period.as_ref())
            .map(|v| v.value)
            .filter(|v| *v > 0),
        memory_limit: mem
            .and_then(|m| m.limit.as_ref())
            .map(|v| v.value)
            .filter(|v| *v > 0),
        unified: sorted(&r.unified),
    }
}

pub fn pod_from_wire(pod: &api::PodSandbox) -> PodFacts {
    let linux = pod.linux.as_ref();
    PodFacts {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        labels: sorted(&pod.labels),
        annotations: sorted(&pod.annotations),
        cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
        resources: linux
            .and_then(|l| l.pod_resources.as_ref())
            .map(resources_from_wire),
        kubelet_memory_qos: false,
    }
}

pub fn container_from_wire(c: &api::Container) -> ContainerFacts {
    let linux = c.linux.as_ref();
    ContainerFacts {
        name: c.name.clone(),
        labels: sorted(&c.labels),
        annotations: sorted(&c.annotations),
        resources: linux
            .and_then(|l| l.resources.as_ref())
            .map(resources_from_wire)
            .unwrap_or_default(),
        oom_score_adj: linux
            .and_then(|l| l.oom_score_adj.as_ref())
            .map(|o| o.value),
        cgroups_path: linux.map(|l| l.cgroups_path.clone()).unwrap_or_default(),
        api_memory_request: None,
        // The message alone cannot say: `nri::view` knows the runtime.
        unified_shown: false,
    }
}

/// The resource part of an adjustment, or `None` when it sets nothing.
/// Takes the adjustment: its unified strings move into the message.
pub fn resources_to_wire(adj: Adjustment) -> Option<api::LinuxResources> {
    let mut r = api::LinuxResources::new();
    let mut cpu = api::LinuxCPU::new();
    let mut any_cpu = false;
    if let Some(v) = adj.cpu_shares {
        cpu.shares = MessageField::some(api::OptionalUInt64 {
            value: v,
            ..Default::default()
        });
        any_cpu = true;
    }
    if let Some(v) = adj.cpu_quota {
        cpu.quota = MessageField::some(api::OptionalInt64 {
            value: v,
            ..Default::default()
        });
        any_cpu = true;
    }
    if let Some(v) = adj.cpu_period {
        cpu.period = MessageField::some(api::OptionalUInt64 {
            value: v,
            ..Default::default()
        });
        any_cpu = true;
    }
    if any_cpu {
        r.cpu = MessageField::some(cpu);
    }
    if let Some(v) = adj.memory_limit {
        let mut mem = api::LinuxMemory::new();
        mem.limit = MessageField::some(api::OptionalInt64 {
            value: v,
            ..Default::default()
        });
        r.memory = MessageField::some(mem);
    }
    r.unified = adj.unified.into_iter().collect();
    if r.cpu.is_none() && r.memory.is_none() && r.unified.is_empty() {
        None
    } else {
        Some(r)
    }
}

/// The ContainerAdjustment for CreateContainer. `with_oom` is false for
/// runtimes that would drop the field anyway (NRI v0.6.1).
pub fn adjustment_to_wire(adj: Adjustment, with_oom: bool) -> api::ContainerAdjustment {
    let mut linux = api::LinuxContainerAdjustment::new();
    let mut any = false;
    let oom_score_adj = adj.oom_score_adj;
    if let Some(r) = resources_to_wire(adj) {
        linux.resources = MessageField::some(r);
        any = true;
    }
    if let (true, Some(v)) = (with_oom, oom_score_adj) {
        linux.oom_score_adj = MessageField::some(api::OptionalInt {
            value: v,
            ..Default::default()
        });
        any = true;
    }
    let mut out = api::ContainerAdjustment::new();
    if any {
        out.linux = MessageField::some(linux);
    }
    out
}

/// A ContainerUpdate for an existing container, or `None` when there is
/// nothing to update through the runtime.
pub fn update_to_wire(
    container_id: &str,
    adj: Adjustment,
    ignore_failure: bool,
) -> Option<api::ContainerUpdate> {
    let resources = resources_to_wire(adj)?;
    let mut linux = api::LinuxContainerUpdate::new();
    linux.resources = MessageField::some(resources);
    let mut u = api::ContainerUpdate::new();
    u.container_id = container_id.to_string();
    u.linux = MessageField::some(linux);
    u.ignore_failure = ignore_failure;
    Some(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_from_cri_mean_unset() {
        let mut r = api::LinuxResources::new();
        let mut cpu = api::LinuxCPU::new();
        cpu.shares = MessageField::some(api::OptionalUInt64 {
            value: 0,
            ..Default::default()
        });
        cpu.quota = MessageField::some(api::OptionalInt64 {
            value: -1,
            ..Default::default()
        });
        cpu.period = MessageField::some(api::OptionalUInt64 {
            value: 100_000,
            ..Default::default()
        });
        r.cpu = MessageField::some(cpu);
        let mut mem = api::LinuxMemory::new();
        mem.limit = MessageField::some(api::OptionalInt64 {
            value: 0,
            ..Default::default()
        });
        r.memory = MessageField::some(mem);
        let got = resources_from_wire(&r);
        assert_eq!(got.cpu_shares, None);
        assert_eq!(got.cpu_quota, None);
        assert_eq!(got.cpu_period, Some(100_000));
        assert_eq!(got.memory_limit, None);
    }

    #[test]
    fn empty_adjustment_sets_nothing() {
        let adj = adjustment_to_wire(Adjustment::default(), true);
        assert!(adj.linux.is_none());
        assert!(update_to_wire("c1", Adjustment::default(), true).is_none());
    }

    #[test]
    fn oom_score_adj_is_left_out_for_old_runtimes() {
        let adj = Adjustment {
            oom_score_adj: Some(-997),
            ..Default::default()
        };
        assert!(adjustment_to_wire(adj.clone(), false).linux.is_none());
        let wire = adjustment_to_wire(adj, true);
        assert_eq!(wire.linux.oom_score_adj.value, -997);
    }

    #[test]
    fn round_trips_resources() {
        let mut unified = BTreeMap::new();
        unified.insert("memory.high".to_string(), "1048576".to_string());
        let adj = Adjustment {
            cpu_shares: Some(1024),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(1 << 30),
            unified: unified.clone(),
            oom_score_adj: None,
        };
        let wire = resources_to_wire(adj).unwrap();
        let back = resources_from_wire(&wire);
        assert_eq!(back.cpu_shares, Some(1024));
        assert_eq!(back.cpu_quota, Some(50_000));
        assert_eq!(back.memory_limit, Some(1 << 30));
        assert_eq!(back.unified, unified);
    }
}
