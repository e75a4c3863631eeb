//! The runtime's report of a container read the way nri-qos decides from
//! it, by the plugin (events, Synchronize) and `nri-qos audit` alike: the
//! CRI's request without nri-qos's own earlier adjustment, the limits the
//! kernel holds where the runtime forgot a resize, the policy's decision,
//! and the protection nri-qos itself would give a pod.
//!
//! **Our keys are never the kubelet's.** A runtime that shows plugins the
//! CRI's `unified` map (NRI v0.10 on) builds it from the container's OCI
//! spec, which holds every plugin's adjustment too: after a restart its
//! Synchronize reports the kubelet's keys and nri-qos's own memory.low
//! merged. nri-qos only ever adds a key the CRI request did not carry, and
//! names the keys it added in an annotation of the same adjustment
//! ([`OWN_UNIFIED_ANNOTATION`]), which the runtime keeps in the same spec:
//! taking those keys back out leaves the CRI's map as the kubelet sent it.
//! docs/runtimes.md says why this holds on containerd and CRI-O.

use std::collections::HashMap;
use std::path::Path;

use tracing::info;

use super::convert;
use super::proto::api;
use crate::node::cgroup_files::{
    CPU_MAX, CPU_WEIGHT, MEMORY_HIGH, MEMORY_LOW, MEMORY_MAX, MEMORY_MIN,
};
use crate::node::cgroupfs::{self, Protection, PAGE_SIZE};
use crate::node::layout::container_cgroup_dir;
use crate::node::registry::ContainerRequests;
use crate::node::runtime::RuntimeQuirks;
use crate::qos::{self, NodeFacts, PolicyConfig, QosClass};

mod kubelet_keys;

pub use kubelet_keys::{
    hidden_kubelet_key, known_keys, kubelet_may_set, only_the_kubelets,
    pods_with_hidden_kubelet_keys, NOT_THE_KUBELETS,
};

/// The container annotation nri-qos adds with every adjustment it returns
/// at creation: the `unified` keys it set, comma-separated and sorted
/// (empty: none).
pub const OWN_UNIFIED_ANNOTATION: &str = "qos.nri-qos.io/unified";

/// Whether the plugin or `audit` reads the container annotation `key`:
/// the policy's and [`OWN_UNIFIED_ANNOTATION`]. No other is kept of a
/// container the runtime describes in Synchronize.
pub fn reads_container_annotation(key: &str) -> bool {
    key == OWN_UNIFIED_ANNOTATION || qos::policy::reads_container_annotation(key)
}

/// The `unified` keys the policy may set. Only these can be claimed as
/// ours, whatever the annotation says.
const OWN_KEYS: [&str; 4] = [CPU_WEIGHT, MEMORY_HIGH, MEMORY_LOW, MEMORY_MIN];

/// The only key of [`OWN_KEYS`] the kubelet never sends (it passes CPU as
/// shares): in a report without our annotation it says nri-qos adjusted
/// the container without naming its keys (a Synchronize update, which
/// cannot carry an annotation).
const NEVER_THE_KUBELETS: &str = CPU_WEIGHT;

/// The policy's rules: the node and the policy in force.
pub type Rules<'a> = (&'a NodeFacts, &'a PolicyConfig);

/// The CreateContainer adjustment for `adj`: the policy's values, and the
/// annotation naming the `unified` keys among them. `with_oom` is false for
/// runtimes that would drop the field anyway (NRI v0.6).
pub fn create_adjustment(adj: qos::Adjustment, with_oom: bool) -> api::ContainerAdjustment {
    let keys: Vec<&str> = adj.unified.keys().map(String::as_str).collect();
    let annotation = keys.join(",");
    let mut wire = convert::adjustment_to_wire(adj, with_oom);
    wire.annotations
        .insert(OWN_UNIFIED_ANNOTATION.to_string(), annotation);
    wire
}

/// Where a container's resources come from for a decision.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// The runtime's report of the container.
    Reported,
    /// UpdateContainer's new resources: the CRI's request as the kubelet
    /// sent it, nothing of ours in it.
    CriRequest(&'a api::LinuxResources),
    /// The report, with the memory and CPU limits the kernel holds
    /// ([`limits_from_kernel`]: a resize the runtime forgot).
    KernelLimits(&'a api::LinuxResources),
}

/// The container as the policy sees it: the runtime's report with our own
/// `unified` keys taken out ([`as_the_cri_sent`]), or the CRI's new request.
pub fn container_facts(
    c: &api::Container,
    source: Source<'_>,
    quirks: &RuntimeQuirks,
) -> qos::ContainerFacts {
    let mut facts = convert::container_from_wire(c);
    match source {
        Source::Reported => as_the_cri_sent(&mut facts, quirks.shows_unified),
        Source::CriRequest(r) => {
            facts.resources = convert::resources_from_wire(r);
            facts.unified_shown = quirks.shows_unified;
        }
        Source::KernelLimits(r) => {
            as_the_cri_sent(&mut facts, quirks.shows_unified);
            let kernel = convert::resources_from_wire(r);
            facts.resources.memory_limit = kernel.memory_limit;
            facts.resources.cpu_quota = kernel.cpu_quota;
            facts.resources.cpu_period = kernel.cpu_period;
        }
    }
    facts
}

/// Takes nri-qos's own keys out of a reported `unified` map, by the
/// annotation that names them. A report of a container nri-qos adjusted
/// without naming its keys (it holds cpu.weight, which only nri-qos sets)
/// cannot tell whose its memory keys are: they are left out as well, and
/// the map counts as hidden, so ownership is decided from the cgroup tree
/// as on a runtime that shows plugins no `unified` map.
fn as_the_cri_sent(facts: &mut qos::ContainerFacts, shows_unified: bool) {
    let unified = &mut facts.resources.unified;
    match facts.annotations.get(OWN_UNIFIED_ANNOTATION) {
        Some(ours) => {
            let ours = ours.split(',').map(str::trim);
            for key in ours.filter(|k| OWN_KEYS.contains(k)) {
                unified.remove(key);
            }
            facts.unified_shown = shows_unified;
        }
        None if unified.contains_key(NEVER_THE_KUBELETS) => {
            for key in OWN_KEYS {
                unified.remove(key);
            }
            facts.unified_shown = false;
        }
        None => facts.unified_shown = shows_unified,
    }
}

/// A container the runtime described as the policy sees it
/// ([`container_facts`]), with the API's exact request where the plugin
/// has one, and its decision.
pub fn decide(
    pod: &qos::PodFacts,
    c: &api::Container,
    source: Source<'_>,
    quirks: &RuntimeQuirks,
    (node, policy): Rules<'_>,
    api_pods: Option<&dyn ContainerRequests>,
) -> (qos::ContainerFacts, qos::Decision) {
    let mut facts = container_facts(c, source, quirks);
    facts.api_memory_request = api_pods.and_then(|a| a.container_request(&pod.uid, &c.name));
    let decision = decide_or_leave_alone(pod, &facts, node, policy);
    (facts, decision)
}

/// The policy, or no adjustment at all should it ever panic. It is pure and
/// property-tested never to, but a panicking handler never answers, and the
/// runtime turns that into a failed container creation after its timeout:
/// a container without our values is the lesser harm.
fn decide_or_leave_alone(
    pod: &qos::PodFacts,
    container: &qos::ContainerFacts,
    node: &NodeFacts,
    policy: &PolicyConfig,
) -> qos::Decision {
    let run = std::panic::AssertUnwindSafe(|| qos::decide(pod, container, node, policy));
    std::panic::catch_unwind(run).unwrap_or_else(|_| {
        tracing::error!(
            pod = %format_args!("{}/{}", pod.namespace, pod.name),
            container = %container.name,
            "the QoS policy panicked (a bug: please report it with this line); leaving the container as the runtime made it"
        );
        qos::Decision {
            // Unknown to us; Burstable neither protects it nor ranks it first.
            class: QosClass::Burstable,
            reason: "policy failed; no adjustment".into(),
            memory_request: None,
            request_source: qos::RequestSource::Unknown,
            cpu_request_milli: 0,
            adjustment: qos::Adjustment::default(),
            notes: Vec::new(),
        }
    })
}

/// The pod-level memory limit the runtime sent, in bytes (see
/// `node::registry::PodRecord::memory_limit`).
pub fn pod_memory_limit(pod: &qos::PodFacts) -> Option<u64> {
    let limit = pod.resources.as_ref()?.memory_limit?;
    u64::try_from(limit).ok().filter(|l| *l > 0)
}

/// Per pod id, the protection nri-qos itself would give the pod cgroup: the
/// sum of its containers' memory.min/low under our policy, in whole pages,
/// with the exact requests of `api_pods` where the plugin has them.
pub fn own_pod_protection(
    containers: &[api::Container],
    pods: &HashMap<&str, &api::PodSandbox>,
    quirks: &RuntimeQuirks,
    rules: Rules<'_>,
    api_pods: Option<&dyn ContainerRequests>,
) -> HashMap<String, Protection> {
    let mut sums: HashMap<String, Protection> = HashMap::new();
    for c in containers {
        let Some(pod) = pods.get(c.pod_sandbox_id.as_str()) else {
            continue;
        };
        let pod = convert::pod_from_wire(pod);
        let (facts, d) = decide(&pod, c, Source::Reported, quirks, rules, api_pods);
        let sum = sums.entry(c.pod_sandbox_id.clone()).or_default();
        *sum = add_protection(*sum, own_protection(&facts, &d));
    }
    for sum in sums.values_mut() {
        *sum = whole_pages(*sum);
    }
    sums
}

/// The memory.min/low `decision` gives the container, in bytes.
pub fn own_protection(facts: &qos::ContainerFacts, decision: &qos::Decision) -> Protection {
    let bytes = |k| effective_bytes(&facts.resources, &decision.adjustment, k);
    Protection {
        min: bytes(MEMORY_MIN),
        low: bytes(MEMORY_LOW),
    }
}

/// A unified key's bytes as the kernel ends up with it; 0 where unset or
/// not a number.
pub fn effective_bytes(resources: &qos::Resources, adj: &qos::Adjustment, key: &str) -> u64 {
    qos::policy::effective_unified(resources, adj, key)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
}

pub fn add_protection(a: Protection, b: Protection) -> Protection {
    Protection {
        min: a.min.saturating_add(b.min),
        low: a.low.saturating_add(b.low),
    }
}

/// A pod cgroup's sum as the kernel would keep it.
pub fn whole_pages(p: Protection) -> Protection {
    Protection {
        min: p.min - p.min % PAGE_SIZE,
        low: p.low - p.low % PAGE_SIZE,
    }
}

/// The container's limits as the kernel holds them, where they differ
/// from what the runtime reports. A runtime that forgets resizes
/// ([`RuntimeQuirks::forgets_resizes`]: CRI-O), restarted after an in-place
/// resize, describes the container in Synchronize with the resources it
/// was created with; its memory.max and cpu.max hold what the kubelet
/// last applied (nri-qos never changes either), and a memory.high
/// derived from the stale limit would throttle the resized container.
/// Synchronize and `nri-qos audit` both decide from these
/// ([`Source::KernelLimits`]).
pub fn limits_from_kernel(cgroup_root: &Path, c: &api::Container) -> Option<api::LinuxResources> {
    let linux = c.linux.as_ref()?;
    let reported = linux.resources.as_ref()?;
    let dir = cgroup_root.join(container_cgroup_dir(&linux.cgroups_path)?);
    let mut fixed = reported.clone();
    let mut changed = false;
    let reported_limit = reported.memory.limit.as_ref().map(|v| v.value);
    let kernel_limit = cgroupfs::read_trimmed(&dir.join(MEMORY_MAX))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| *v > 0);
    if let (Some(was), Some(now)) = (reported_limit.filter(|v| *v > 0), kernel_limit) {
        // The kernel keeps whole pages: compare what it would have kept.
        let page = i64::try_from(PAGE_SIZE).unwrap_or(4096);
        if was / page * page != now {
            fixed
                .memory
                .mut_or_insert_default()
                .limit
                .mut_or_insert_default()
                .value = now;
            changed = true;
        }
    }
    let reported_quota = reported.cpu.quota.as_ref().map(|v| v.value);
    let reported_period = reported.cpu.period.as_ref().map(|v| v.value);
    let kernel_cpu = cgroupfs::read_trimmed(&dir.join(CPU_MAX)).and_then(|v| {
        let (quota, period) = v.split_once(' ')?;
        Some((quota.parse::<i64>().ok()?, period.parse::<u64>().ok()?))
    });
    if let (Some(was), Some((quota, period))) = (reported_quota.filter(|v| *v > 0), kernel_cpu) {
        if (was, reported_period) != (quota, Some(period)) {
            let cpu = fixed.cpu.mut_or_insert_default();
            cpu.quota.mut_or_insert_default().value = quota;
            cpu.period.mut_or_insert_default().value = period;
            changed = true;
        }
    }
    if changed {
        info!(
            container = %c.id,
            reported_memory_limit = ?reported_limit,
            kernel_memory_limit = ?kernel_limit,
            reported_cpu_quota = ?reported_quota,
            kernel_cpu = ?kernel_cpu,
            "the runtime reported limits the kernel no longer holds (a resize before the runtime restarted); deciding from the kernel's"
        );
    }
    changed.then_some(fixed)
}

#[cfg(test)]
mod tests;
