//! The pod and container events nri-qos subscribes to, whichever RPC
//! carried them: the event's own RPC (NRI v0.12) or StateChange (every
//! runtime before v0.12, and one of v0.12 that fell back). One code path
//! behind both; `nri_qos_events_total{event,path}` and a log line say which
//! one the runtime uses.

use super::record::pod_record;
use super::*;

/// How an event reached the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventPath {
    /// The event's own RPC: NRI v0.12's per-event RPCs, and CreateContainer,
    /// UpdateContainer, StopContainer and UpdatePodSandbox on every version.
    Dedicated,
    /// StateChange, which NRI v0.12 deprecates.
    StateChange,
}

impl EventPath {
    pub fn label(self) -> &'static str {
        match self {
            EventPath::Dedicated => "dedicated",
            EventPath::StateChange => "state_change",
        }
    }

    fn bit(self) -> u8 {
        match self {
            EventPath::Dedicated => 1,
            EventPath::StateChange => 2,
        }
    }
}

/// The `event` label of an event (the NRI name in snake case).
pub fn event_label(e: api::Event) -> &'static str {
    use api::Event as E;
    match e {
        E::RUN_POD_SANDBOX => "run_pod_sandbox",
        E::STOP_POD_SANDBOX => "stop_pod_sandbox",
        E::REMOVE_POD_SANDBOX => "remove_pod_sandbox",
        E::CREATE_CONTAINER => "create_container",
        E::POST_CREATE_CONTAINER => "post_create_container",
        E::START_CONTAINER => "start_container",
        E::POST_START_CONTAINER => "post_start_container",
        E::UPDATE_CONTAINER => "update_container",
        E::POST_UPDATE_CONTAINER => "post_update_container",
        E::STOP_CONTAINER => "stop_container",
        E::REMOVE_CONTAINER => "remove_container",
        E::UPDATE_POD_SANDBOX => "update_pod_sandbox",
        E::POST_UPDATE_POD_SANDBOX => "post_update_pod_sandbox",
        E::VALIDATE_CONTAINER_ADJUSTMENT => "validate_container_adjustment",
        E::UNKNOWN | E::LAST => "other",
    }
}

/// The events a runtime may send either way: the others have only their
/// own RPC, so they say nothing of the path a runtime takes.
fn has_two_forms(e: api::Event) -> bool {
    use api::Event as E;
    !matches!(
        e,
        E::CREATE_CONTAINER
            | E::UPDATE_CONTAINER
            | E::STOP_CONTAINER
            | E::UPDATE_POD_SANDBOX
            | E::VALIDATE_CONTAINER_ADJUSTMENT
    )
}

impl QosPlugin {
    /// Counts an event by its path and logs it; says once per session
    /// which path the runtime takes for the events that have two.
    pub(super) fn note_event(&self, event: api::Event, path: EventPath) {
        let label = event_label(event);
        self.metrics.record_event(label, path.label());
        debug!(event = label, path = path.label(), "event");
        if !has_two_forms(event) {
            return;
        }
        let bit = path.bit();
        if self.paths_seen.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            let q = self.quirks();
            info!(
                event = label,
                path = path.label(),
                runtime = %q.name,
                nri_version = %q.nri_label(),
                "the runtime delivers pod and container events on this path"
            );
        }
    }

    /// A pod or container event without an answer of its own (the runtime
    /// only waits for it), on either path: what it changes in the registry.
    pub(super) fn on_event(
        &self,
        event: api::Event,
        pod: &api::PodSandbox,
        container: &api::Container,
        path: EventPath,
    ) {
        self.note_event(event, path);
        match event {
            api::Event::RUN_POD_SANDBOX => self.run_pod(pod),
            api::Event::POST_START_CONTAINER => {
                self.oom_fallback(container);
                self.repair_start_race(container);
                self.learn_owner_after_start(container);
            }
            api::Event::REMOVE_CONTAINER => {
                lock(&self.created_at_sync).remove(&container.id);
                self.forget_container(&container.id);
            }
            api::Event::REMOVE_POD_SANDBOX => self.forget_pod(&pod.id),
            other => debug!(event = ?other, "event ignored"),
        }
    }

    /// RunPodSandbox: the pod is known from now on, and whether the
    /// kubelet protected its cgroup first is decided.
    fn run_pod(&self, pod: &api::PodSandbox) {
        let facts = convert::pod_from_wire(pod);
        self.kubelet_owns_pod(&pod.id, &facts, &self.live().policy);
        lock(&self.registry)
            .pods
            .insert(pod.id.clone(), pod_record(&pod.id, &facts));
        self.notify_changed();
    }
}

impl QosPlugin {
    /// UpdatePodSandbox: a pod-level resize (KEP-5419; containerd 2.3 and
    /// CRI-O 1.37 send it for CRI UpdatePodSandboxResources), with the
    /// pod's new resources. Answered at once and never refused. What
    /// derives from them here is the pod's memory limit, which bounds its
    /// protection (the keeper, told now) and the request the monitor ranks
    /// it by; the class stays as the pod was created (KEP-1287/5419). Its
    /// containers' own limits, and the memory.high nri-qos derives from
    /// them, change through the UpdateContainer the kubelet sends for every
    /// container that inherits the pod's limit.
    pub(super) fn pod_resized(
        &self,
        pod: &api::PodSandbox,
        resources: Option<&api::LinuxResources>,
    ) {
        let Some(resources) = resources else {
            debug!(pod = %pod.id, "pod-level update without resources; nothing to do");
            return;
        };
        let mut facts = convert::pod_from_wire(pod);
        facts.resources = Some(convert::resources_from_wire(resources));
        let limit = crate::nri::view::pod_memory_limit(&facts);
        let mut reg = lock(&self.registry);
        let was = reg.pods.get(&pod.id).and_then(|p| p.memory_limit);
        match reg.pods.get_mut(&pod.id) {
            Some(known) => known.memory_limit = limit,
            None => {
                reg.pods.insert(pod.id.clone(), pod_record(&pod.id, &facts));
            }
        }
        drop(reg);
        info!(
            pod = %format_args!("{}/{}", facts.namespace, facts.name),
            memory_limit_was = ?was,
            memory_limit = ?limit,
            "pod-level resources resized"
        );
        self.notify_changed();
    }
}
