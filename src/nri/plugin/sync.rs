//! Synchronize: the registry rebuilt from every pod and container the
//! runtime knows, and the updates for the containers that already run.
//!
//! Pod by pod, each container is decided once: a pod's own protection sum
//! (who protected its cgroup after a restart) needs only its containers,
//! and only a pod the kubelet turns out to own is decided again. The
//! reassembler holds the Synchronize as bytes of the fields we read, and a
//! pod's containers are decoded only for its turn: decoded whole, the
//! request took ~1.5 KB of heap per container beside the new registry,
//! the sync's peak.

use std::borrow::Cow;
use std::ops::Range;

use protobuf::Message;

use super::record::{container_record, pod_record};
use super::*;
use crate::node::layout::{container_cgroup_dir_in, PodCgroups};
use crate::nri::convert::OnUpdateFailure;
use crate::nri::lean_sync::{self, Object};
use crate::nri::view::{self, add_protection, own_protection, whole_pages};

/// One container of a pod being synchronized: its index among the pod's
/// members, its facts and decision, and when deciding it started.
type Decided = (usize, qos::ContainerFacts, qos::Decision, Instant);

/// A pod's containers: each one's index in the order sent, and itself.
type Members<'a> = [(usize, Cow<'a, api::Container>)];

/// The pods and containers of a Synchronize as the reassembler holds
/// them, each decoded when its pod's turn comes, so that the whole decoded
/// request is never alive at once.
pub(super) struct SyncSource {
    bytes: Vec<u8>,
    index: lean_sync::Indexed,
}

impl SyncSource {
    fn pods(&self) -> usize {
        self.index.pods.len()
    }

    fn pod_id(&self, p: usize) -> &str {
        &self.index.pods[p].1
    }

    fn pod(&self, p: usize) -> Option<Cow<'_, api::PodSandbox>> {
        located(&self.bytes, &self.index.pods[p].0, lean_sync::decode_pod)
    }

    fn containers(&self) -> usize {
        self.index.containers.len()
    }

    /// The id of the pod the `i`th container names.
    fn container_pod_id(&self, i: usize) -> Option<&str> {
        self.index.containers[i].1.map(|p| self.pod_id(p))
    }

    fn container(&self, i: usize) -> Option<Cow<'_, api::Container>> {
        located(
            &self.bytes,
            &self.index.containers[i].0,
            lean_sync::decode_container,
        )
    }
}

/// An object located by lean_sync, which decoded each one once: it
/// decodes again.
fn located<'a, T: Clone>(
    bytes: &[u8],
    at: &Range<usize>,
    decode: fn(&[u8]) -> protobuf::Result<T>,
) -> Option<Cow<'a, T>> {
    let decoded = decode(bytes.get(at.clone())?);
    decoded
        .map_err(|e| warn!(error = %e, "a located object did not decode; skipped"))
        .ok()
        .map(Cow::Owned)
}

#[async_trait]
impl lean_sync::SynchronizeEncoded for QosPlugin {
    /// Every Synchronize, one message or chunks, goes to the reassembler
    /// still encoded; its request's bytes are freed before the pods are
    /// decided.
    async fn synchronize_encoded(
        &self,
        ctx: &TtrpcContext,
        payload: Vec<u8>,
    ) -> ttrpc::Result<Vec<u8>> {
        let whole = self.push_sync(&payload, ctx)?;
        drop(payload);
        let Some(whole) = whole else {
            return more_to_come()
                .write_to_bytes()
                .map_err(lean_sync::not_encodable);
        };
        let answer = self.sync_whole(whole).into_response();
        self.synchronized.send_replace(true);
        answer.map_err(lean_sync::not_encodable)
    }
}

/// The answer to every chunk but the last: with more=true and no updates,
/// or the runtime drops the plugin.
pub(super) fn more_to_come() -> api::SynchronizeResponse {
    api::SynchronizeResponse {
        more: true,
        ..Default::default()
    }
}

/// What the plugin builds from one object of a Synchronize once it is
/// whole, beside the object's own bytes (see [`crate::nri::reassembly`]):
/// its registry record (the strings it copies, a map key among them), its
/// slot in the index and the registry's table, and a container's update.
/// Measured by `tests/wire_bounds.rs` against the process's peak.
pub(crate) fn sync_cost(o: &Object) -> usize {
    match o {
        Object::Pod(p) => {
            let cgroup_parent = p.linux.as_ref().map_or(0, |l| l.cgroup_parent.len());
            POD_COST
                + 3 * p.id.len()
                + p.uid.len()
                + p.namespace.len()
                + p.name.len()
                + cgroup_parent
        }
        Object::Container(c) => {
            let path = c.linux.as_ref().map_or(0, |l| l.cgroups_path.len());
            CONTAINER_COST + 2 * c.id.len() + c.pod_sandbox_id.len() + c.name.len() + path
        }
    }
}

/// The fixed part of [`sync_cost`] (allocation overheads included).
const POD_COST: usize = 512;
const CONTAINER_COST: usize = 640;

impl QosPlugin {
    /// Hands one Synchronize message to the reassembler; the whole
    /// Synchronize once its last chunk is in.
    pub(super) fn push_sync(
        &self,
        message: &[u8],
        ctx: &TtrpcContext,
    ) -> ttrpc::Result<Option<Complete>> {
        let timeout = crate::nri::session::request_timeout(ctx);
        lock(&self.sync)
            .push(message, timeout, Instant::now())
            .map_err(lean_sync::invalid_request)
    }

    /// [`Self::sync_pods`] of a whole Synchronize, the updates as messages.
    pub(super) fn finish_sync(&self, whole: Complete) -> Vec<api::ContainerUpdate> {
        self.sync_whole(whole).in_order_sent()
    }

    /// [`Self::sync_pods`] of a whole Synchronize.
    fn sync_whole(&self, whole: Complete) -> EncodedUpdates {
        let Complete {
            held,
            dropped,
            answer_by,
        } = whole;
        // Our own encoding: it always indexes.
        let index = lean_sync::index_synchronize(&held.bytes).unwrap_or_else(|e| {
            warn!(error = %e, "the Synchronize held did not index; answered empty");
            lean_sync::Indexed::default()
        });
        let source = SyncSource {
            bytes: held.bytes,
            index,
        };
        self.sync_pods(source, dropped, answer_by)
    }

    /// Rebuilds the registry from a whole Synchronize and returns the
    /// updates for containers that already run, encoded. The new
    /// records replace the old ones in one step at the end (the owners are
    /// kept).
    fn sync_pods(
        &self,
        source: SyncSource,
        dropped: usize,
        answer_by: Option<Instant>,
    ) -> EncodedUpdates {
        let live = self.live();
        let pass = SyncPass {
            quirks: self.quirks(),
            rules: (&self.settings.node, &*live.policy),
            api_pods: self.api_pods.as_deref(),
            owners_from_tree: self.owners_from_tree(&live.policy),
            adjust: self.settings.adjust_existing && !live.dry_run,
            answer_by,
        };
        let mut built = SyncBuilt::with_capacity(&source);
        let mut members = members_by_pod(&source);
        for first in 0..source.pods() {
            // The first description of an id takes the pod's turn; the
            // later ones find it gone.
            let first_id = source.pod_id(first);
            let Some((later, containers)) = members.remove(first_id) else {
                continue;
            };
            self.sync_pod(&pass, &source, (first, later), &containers, &mut built);
        }
        // The request's containers are freed only now, all at once, and
        // before the updates are decoded into the space they leave: records
        // built into the holes of containers freed one by one lay scattered
        // over the whole request, and their pages stayed resident after it
        // was answered (RssAnon after a node-sized sync 4.6 -> 2.3 MiB).
        let (pods, containers) = (source.pods(), source.containers());
        drop(source);
        self.install_records(built.pods, built.containers);
        *lock(&self.created_at_sync) = built.created;
        self.notify_changed();
        let updates = built.updates;
        let mut counters = lock(&self.counters);
        counters.synchronized += containers as u64;
        counters.updated += updates.spans.len() as u64;
        info!(
            pods,
            containers,
            updates = updates.spans.len(),
            "synchronized with the runtime"
        );
        if dropped + built.skipped + updates.left_out > 0 {
            warn!(
                dropped,
                not_decided = built.skipped,
                updates_left_out = updates.left_out,
                "Synchronize was partial (see the reassembly bounds); the rest is handled as events arrive"
            );
        }
        updates
    }

    /// One pod of a Synchronize: its containers decided, recorded and, where
    /// they run, updated. `first` is where its id was first sent, `later`
    /// the description that counts (of two with one id, the later one, as a
    /// map keeps it).
    fn sync_pod(
        &self,
        pass: &SyncPass<'_>,
        source: &SyncSource,
        (first, later): (usize, usize),
        containers: &[usize],
        built: &mut SyncBuilt,
    ) {
        let first_id = source.pod_id(first);
        let Some(pod) = source.pod(later) else {
            return;
        };
        let pod = &*pod;
        let pod_facts = convert::pod_from_wire(pod);
        // Answer in time with what we have rather than be dropped for
        // being late; the rest is learnt from later events.
        if built.skipped > 0 || pass.answer_by.is_some_and(|t| Instant::now() > t) {
            built.skipped += containers.len();
            built
                .pods
                .insert(first_id.into(), pod_record(first_id, &pod_facts));
            return;
        }
        let get = |&i: &usize| source.container(i).map(|c| (i, c));
        let members: Vec<_> = containers.iter().filter_map(get).collect();
        let (pod_facts, decided) = self.decide_synchronized(pass, pod, pod_facts, &members);
        let recorded = !decided.is_empty();
        for (k, facts, decision, started) in decided {
            let (i, c) = &members[k];
            let record = container_record(pod, &pod_facts, c, facts, &decision, started);
            built.containers.insert(c.id.clone(), record);
            if pass.adjust && is_running(c) {
                let mut adjustment = decision.adjustment;
                self.keep_relaxed_high(c, &mut adjustment);
                if is_created(c) && !adjustment.unified.is_empty() {
                    built
                        .created
                        .insert(c.id.clone(), adjustment.unified.clone());
                }
                // oom_score_adj cannot travel in an update; the runtime
                // applies the rest through UpdateContainerResources.
                if let Some(u) = convert::update_to_wire(&c.id, adjustment, OnUpdateFailure::Ignore)
                {
                    built.updates.push(*i, &u);
                }
            }
        }
        // A pod id sent twice keeps its first description unless one
        // of its containers was recorded with the later one.
        let first_sent = (!recorded && later != first)
            .then(|| source.pod(first))
            .flatten();
        let record = match first_sent {
            Some(first) => pod_record(first_id, &convert::pod_from_wire(&first)),
            None => pod_record(&pod.id, &pod_facts),
        };
        built.pods.insert(first_id.into(), record);
    }

    /// Decides a synchronized pod's containers, with the kubelet's Memory
    /// QoS as the owners known so far say, or as the pod's cgroups show it.
    fn decide_synchronized(
        &self,
        pass: &SyncPass<'_>,
        pod: &api::PodSandbox,
        mut pod_facts: qos::PodFacts,
        members: &Members<'_>,
    ) -> (qos::PodFacts, Vec<Decided>) {
        // Only CRI-O describes a resized container with its creation-time
        // resources after a restart; elsewhere the report is current and
        // two file reads per container would only slow the sync.
        let forgets_resizes = pass.quirks.forgets_resizes;
        let kernel: Vec<Option<api::LinuxResources>> = if forgets_resizes {
            let limits = |(_, c): &(usize, Cow<api::Container>)| self.resources_from_kernel(c);
            members.iter().map(limits).collect()
        } else {
            Vec::new()
        };
        let decide_all = |pod_facts: &qos::PodFacts| -> Vec<Decided> {
            let one = |(k, (_, c)): (usize, &(usize, Cow<api::Container>))| {
                let started = Instant::now();
                let source = match kernel.get(k).and_then(Option::as_ref) {
                    Some(r) => view::Source::KernelLimits(r),
                    None => view::Source::Reported,
                };
                let (facts, d) = view::decide(
                    pod_facts,
                    c,
                    source,
                    &pass.quirks,
                    pass.rules,
                    pass.api_pods,
                );
                (k, facts, d, started)
            };
            members.iter().enumerate().map(one).collect()
        };
        // In a Synchronize nothing is seen for the first time: a pod is
        // the kubelet's only where the rules below (or before) say so.
        let pod_cg = pass
            .owners_from_tree
            .then(|| pod_cgroups(&pod_facts.cgroup_parent))
            .flatten();
        if let Some(cg) = &pod_cg {
            let reg = lock(&self.registry);
            pod_facts.kubelet_memory_qos = reg.owners.get(&cg.pod) == Some(&Owner::Kubelet);
        }
        let mut decided = decide_all(&pod_facts);
        let unknown = pod_cg.filter(|_| !pod_facts.kubelet_memory_qos);
        let report_current = !forgets_resizes;
        if unknown.is_some_and(|cg| {
            self.kubelet_found_in_sync(pod, cg, members, &decided, report_current)
        }) {
            pod_facts.kubelet_memory_qos = true;
            decided = decide_all(&pod_facts);
        }
        (pod_facts, decided)
    }

    /// The records of a Synchronize replace the registry's in one step.
    fn install_records(
        &self,
        mut pods: HashMap<String, PodRecord>,
        containers: HashMap<String, ContainerRecord>,
    ) {
        let mut reg = lock(&self.registry);
        // A pod-level resize told to this process stands: the runtime
        // reports a pod with the resources it was created with.
        for (id, pod) in pods.iter_mut() {
            if let Some(known) = reg.pods.get(id) {
                pod.memory_limit = known.memory_limit;
            }
        }
        reg.pods = pods;
        reg.containers = containers;
    }

    /// After a restart nothing says what we wrote before: a pod cgroup with
    /// more protection than our own policy gives its containers (`decided`,
    /// see [`view::own_pod_protection`]) was protected by the kubelet (the keeper
    /// and `audit` apply the same rule). Failing that, a running container
    /// may hold a key the kubelet set where we did not (as at its start):
    /// only the keys the kubelet may set on its class are read
    /// ([`view::kubelet_may_set`]), and none of a container whose
    /// current report shows the CRI's keys (`report_current`, see
    /// [`view::known_keys`]). True when the pod is found the
    /// kubelet's now.
    fn kubelet_found_in_sync(
        &self,
        pod: &api::PodSandbox,
        cg: PodCgroups,
        containers: &Members<'_>,
        decided: &[Decided],
        report_current: bool,
    ) -> bool {
        let pod_cg = cg.pod;
        let mut pod_absent = false;
        if !lock(&self.registry).owners.contains_key(&pod_cg) {
            let dir = self.settings.cgroup_root.join(&pod_cg);
            let present = cgroupfs::read_protection_present(&dir);
            pod_absent = present.is_none();
            let on_disk = present.unwrap_or_default();
            let ours = decided
                .iter()
                .fold(Protection::default(), |sum, (_, f, d, _)| {
                    add_protection(sum, own_protection(f, d))
                });
            if cgroupfs::exceeds(on_disk, whole_pages(ours)) {
                info!(
                    cgroup = %pod_cg.display(),
                    memory_min = on_disk.min,
                    memory_low = on_disk.low,
                    owner = Owner::Kubelet.label(),
                    "pod cgroup holds more protection than nri-qos would write: the kubelet's Memory QoS owns it"
                );
                lock(&self.registry).owners.insert(pod_cg, Owner::Kubelet);
                return true;
            }
        }
        decided.iter().any(|(k, facts, d, _)| {
            let c = &containers[*k].1;
            let running = c.state.enum_value() == Ok(api::ContainerState::CONTAINER_RUNNING);
            let path = c.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
            // A pod cgroup without memory.min (gone, or no memory
            // controller) has no memory files in the cgroups below it
            // either: a read there could only find nothing.
            let below_absent =
                || pod_absent && container_cgroup_dir(path).is_some_and(|r| r.starts_with(&pod_cg));
            let known = view::known_keys(Some(cg.class), facts, d, report_current);
            running
                && !below_absent()
                && self.kubelet_keys_in_started_below(&pod.id, &pod_cg, path, known)
        })
    }

    /// A running container whose memory.high the throttle guard
    /// raised keeps it until it restarts or is resized: a plugin restart
    /// must not throttle it again.
    fn keep_relaxed_high(&self, c: &api::Container, adjustment: &mut qos::Adjustment) {
        let Some(want) = adjustment.unified.get("memory.high") else {
            return;
        };
        let cgroups_path = c.linux.as_ref().map_or("", |l| l.cgroups_path.as_str());
        let Some(dir) = container_cgroup_dir_in(&self.settings.cgroup_root, cgroups_path) else {
            return;
        };
        if let Some((high, max)) = cgroupfs::relaxed_values_in_tree(&dir, want) {
            info!(
                container = %c.id,
                cgroup = %dir.display(),
                wanted = %want,
                memory_high = %high,
                memory_max = %max,
                "memory.high was relaxed by the throttle guard; leaving it"
            );
            adjustment.unified.remove("memory.high");
        }
    }
}

/// The updates of a Synchronize, encoded one after another into one buffer
/// as they are decided, and decoded only once every record is built. As
/// messages, their many small allocations (alive until the answer is sent)
/// would sit between the records, which stay: freed, they would leave
/// holes in pages the records pin, which `malloc_trim` cannot give back.
#[derive(Default)]
struct EncodedUpdates {
    bytes: Vec<u8>,
    /// Each update's container index in the snapshot, and its bytes.
    spans: Vec<(usize, std::ops::Range<usize>)>,
    /// Updates that did not fit in the answer.
    left_out: usize,
}

/// Most bytes of updates one answer carries: the answer, with its ttrpc
/// framing, is one ttrpc message (4 MiB), and a larger one would be an
/// error the runtime drops the plugin for. A field's tag and length take
/// at most 6 bytes beside each update.
const ANSWER_BYTES: usize = ttrpc::proto::MESSAGE_LENGTH_MAX - 1024;
const UPDATE_FRAMING: usize = 6;

impl EncodedUpdates {
    fn push(&mut self, index: usize, update: &api::ContainerUpdate) {
        let start = self.bytes.len();
        match update.write_to_vec(&mut self.bytes) {
            Ok(()) if self.bytes.len() + UPDATE_FRAMING * (self.spans.len() + 1) > ANSWER_BYTES => {
                self.bytes.truncate(start);
                self.left_out += 1;
            }
            Ok(()) => self.spans.push((index, start..self.bytes.len())),
            Err(e) => {
                self.bytes.truncate(start);
                warn!(container = %update.container_id, error = %e, "update not encodable; left out of the Synchronize answer");
            }
        }
    }

    /// The SynchronizeResponse of these updates, as the generated encoder
    /// writes it: each update as field 1 in the order its container was
    /// sent (`more`, false, is not written). Decoded into messages first,
    /// the updates were the peak of a Synchronize decided pod by pod.
    fn into_response(mut self) -> protobuf::Result<Vec<u8>> {
        self.spans.sort_unstable_by_key(|(i, _)| *i);
        let mut answer = Vec::with_capacity(self.bytes.len() + 4 * self.spans.len());
        let mut os = protobuf::CodedOutputStream::vec(&mut answer);
        for (_, span) in &self.spans {
            os.write_bytes(1, &self.bytes[span.clone()])?;
        }
        os.flush()?;
        drop(os);
        Ok(answer)
    }

    /// The updates as messages, in the order their containers were sent.
    fn in_order_sent(mut self) -> Vec<api::ContainerUpdate> {
        self.spans.sort_unstable_by_key(|(i, _)| *i);
        let decode = |(_, span): &(usize, std::ops::Range<usize>)| {
            api::ContainerUpdate::parse_from_bytes(&self.bytes[span.clone()])
                .map_err(|e| warn!(error = %e, "an update we encoded did not decode; left out"))
                .ok()
        };
        self.spans.iter().filter_map(decode).collect()
    }
}

/// What every pod of one Synchronize is decided with.
struct SyncPass<'a> {
    quirks: RuntimeQuirks,
    rules: view::Rules<'a>,
    api_pods: Option<&'a dyn ContainerRequests>,
    owners_from_tree: bool,
    adjust: bool,
    answer_by: Option<Instant>,
}

/// What a Synchronize builds: the registry's next records and the updates.
struct SyncBuilt {
    pods: HashMap<String, PodRecord>,
    containers: HashMap<String, ContainerRecord>,
    updates: EncodedUpdates,
    /// Containers left undecided to answer in time.
    skipped: usize,
    /// The `unified` values sent to containers not started yet.
    created: super::start_race::CreatedAtSync,
}

impl SyncBuilt {
    fn with_capacity(source: &SyncSource) -> Self {
        Self {
            pods: HashMap::with_capacity(source.pods()),
            containers: HashMap::with_capacity(source.containers()),
            updates: EncodedUpdates::default(),
            skipped: 0,
            created: HashMap::new(),
        }
    }
}

/// Each pod id with the index of its description that counts (of two with
/// one id, the later one, as a map keeps it) and its containers' indices.
fn members_by_pod(source: &SyncSource) -> HashMap<&str, (usize, Vec<usize>)> {
    let mut pods: HashMap<&str, (usize, Vec<usize>)> = HashMap::with_capacity(source.pods());
    for p in 0..source.pods() {
        pods.insert(source.pod_id(p), (p, Vec::new()));
    }
    for i in 0..source.containers() {
        let pod_id = source.container_pod_id(i);
        match pod_id.and_then(|id| pods.get_mut(id)) {
            Some((_, members)) => members.push(i),
            None => {
                let c = source.container(i);
                let id = c.as_ref().map_or("", |c| c.id.as_str());
                debug!(container = %id, "synchronized container without a known pod; skipped")
            }
        }
    }
    pods
}

/// Created and not started: an update reaches the runtime's record of it,
/// and its start may or may not see that ([`super::start_race`]).
fn is_created(c: &api::Container) -> bool {
    c.state.enum_value() == Ok(api::ContainerState::CONTAINER_CREATED)
}

/// A container a runtime update can still reach.
fn is_running(c: &api::Container) -> bool {
    matches!(
        c.state.enum_value(),
        Ok(api::ContainerState::CONTAINER_RUNNING | api::ContainerState::CONTAINER_CREATED)
    )
}

#[cfg(test)]
mod encoded_updates_tests {
    use super::*;

    fn update(id: &str, high: &str) -> api::ContainerUpdate {
        let mut adj = qos::Adjustment::default();
        adj.unified.insert("memory.high".into(), high.into());
        adj.cpu_shares = Some(2);
        convert::update_to_wire(id, adj, OnUpdateFailure::Ignore).unwrap()
    }

    #[test]
    fn updates_come_back_whole_in_the_order_their_containers_were_sent() {
        let (a, b, c) = (update("a", "1"), update("b", "22"), update("c", "333"));
        let mut encoded = EncodedUpdates::default();
        encoded.push(7, &c);
        encoded.push(0, &a);
        encoded.push(3, &b);
        let answer = api::SynchronizeResponse {
            update: vec![a.clone(), b.clone(), c.clone()],
            ..Default::default()
        };
        let mut again = EncodedUpdates::default();
        for (i, u) in [(2, &c), (0, &a), (1, &b)] {
            again.push(i, u);
        }
        assert_eq!(
            again.into_response().unwrap(),
            answer.write_to_bytes().unwrap()
        );
        assert_eq!(encoded.in_order_sent(), vec![a, b, c]);
        let empty = EncodedUpdates::default().into_response().unwrap();
        assert_eq!(
            empty,
            api::SynchronizeResponse::new().write_to_bytes().unwrap()
        );
        assert!(EncodedUpdates::default().in_order_sent().is_empty());
    }

    #[test]
    fn the_answer_keeps_within_one_ttrpc_message() {
        let mut encoded = EncodedUpdates::default();
        let one = update(&"c".repeat(64), "123456789");
        let size = usize::try_from(one.compute_size()).unwrap_or(usize::MAX);
        let n = ttrpc::proto::MESSAGE_LENGTH_MAX / size;
        for i in 0..n {
            encoded.push(i, &one);
        }
        assert!(encoded.left_out > 0);
        let kept = encoded.spans.len();
        let answer = encoded.into_response().unwrap();
        assert!(answer.len() <= ANSWER_BYTES, "{}", answer.len());
        let decoded = api::SynchronizeResponse::parse_from_bytes(&answer).unwrap();
        assert_eq!(decoded.update.len(), kept);
    }
}

#[cfg(test)]
mod sync_cost_tests {
    use super::*;
    use crate::nri::reassembly::SyncReassembler;

    /// A pod and its container as containerd describes them to the plugin.
    fn node_pod(i: usize) -> (api::PodSandbox, api::Container) {
        let uid = format!("{i:08x}-1c2d-4e5f-8a9b-0c1d2e3f4a5b");
        let parent = format!("/kubepods/burstable/pod{uid}");
        let mut pod = api::PodSandbox {
            id: format!("{i:064x}"),
            name: format!("web-7d9f8c6b5-{i:05}"),
            uid,
            namespace: "default".into(),
            ..Default::default()
        };
        pod.linux.mut_or_insert_default().cgroup_parent = parent.clone();
        let mut c = api::Container {
            id: format!("{:064x}", i + (1 << 40)),
            pod_sandbox_id: pod.id.clone(),
            name: "app".into(),
            state: protobuf::EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING),
            ..Default::default()
        };
        c.annotations.insert(
            crate::qos::policy::CONTAINER_TYPE_ANNOTATION.into(),
            "container".into(),
        );
        let linux = c.linux.mut_or_insert_default();
        linux.cgroups_path = format!("{parent}/{}", c.id);
        let r = linux.resources.mut_or_insert_default();
        r.memory
            .mut_or_insert_default()
            .limit
            .mut_or_insert_default()
            .value = 512 << 20;
        let cpu = r.cpu.mut_or_insert_default();
        cpu.shares.mut_or_insert_default().value = 256;
        cpu.quota.mut_or_insert_default().value = 50_000;
        cpu.period.mut_or_insert_default().value = 100_000;
        (pod, c)
    }

    /// What the config file says a node takes of the budget.
    #[test]
    fn a_node_of_1000_pods_and_3000_containers_takes_about_5_5_mib() {
        let mut req = api::SynchronizeRequest::new();
        for i in 0..1_000 {
            let (pod, c) = node_pod(i);
            req.pods.push(pod);
            for k in 0..3 {
                let mut c = c.clone();
                c.id = format!("{:064x}", i * 3 + k + (1 << 40));
                req.containers.push(c);
            }
        }
        req.more = true;
        let bytes = req.write_to_bytes().unwrap();
        let mut r = SyncReassembler::new(usize::MAX, sync_cost);
        r.push(&bytes, None, Instant::now()).unwrap();
        let mib = r.charged_bytes() as f64 / f64::from(1 << 20);
        assert!((5.0..6.0).contains(&mib), "{mib:.2} MiB");
    }
}
