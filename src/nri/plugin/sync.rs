//! Synchronize: the registry rebuilt from every pod and container the
//! runtime knows, and the updates for the containers that already run.
//!
//! Pod by pod, each container is decided once: a pod's own protection sum
//! (who protected its cgroup after a restart) needs only its containers,
//! and only a pod the kubelet turns out to own is decided again. A
//! Synchronize sent as one message keeps its bytes, and a pod's containers
//! are decoded only for its turn: decoded whole, the request took ~1.5 KB
//! of heap per container beside the new registry, the sync's peak.

use std::borrow::Cow;
use std::ops::Range;

use protobuf::Message;

use super::record::{container_record, pod_record};
use super::*;
use crate::node::layout::{container_cgroup_dir_in, PodCgroups};
use crate::nri::lean_sync;
use crate::nri::reassembly::Snapshot;
use crate::nri::view::{self, add_protection, own_protection, whole_pages};

/// One container of a pod being synchronized: its index among the pod's
/// members, its facts and decision, and when deciding it started.
type Decided = (usize, qos::ContainerFacts, qos::Decision, Instant);

/// A pod's containers: each one's index in the order sent, and itself.
type Members<'a> = [(usize, Cow<'a, api::Container>)];

/// The pods and containers of a Synchronize: decoded (chunks reassembled),
/// or the one message's bytes, each pod and container decoded when its
/// pod's turn comes, so that the whole decoded request is never alive at
/// once.
pub(super) enum SyncSource {
    Decoded(Snapshot),
    Located {
        bytes: Vec<u8>,
        index: lean_sync::Indexed,
    },
}

impl SyncSource {
    fn pods(&self) -> usize {
        match self {
            Self::Decoded(s) => s.pods.len(),
            Self::Located { index, .. } => index.pods.len(),
        }
    }

    fn pod_id(&self, p: usize) -> &str {
        match self {
            Self::Decoded(s) => &s.pods[p].id,
            Self::Located { index, .. } => &index.pods[p].1,
        }
    }

    fn pod(&self, p: usize) -> Option<Cow<'_, api::PodSandbox>> {
        match self {
            Self::Decoded(s) => Some(Cow::Borrowed(&s.pods[p])),
            Self::Located { bytes, index } => {
                located(bytes, &index.pods[p].0, lean_sync::decode_pod)
            }
        }
    }

    fn containers(&self) -> usize {
        match self {
            Self::Decoded(s) => s.containers.len(),
            Self::Located { index, .. } => index.containers.len(),
        }
    }

    /// The id of the pod the `i`th container names.
    fn container_pod_id(&self, i: usize) -> Option<&str> {
        match self {
            Self::Decoded(s) => Some(&s.containers[i].pod_sandbox_id),
            Self::Located { index, .. } => index.containers[i].1.map(|p| self.pod_id(p)),
        }
    }

    fn container(&self, i: usize) -> Option<Cow<'_, api::Container>> {
        match self {
            Self::Decoded(s) => Some(Cow::Borrowed(&s.containers[i])),
            Self::Located { bytes, index } => {
                located(bytes, &index.containers[i].0, lean_sync::decode_container)
            }
        }
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
    /// A Synchronize sent as one message is decided pod by pod from its
    /// bytes; chunks are decoded and reassembled as before (holding every
    /// chunk's bytes to the last would raise a chunked Synchronize's peak).
    async fn synchronize_encoded(
        &self,
        ctx: &TtrpcContext,
        payload: Vec<u8>,
    ) -> ttrpc::Result<Vec<u8>> {
        let invalid = lean_sync::invalid_request;
        let more = lean_sync::says_more(&payload).map_err(invalid)?;
        if !more && lock(&self.sync).is_fresh() {
            let indexed = lean_sync::index_synchronize(&payload).map_err(invalid)?;
            let objects = indexed.pods.len() + indexed.containers.len();
            let timeout = crate::nri::session::request_timeout(ctx);
            let whole =
                lock(&self.sync).take_whole(objects, payload.len(), more, timeout, Instant::now());
            if let Some(answer_by) = whole {
                let source = SyncSource::Located {
                    bytes: payload,
                    index: indexed,
                };
                let answer = self.sync_pods(source, 0, answer_by).into_response();
                self.synchronized.send_replace(true);
                return answer.map_err(lean_sync::not_encodable);
            }
        }
        lean_sync::synchronize_decoded(self, ctx, payload).await
    }
}

impl QosPlugin {
    /// [`Self::sync_pods`] of a reassembled Synchronize.
    pub(super) fn finish_sync(&self, whole: Complete) -> Vec<api::ContainerUpdate> {
        let Complete {
            snapshot,
            dropped,
            answer_by,
        } = whole;
        let updates = self.sync_pods(SyncSource::Decoded(snapshot), dropped, answer_by);
        updates.in_order_sent()
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
        // Only CRI-O describes a resized container with its creation-time
        // resources after a restart; elsewhere the report is current and
        // two file reads per container would only slow the sync.
        let quirks = self.quirks();
        let forgets_resizes = quirks.forgets_resizes;
        let live = self.live();
        let policy = &*live.policy;
        let rules = (&self.settings.node, policy);
        let api_pods = self.api_pods.as_deref();
        let owners_from_tree = self.owners_from_tree(policy);
        let adjust = self.settings.adjust_existing && !live.dry_run;
        // Of two pods with one id, the later one describes it (as a map
        // keeps it); with it, the indices of its containers.
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
        let mut new_pods: HashMap<String, PodRecord> = HashMap::with_capacity(source.pods());
        let mut new_containers: HashMap<String, ContainerRecord> =
            HashMap::with_capacity(source.containers());
        let mut updates = EncodedUpdates::default();
        let mut skipped = 0usize;
        for first in 0..source.pods() {
            // The first description of an id takes the pod's turn; the
            // later ones find it gone.
            let first_id = source.pod_id(first);
            let Some((later, members)) = pods.remove(first_id) else {
                continue;
            };
            let Some(pod) = source.pod(later) else {
                continue;
            };
            let pod = &*pod;
            let mut pod_facts = convert::pod_from_wire(pod);
            // Answer in time with what we have rather than be dropped for
            // being late; the rest is learnt from later events.
            if skipped > 0 || answer_by.is_some_and(|t| Instant::now() > t) {
                skipped += members.len();
                new_pods.insert(first_id.into(), pod_record(first_id, &pod_facts));
                continue;
            }
            let get = |&i: &usize| source.container(i).map(|c| (i, c));
            let members: Vec<_> = members.iter().filter_map(get).collect();
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
                    let (facts, d) = view::decide(pod_facts, c, source, &quirks, rules, api_pods);
                    (k, facts, d, started)
                };
                members.iter().enumerate().map(one).collect()
            };
            // In a Synchronize nothing is seen for the first time: a pod is
            // the kubelet's only where the rules below (or before) say so.
            let pod_cg = owners_from_tree
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
                self.kubelet_found_in_sync(pod, cg, &members, &decided, report_current)
            }) {
                pod_facts.kubelet_memory_qos = true;
                decided = decide_all(&pod_facts);
            }
            let recorded = !decided.is_empty();
            for (k, facts, decision, started) in decided {
                let (i, c) = &members[k];
                let (i, c) = (*i, &**c);
                let record = container_record(pod, &pod_facts, c, facts, &decision, started);
                new_containers.insert(c.id.clone(), record);
                let running = matches!(
                    c.state.enum_value(),
                    Ok(api::ContainerState::CONTAINER_RUNNING
                        | api::ContainerState::CONTAINER_CREATED)
                );
                if !adjust || !running {
                    continue;
                }
                let mut adjustment = decision.adjustment;
                self.keep_relaxed_high(c, &mut adjustment);
                // oom_score_adj cannot travel in an update; the runtime
                // applies the rest through UpdateContainerResources.
                if let Some(u) = convert::update_to_wire(&c.id, adjustment, true) {
                    updates.push(i, &u);
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
            new_pods.insert(first_id.into(), record);
        }
        // The request's containers are freed only now, all at once, and
        // before the updates are decoded into the space they leave: records
        // built into the holes of containers freed one by one lay scattered
        // over the whole request, and their pages stayed resident after it
        // was answered (RssAnon after a node-sized sync 4.6 -> 2.3 MiB).
        let (pods, containers) = (source.pods(), source.containers());
        drop(source);
        {
            let mut reg = lock(&self.registry);
            // A pod-level resize told to this process stands: the runtime
            // reports a pod with the resources it was created with.
            for (id, pod) in new_pods.iter_mut() {
                if let Some(known) = reg.pods.get(id) {
                    pod.memory_limit = known.memory_limit;
                }
            }
            reg.pods = new_pods;
            reg.containers = new_containers;
        }
        self.notify_changed();
        let mut counters = lock(&self.counters);
        counters.synchronized += containers as u64;
        counters.updated += updates.spans.len() as u64;
        info!(
            pods,
            containers,
            updates = updates.spans.len(),
            "synchronized with the runtime"
        );
        if dropped + skipped > 0 {
            warn!(
                dropped,
                not_decided = skipped,
                "Synchronize was partial (see the reassembly bounds); the rest is handled as events arrive"
            );
        }
        updates
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

    /// A running container whose memory.high the monitor's throttle guard
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
        if cgroupfs::relaxed_in_tree(&dir, want) {
            info!(container = %c.id, wanted = %want, "memory.high was relaxed by the throttle guard; leaving it");
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
}

impl EncodedUpdates {
    fn push(&mut self, index: usize, update: &api::ContainerUpdate) {
        let start = self.bytes.len();
        match update.write_to_vec(&mut self.bytes) {
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

#[cfg(test)]
mod encoded_updates_tests {
    use super::*;

    fn update(id: &str, high: &str) -> api::ContainerUpdate {
        let mut adj = qos::Adjustment::default();
        adj.unified.insert("memory.high".into(), high.into());
        adj.cpu_shares = Some(2);
        convert::update_to_wire(id, adj, true).unwrap()
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
}
