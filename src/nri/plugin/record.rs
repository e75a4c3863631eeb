//! Deciding a container and recording it in the registry, Synchronize,
//! and who owns a pod cgroup's protection (the kubelet or us).

use super::after_start;
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
        let mut facts = convert::container_from_wire(container);
        if let Some(r) = resources_override {
            facts.resources = convert::resources_from_wire(r);
        }
        if let Some(api) = &self.api_pods {
            facts.api_memory_request = api.container_request(&pod_facts.uid, &facts.name);
        }
        let started = Instant::now();
        let policy = self.live().policy;
        pod_facts.kubelet_memory_qos = self.kubelet_owns_pod(&pod.id, &pod_facts, &policy);
        let decision = decide_or_leave_alone(&pod_facts, &facts, &self.settings.node, &policy);
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

    /// After a restart nothing says what we wrote before: a pod cgroup with
    /// more protection than our own policy gives its containers (`sums`,
    /// see [`own_pod_protection`]) was protected by the kubelet (the keeper
    /// and `audit` apply the same rule), and its containers must not get
    /// ours in this Synchronize either.
    fn recover_pod_owners(&self, pods: &[api::PodSandbox], sums: &HashMap<String, Protection>) {
        let mut reg = lock(&self.registry);
        for p in pods {
            let Some(cg) = pod_cgroups(&p.linux.cgroup_parent) else {
                continue;
            };
            if reg.owners.contains_key(&cg.pod) {
                continue;
            }
            let on_disk = read_protection(&self.settings.cgroup_root.join(&cg.pod));
            let ours = sums.get(p.id.as_str()).copied().unwrap_or_default();
            if cgroupfs::exceeds(on_disk, ours) {
                info!(
                    cgroup = %cg.pod.display(),
                    memory_min = on_disk.min,
                    memory_low = on_disk.low,
                    owner = Owner::Kubelet.label(),
                    "pod cgroup holds more protection than nri-qos would write: the kubelet's Memory QoS owns it"
                );
                reg.owners.insert(cg.pod, Owner::Kubelet);
            }
        }
    }

    /// A running container whose memory.high the monitor's throttle guard
    /// raised keeps it until it restarts or is resized: a plugin restart
    /// must not throttle it again.
    fn keep_relaxed_high(&self, c: &api::Container, adjustment: &mut qos::Adjustment) {
        let Some(want) = adjustment.unified.get("memory.high") else {
            return;
        };
        let cgroups_path = c.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
        let Some(rel) = container_cgroup_dir(cgroups_path) else {
            return;
        };
        let dir = self.settings.cgroup_root.join(rel);
        if cgroupfs::relaxed_in_tree(&dir, want) {
            info!(container = %c.id, wanted = %want, "memory.high was relaxed by the throttle guard; leaving it");
            adjustment.unified.remove("memory.high");
        }
    }

    pub(super) fn resources_from_kernel(&self, c: &api::Container) -> Option<api::LinuxResources> {
        limits_from_kernel(&self.settings.cgroup_root, c)
    }

    /// Rebuilds the registry from a whole Synchronize and returns the
    /// updates for containers that already run. Each pod is converted once;
    /// the new records replace the old ones in one step at the end (the
    /// owners are kept).
    pub(super) fn finish_sync(&self, whole: Complete) -> Vec<api::ContainerUpdate> {
        // Only CRI-O describes a resized container with its creation-time
        // resources after a restart; elsewhere the report is current and
        // two file reads per container would only slow the sync.
        let forgets_resizes = self
            .runtime_info()
            .is_some_and(|r| forgets_resizes(&r.name));
        let buf = whole.snapshot;
        let live = self.live();
        let policy = &*live.policy;
        let node = &self.settings.node;
        // Of two pods with one id, the later one describes it (as a map keeps it).
        let mut pods: HashMap<&str, (&api::PodSandbox, qos::PodFacts)> =
            HashMap::with_capacity(buf.pods.len());
        for p in &buf.pods {
            pods.insert(p.id.as_str(), (p, convert::pod_from_wire(p)));
        }
        // Where the kubelet's Memory QoS may protect pods unseen, the sums
        // of our own decisions per pod tell who protected each pod cgroup
        // (see `recover_pod_owners`). Those decisions are not kept for the
        // pass below: holding every container's facts and decision at once
        // raised the peak and the RSS left after the sync by megabytes.
        if self.owners_from_tree(policy) {
            let mut sums = HashMap::new();
            // Running containers and the keys we would give them: one may
            // hold a key the kubelet set where we did not (as at its start).
            let mut started = Vec::new();
            for c in &buf.containers {
                let Some((p, pod)) = pods.get(c.pod_sandbox_id.as_str()) else {
                    continue;
                };
                let mut facts = convert::container_from_wire(c);
                if let Some(api) = &self.api_pods {
                    facts.api_memory_request = api.container_request(&pod.uid, &c.name);
                }
                let d = decide_or_leave_alone(pod, &facts, node, policy);
                add_own_protection(&mut sums, &c.pod_sandbox_id, &facts, &d);
                if c.state.enum_value() == Ok(api::ContainerState::CONTAINER_RUNNING) {
                    let path = c.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
                    started.push((*p, path, after_start::known_keys(&facts, &d)));
                }
            }
            self.recover_pod_owners(&buf.pods, &whole_pages(sums));
            for (p, path, known) in started {
                self.kubelet_keys_in_started(&p.id, &p.linux.cgroup_parent, path, known);
            }
            // In a Synchronize nothing is seen for the first time: a pod is
            // the kubelet's only where the rule above (or before) said so.
            let reg = lock(&self.registry);
            for (_, facts) in pods.values_mut() {
                facts.kubelet_memory_qos = pod_cgroups(&facts.cgroup_parent)
                    .is_some_and(|cg| reg.owners.get(&cg.pod) == Some(&Owner::Kubelet));
            }
        }
        // Every pod is known before its containers are decided; a pod id
        // sent twice keeps its first description until one of its
        // containers is recorded with the later one.
        let mut new_pods: HashMap<String, PodRecord> = HashMap::with_capacity(buf.pods.len());
        let mut described_twice = Vec::new();
        for p in &buf.pods {
            if !new_pods.contains_key(&p.id) {
                let (last, facts) = &pods[p.id.as_str()];
                let record = if std::ptr::eq(*last, p) {
                    pod_record(&p.id, facts)
                } else {
                    described_twice.push(p.id.as_str());
                    pod_record(&p.id, &convert::pod_from_wire(p))
                };
                new_pods.insert(p.id.clone(), record);
            }
        }
        let mut new_containers: HashMap<String, ContainerRecord> =
            HashMap::with_capacity(buf.containers.len());
        let mut updates = Vec::new();
        let mut skipped = 0usize;
        for (i, c) in buf.containers.iter().enumerate() {
            // Answer in time with what we have rather than be dropped for
            // being late; the rest is learnt from later events.
            if i % 64 == 0 && whole.answer_by.is_some_and(|t| Instant::now() > t) {
                skipped = buf.containers.len() - i;
                break;
            }
            let Some((pod, pod_facts)) = pods.get(c.pod_sandbox_id.as_str()) else {
                debug!(container = %c.id, "synchronized container without a known pod; skipped");
                continue;
            };
            let started = Instant::now();
            let from_kernel = forgets_resizes
                .then(|| self.resources_from_kernel(c))
                .flatten();
            let api_request = self
                .api_pods
                .as_ref()
                .and_then(|api| api.container_request(&pod_facts.uid, &c.name));
            let mut facts = convert::container_from_wire(c);
            if let Some(r) = &from_kernel {
                facts.resources = convert::resources_from_wire(r);
            }
            facts.api_memory_request = api_request;
            let decision = decide_or_leave_alone(pod_facts, &facts, node, policy);
            let record = container_record(pod, pod_facts, c, facts, &decision, started);
            new_containers.insert(c.id.clone(), record);
            if described_twice.contains(&pod.id.as_str()) {
                new_pods.insert(pod.id.clone(), pod_record(&pod.id, pod_facts));
            }
            let running = matches!(
                c.state.enum_value(),
                Ok(api::ContainerState::CONTAINER_RUNNING | api::ContainerState::CONTAINER_CREATED)
            );
            if !self.settings.adjust_existing || live.dry_run || !running {
                continue;
            }
            let mut adjustment = decision.adjustment;
            self.keep_relaxed_high(c, &mut adjustment);
            // oom_score_adj cannot travel in an update; the runtime applies
            // the rest through UpdateContainerResources.
            if let Some(u) = convert::update_to_wire(&c.id, adjustment, true) {
                updates.push(u);
            }
        }
        {
            let mut reg = lock(&self.registry);
            reg.pods = new_pods;
            reg.containers = new_containers;
        }
        self.notify_changed();
        let mut counters = lock(&self.counters);
        counters.synchronized += buf.containers.len() as u64;
        counters.updated += updates.len() as u64;
        info!(
            pods = buf.pods.len(),
            containers = buf.containers.len(),
            updates = updates.len(),
            "synchronized with the runtime"
        );
        if whole.dropped + skipped > 0 {
            warn!(
                dropped = whole.dropped,
                not_decided = skipped,
                "Synchronize was partial (see the reassembly bounds); the rest is handled as events arrive"
            );
        }
        updates
    }
}

/// What the registry keeps of a pod the runtime described.
pub(super) fn pod_record(id: &str, facts: &qos::PodFacts) -> PodRecord {
    PodRecord {
        id: id.to_string(),
        uid: facts.uid.clone(),
        namespace: facts.namespace.clone(),
        name: facts.name.clone(),
        cgroup_parent: facts.cgroup_parent.clone(),
    }
}

/// [`pod_record`] from facts no longer needed: their strings move.
fn pod_record_from(id: &str, facts: qos::PodFacts) -> PodRecord {
    PodRecord {
        id: id.to_string(),
        uid: facts.uid,
        namespace: facts.namespace,
        name: facts.name,
        cgroup_parent: facts.cgroup_parent,
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
    let mut sums = HashMap::new();
    for c in containers {
        let Some(pod) = pods.get(c.pod_sandbox_id.as_str()) else {
            continue;
        };
        let mut facts = convert::container_from_wire(c);
        facts.api_memory_request = api_pods.and_then(|a| a.container_request(&pod.uid, &c.name));
        let d = decide_or_leave_alone(&convert::pod_from_wire(pod), &facts, node, policy);
        add_own_protection(&mut sums, &c.pod_sandbox_id, &facts, &d);
    }
    whole_pages(sums)
}

/// Adds what `decision` gives the container to its pod's sum.
fn add_own_protection(
    sums: &mut HashMap<String, Protection>,
    pod_id: &str,
    facts: &qos::ContainerFacts,
    decision: &qos::Decision,
) {
    let eff = qos::policy::effective(&facts.resources, &decision.adjustment);
    let bytes = |k: &str| {
        eff.unified
            .get(k)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let e = sums.entry(pod_id.to_string()).or_default();
    e.min = e.min.saturating_add(bytes("memory.min"));
    e.low = e.low.saturating_add(bytes("memory.low"));
}

fn whole_pages(mut sums: HashMap<String, Protection>) -> HashMap<String, Protection> {
    for p in sums.values_mut() {
        p.min -= p.min % PAGE_SIZE;
        p.low -= p.low % PAGE_SIZE;
    }
    sums
}

/// Logs the policy's decision for a container and returns what the
/// registry keeps of it (the facts' strings move into it).
fn container_record(
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
    let unified = &decision.adjustment.unified;
    let bytes = |key: &str| {
        unified
            .get(key)
            .or_else(|| facts.resources.unified.get(key))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    ContainerRecord {
        id: container.id.clone(),
        pod_id: if container.pod_sandbox_id.is_empty() {
            pod.id.clone()
        } else {
            container.pod_sandbox_id.clone()
        },
        name: facts.name,
        class: decision.class,
        memory_request: decision.memory_request,
        request_source: decision.request_source,
        memory_min: bytes("memory.min"),
        memory_low: bytes("memory.low"),
        memory_high: bytes("memory.high"),
        kubelet_memory_qos: pod_facts.kubelet_memory_qos
            || qos::policy::kubelet_memory_qos_keys(&facts.resources),
        oom_score_adj: decision.adjustment.oom_score_adj.or(facts.oom_score_adj),
        cgroups_path: facts.cgroups_path,
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
