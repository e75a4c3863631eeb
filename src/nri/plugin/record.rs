//! Deciding a container and recording it in the registry, and who owns a
//! pod cgroup's protection (the kubelet or us); Synchronize is `sync.rs`.

use super::*;
use crate::node::cgroup_files::{MEMORY_HIGH, MEMORY_LOW, MEMORY_MIN};
use crate::nri::view;

impl QosPlugin {
    /// Runs the policy for one container and records the result.
    pub(super) fn decide_and_record(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
        source: view::Source<'_>,
    ) -> qos::Decision {
        let mut pod_facts = convert::pod_from_wire(pod);
        let started = Instant::now();
        let policy = self.live().policy;
        pod_facts.kubelet_memory_qos = self.kubelet_owns_pod(&pod.id, &pod_facts, &policy);
        let (facts, decision) = view::decide(
            &pod_facts,
            container,
            source,
            &self.quirks(),
            (&self.settings.node, &policy),
            self.api_pods.as_deref(),
        );
        let record = container_record(pod, &pod_facts, container, facts, &decision, started);
        let mut pod_record = pod_record_from(&pod.id, pod_facts);
        let mut reg = lock(&self.registry);
        // Most creates are of a pod already known: replace its record in
        // place rather than allocate its key again. Its memory limit stays
        // the one known: a pod-level resize arrives only as UpdatePodSandbox,
        // and later reports of the pod still carry its first resources.
        match reg.pods.get_mut(&pod.id) {
            Some(known) => {
                pod_record.memory_limit = known.memory_limit;
                *known = pod_record;
            }
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
    /// after-start check's (`kubelet_ownership.rs`).
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
        view::limits_from_kernel(&self.settings.cgroup_root, c)
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
        memory_limit: view::pod_memory_limit(facts),
    }
}

/// [`pod_record`] from facts no longer needed: their strings move.
fn pod_record_from(id: &str, facts: qos::PodFacts) -> PodRecord {
    PodRecord {
        id: id.into(),
        memory_limit: view::pod_memory_limit(&facts),
        uid: facts.uid.into(),
        namespace: facts.namespace.into(),
        name: facts.name.into(),
        cgroup_parent: facts.cgroup_parent.into(),
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
    let bytes = |key| view::effective_bytes(&facts.resources, &decision.adjustment, key);
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
        memory_min: bytes(MEMORY_MIN),
        memory_low: bytes(MEMORY_LOW),
        memory_high: bytes(MEMORY_HIGH),
        kubelet_memory_qos: pod_facts.kubelet_memory_qos
            || qos::policy::kubelet_memory_qos_keys(&facts.resources),
        oom_score_adj: decision.adjustment.oom_score_adj.or(facts.oom_score_adj),
        cgroups_path: facts.cgroups_path.into(),
    }
}
