//! Deciding a container and recording it in the registry, and who owns a
//! pod cgroup's protection (the kubelet or us); Synchronize is `sync.rs`.

use super::*;

impl QosPlugin {
    /// Runs the policy for one container and records the result.
    pub(super) fn decide_and_record(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
        resources_override: Option<&api::LinuxResources>,
    ) -> qos::Decision {
        let mut pod_facts = convert::pod_from_wire(pod);
        let started = Instant::now();
        let policy = self.live().policy;
        pod_facts.kubelet_memory_qos = self.kubelet_owns_pod(&pod.id, &pod_facts, &policy);
        let (facts, decision) = decide_wire(
            &pod_facts,
            container,
            resources_override,
            (&self.settings.node, &policy),
            self.api_pods.as_deref(),
        );
        let record = container_record(pod, &pod_facts, container, facts, &decision, started);
        let pod_record = pod_record_from(&pod.id, pod_facts);
        let mut reg = lock(&self.registry);
        // Most creates are of a pod already known: replace its record in
        // place rather than allocate its key again.
        match reg.pods.get_mut(&pod.id) {
            Some(known) => *known = pod_record,
            None => {
                reg.pods.insert(pod.id.clone(), pod_record);
            }
        }
        reg.containers.insert(container.id.clone(), record);
        drop(reg);
        self.notify_changed();
        decision
    }

    /// Whether the kubelet's Memory QoS protects this pod where the runtime
    /// hides its keys (auto mode). Decided once per pod cgroup: when the
    /// plugin first sees the pod, protection already in its cgroup is the
    /// kubelet's (it writes it before creating the sandbox; we only write a
    /// pod after we know it); later the keeper's decision stands, or the
    /// after-start check's (`after_start.rs`).
    pub(super) fn kubelet_owns_pod(
        &self,
        pod_id: &str,
        pod: &qos::PodFacts,
        policy: &PolicyConfig,
    ) -> bool {
        if !self.owners_from_tree(policy) {
            return false;
        }
        let Some(cg) = pod_cgroups(&pod.cgroup_parent) else {
            return false;
        };
        let mut reg = lock(&self.registry);
        if let Some(owner) = reg.owners.get(&cg.pod) {
            return *owner == Owner::Kubelet;
        }
        let first_sight = !reg.pods.contains_key(pod_id);
        if !first_sight {
            return false;
        }
        let Protection { min, low } = read_protection(&self.settings.cgroup_root.join(&cg.pod));
        if min == 0 && low == 0 {
            return false;
        }
        info!(
            cgroup = %cg.pod.display(),
            memory_min = min,
            memory_low = low,
            owner = Owner::Kubelet.label(),
            "pod cgroup protected before its sandbox: the kubelet's Memory QoS owns its protection; container memory.min/low/high left to it"
        );
        reg.owners.insert(cg.pod, Owner::Kubelet);
        true
    }

    pub(super) fn resources_from_kernel(&self, c: &api::Container) -> Option<api::LinuxResources> {
        limits_from_kernel(&self.settings.cgroup_root, c)
    }
}

/// What the registry keeps of a pod the runtime described.
pub(super) fn pod_record(id: &str, facts: &qos::PodFacts) -> PodRecord {
    PodRecord {
        id: id.into(),
        uid: facts.uid.as_str().into(),
        namespace: facts.namespace.as_str().into(),
        name: facts.name.as_str().into(),
        cgroup_parent: facts.cgroup_parent.as_str().into(),
    }
}

/// [`pod_record`] from facts no longer needed: their strings move.
fn pod_record_from(id: &str, facts: qos::PodFacts) -> PodRecord {
    PodRecord {
        id: id.into(),
        uid: facts.uid.into(),
        namespace: facts.namespace.into(),
        name: facts.name.into(),
        cgroup_parent: facts.cgroup_parent.into(),
    }
}

/// Per pod id, the protection nri-qos itself would give the pod cgroup: the
/// sum of its containers' memory.min/low under our policy, in whole pages,
/// with the exact requests of `api_pods` where the plugin has them.
pub fn own_pod_protection(
    containers: &[api::Container],
    pods: &HashMap<&str, &api::PodSandbox>,
    node: &NodeFacts,
    policy: &PolicyConfig,
    api_pods: Option<&dyn ContainerRequests>,
) -> HashMap<String, Protection> {
    let mut sums: HashMap<String, Protection> = HashMap::new();
    for c in containers {
        let Some(pod) = pods.get(c.pod_sandbox_id.as_str()) else {
            continue;
        };
        let pod = convert::pod_from_wire(pod);
        let (facts, d) = decide_wire(&pod, c, None, (node, policy), api_pods);
        let sum = sums.entry(c.pod_sandbox_id.clone()).or_default();
        *sum = add_protection(*sum, own_protection(&facts, &d));
    }
    for sum in sums.values_mut() {
        *sum = whole_pages(*sum);
    }
    sums
}

/// The memory.min/low `decision` gives the container, in bytes.
pub(super) fn own_protection(facts: &qos::ContainerFacts, decision: &qos::Decision) -> Protection {
    let bytes = |k| effective_bytes(&facts.resources, &decision.adjustment, k);
    Protection {
        min: bytes("memory.min"),
        low: bytes("memory.low"),
    }
}

/// A unified key's bytes as the kernel ends up with it; 0 where unset or
/// not a number.
fn effective_bytes(resources: &qos::Resources, adj: &qos::Adjustment, key: &str) -> u64 {
    qos::policy::effective_unified(resources, adj, key)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
}

pub(super) fn add_protection(a: Protection, b: Protection) -> Protection {
    Protection {
        min: a.min.saturating_add(b.min),
        low: a.low.saturating_add(b.low),
    }
}

/// A pod cgroup's sum as the kernel would keep it.
pub(super) fn whole_pages(p: Protection) -> Protection {
    Protection {
        min: p.min - p.min % PAGE_SIZE,
        low: p.low - p.low % PAGE_SIZE,
    }
}

/// Logs the policy's decision for a container and returns what the
/// registry keeps of it (the facts' strings move into it).
pub(super) fn container_record(
    pod: &api::PodSandbox,
    pod_facts: &qos::PodFacts,
    container: &api::Container,
    facts: qos::ContainerFacts,
    decision: &qos::Decision,
    started: Instant,
) -> ContainerRecord {
    debug!(
        pod = %format_args!("{}/{}", pod_facts.namespace, pod_facts.name),
        container = %facts.name,
        class = ?decision.class,
        reason = %decision.reason,
        memory_request = ?decision.memory_request,
        request_source = ?decision.request_source,
        cpu_request_milli = decision.cpu_request_milli,
        adjustment = ?decision.adjustment,
        took_us = crate::node::time::micros(started.elapsed()),
        "policy decision"
    );
    for note in &decision.notes {
        info!(container = %facts.name, pod = %pod_facts.name, "{note}");
    }
    let bytes = |key| effective_bytes(&facts.resources, &decision.adjustment, key);
    ContainerRecord {
        id: container.id.as_str().into(),
        pod_id: if container.pod_sandbox_id.is_empty() {
            pod.id.as_str().into()
        } else {
            container.pod_sandbox_id.as_str().into()
        },
        name: facts.name.into(),
        class: decision.class,
        memory_request: decision.memory_request,
        request_source: decision.request_source,
        memory_min: bytes("memory.min"),
        memory_low: bytes("memory.low"),
        memory_high: bytes("memory.high"),
        kubelet_memory_qos: pod_facts.kubelet_memory_qos
            || qos::policy::kubelet_memory_qos_keys(&facts.resources),
        oom_score_adj: decision.adjustment.oom_score_adj.or(facts.oom_score_adj),
        cgroups_path: facts.cgroups_path.into(),
    }
}

/// The container's limits as the kernel holds them, where they differ
/// from what the runtime reports. CRI-O, restarted after an in-place
/// resize, describes the container in Synchronize with the resources it
/// was created with; its memory.max and cpu.max hold what the kubelet
/// last applied (nri-qos never changes either), and a memory.high
/// derived from the stale limit would throttle the resized container.
/// Synchronize and `nri-qos audit` both decide from these.
/// Whether the runtime, restarted after an in-place resize, reports the
/// container's creation-time resources in Synchronize (only CRI-O does;
/// containerd keeps its report current).
pub fn forgets_resizes(runtime_name: &str) -> bool {
    runtime_name == "cri-o"
}

pub fn limits_from_kernel(
    cgroup_root: &std::path::Path,
    c: &api::Container,
) -> Option<api::LinuxResources> {
    let linux = c.linux.as_ref()?;
    let reported = linux.resources.as_ref()?;
    let dir = cgroup_root.join(container_cgroup_dir(&linux.cgroups_path)?);
    let mut fixed = reported.clone();
    let mut changed = false;
    let reported_limit = reported.memory.limit.as_ref().map(|v| v.value);
    let kernel_limit = cgroupfs::read_trimmed(&dir.join("memory.max"))
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
    let kernel_cpu = cgroupfs::read_trimmed(&dir.join("cpu.max")).and_then(|v| {
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
