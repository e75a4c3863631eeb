//! Reassembly of a Synchronize, sent whole or split into chunks by the
//! runtime (`more=true` on every chunk but the last), bounded in memory,
//! objects and time.
//!
//! The runtime is trusted but may be buggy: whatever it sends, we hold at
//! most the budget and answer before its request timeout. What is held
//! across chunks is one buffer: each pod and container re-encoded with
//! only the fields nri-qos reads (`lean_sync`; annotations nri-qos does not
//! read and labels are never kept), so a chunk's decoded objects are freed
//! with the chunk. Each object kept is charged its bytes there plus what
//! its receiver will build from it once the Synchronize is whole (the
//! plugin its registry records and answer, audit its report: [`Cost`]);
//! past the budget, or after 5/8 of the runtime's timeout, objects are
//! dropped, counted but not decoded, which is logged once, and the
//! Synchronize is answered with what was kept. The plugin and `nri-qos
//! audit` both use this one reassembler.

use std::time::{Duration, Instant};

use tracing::warn;

use super::lean_sync::{self, Next, Object};
use super::proto::api;

/// Bytes a Synchronize may take (`plugin.sync-budget-mib`'s default).
pub const SYNC_BUDGET_BYTES: usize = 8 << 20;
/// Objects held for one Synchronize (far above any real node).
pub const SYNC_BUDGET_OBJECTS: usize = 200_000;
/// Objects decoded between two readings of the clock.
const CLOCK_EVERY: usize = 1024;
/// Request timeout the runtime uses when the request does not say (NRI v0.6.1).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What a receiver builds from one object kept, in bytes, once the
/// Synchronize is whole; charged to the budget beside the object's own
/// bytes.
pub type Cost = fn(&Object) -> usize;

/// Every pod and container the runtime knows, from one Synchronize.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub pods: Vec<api::PodSandbox>,
    pub containers: Vec<api::Container>,
    /// Configure's `runtime_name`, where the receiver keeps it (audit).
    pub runtime: String,
    /// Pods and containers the runtime sent but the budget left out.
    pub left_out: usize,
}

/// The pods and containers kept of a Synchronize: a SynchronizeRequest
/// of only the fields nri-qos reads, pods and containers in the order
/// sent (`lean_sync` decodes it).
#[derive(Debug, Default)]
pub struct Held {
    pub bytes: Vec<u8>,
    pub pods: usize,
    pub containers: usize,
}

impl Held {
    /// The held objects as one decoded snapshot.
    pub fn decode(&self) -> protobuf::Result<Snapshot> {
        let req = lean_sync::decode_synchronize(&self.bytes)?;
        Ok(Snapshot {
            pods: req.pods,
            containers: req.containers,
            ..Default::default()
        })
    }
}

/// A whole Synchronize and what had to be left out of it.
#[derive(Debug, Default)]
pub struct Complete {
    pub held: Held,
    /// Objects dropped because a bound was reached.
    pub dropped: usize,
    /// Until when the answer still reaches the runtime in time: spend no
    /// longer on processing the snapshot.
    pub answer_by: Option<Instant>,
}

/// Collects the chunks of one Synchronize.
#[derive(Debug)]
pub struct SyncReassembler {
    budget_bytes: usize,
    budget_objects: usize,
    cost: Cost,
    /// The least any object is charged.
    smallest: usize,
    held: Held,
    /// What the objects held are charged: each one's bytes and [`Cost`].
    /// The held buffer's spare capacity is charged too.
    costs: usize,
    dropped: usize,
    /// When the runtime gives up on the whole Synchronize, and the timeout
    /// its first chunk carried.
    deadline: Option<(Instant, Duration)>,
    logged: bool,
}

/// No cost beyond the bytes held.
fn bytes_only(_: &Object) -> usize {
    0
}

impl Default for SyncReassembler {
    fn default() -> Self {
        Self::new(SYNC_BUDGET_BYTES, bytes_only)
    }
}

impl SyncReassembler {
    /// `budget_bytes` for the objects held and what `cost` says their
    /// receiver builds from them; the usual object bound.
    pub fn new(budget_bytes: usize, cost: Cost) -> Self {
        Self::with_objects(budget_bytes, SYNC_BUDGET_OBJECTS, cost)
    }

    pub fn with_objects(budget_bytes: usize, budget_objects: usize, cost: Cost) -> Self {
        let empty = [
            Object::Pod(api::PodSandbox::new()),
            Object::Container(api::Container::new()),
        ];
        let charge = |o: &Object| o.framed_len().saturating_add(cost(o));
        SyncReassembler {
            budget_bytes,
            budget_objects,
            cost,
            smallest: empty.iter().map(charge).min().unwrap_or(0),
            held: Held::default(),
            costs: 0,
            dropped: 0,
            deadline: None,
            logged: false,
        }
    }

    /// Adds one chunk, encoded. `timeout` is what the request carries
    /// (ttrpc `timeout_nano`; `None` = the runtime's default). Returns the
    /// whole Synchronize on the last chunk (`more=false`) and starts over;
    /// an error, and nothing of the chunk kept, for bytes that are not a
    /// SynchronizeRequest.
    pub fn push(
        &mut self,
        chunk: &[u8],
        timeout: Option<Duration>,
        now: Instant,
    ) -> protobuf::Result<Option<Complete>> {
        // One timeout covers all chunks; each chunk's timeout is what is
        // left of it, so the earliest end wins.
        let timeout = timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        let ends = now + timeout;
        let (deadline, span) = match self.deadline {
            Some((d, span)) => (d.min(ends), span),
            None => (ends, timeout),
        };
        self.deadline = Some((deadline, span));
        let until = accept_until(deadline, span);
        if now > until || self.is_full() {
            // Nothing more can be kept: not even decoded.
            let walked = lean_sync::count_objects(chunk)?;
            let why = if now > until {
                Reason::Late
            } else {
                Reason::Budget
            };
            self.drop_many(walked.counted, why);
            return Ok(self.finish(walked.more, deadline, span));
        }
        let before = (self.held.bytes.len(), self.held.pods, self.held.containers);
        let (costs, dropped) = (self.costs, self.dropped);
        let (started, mut seen) = (Instant::now(), 0usize);
        let mut failed = None;
        let mut why = Reason::Budget;
        let walked = lean_sync::for_each_object(chunk, |o| {
            if let Err(e) = self.keep(o) {
                failed = Some(e);
                return Next::Count;
            }
            // One message may hold 200,000 objects: the clock is read
            // every so often while it is decoded.
            seen += 1;
            if seen % CLOCK_EVERY == 0 && now + started.elapsed() > until {
                why = Reason::Late;
                return Next::Count;
            }
            if self.is_full() {
                Next::Count
            } else {
                Next::Decode
            }
        });
        match walked.and_then(|w| failed.map_or(Ok(w), Err)) {
            Ok(walked) => {
                self.drop_many(walked.counted, why);
                Ok(self.finish(walked.more, deadline, span))
            }
            Err(e) => {
                // As if the chunk never came.
                self.held.bytes.truncate(before.0);
                (self.held.pods, self.held.containers) = (before.1, before.2);
                (self.costs, self.dropped) = (costs, dropped);
                Err(e)
            }
        }
    }

    /// Whether not even the smallest object fits any more.
    fn is_full(&self) -> bool {
        let held = self.held.pods + self.held.containers;
        held >= self.budget_objects || self.costs.saturating_add(self.smallest) > self.budget_bytes
    }

    /// Keeps one object if it fits, else counts it dropped.
    fn keep(&mut self, o: Object) -> protobuf::Result<()> {
        let held = self.held.pods + self.held.containers;
        let size = o.framed_len();
        let costs = self
            .costs
            .saturating_add(size.saturating_add((self.cost)(&o)));
        let bytes = &mut self.held.bytes;
        let spare = bytes.capacity() - bytes.len();
        let spare_after = spare.saturating_sub(size);
        if held >= self.budget_objects || costs.saturating_add(spare_after) > self.budget_bytes {
            self.drop_one(Reason::Budget);
            return Ok(());
        }
        if spare < size {
            // Grow by half, within what the budget has left: spare
            // capacity is memory taken as much as the bytes in use.
            let extra = (bytes.len() / 2).min(self.budget_bytes - costs);
            bytes.reserve_exact(size + extra);
        }
        o.write_framed(bytes)?;
        self.costs = costs;
        match o {
            Object::Pod(_) => self.held.pods += 1,
            Object::Container(_) => self.held.containers += 1,
        }
        Ok(())
    }

    /// The whole Synchronize once its last chunk is in.
    fn finish(&mut self, more: bool, deadline: Instant, span: Duration) -> Option<Complete> {
        if more {
            return None;
        }
        let done = Complete {
            held: std::mem::take(&mut self.held),
            dropped: self.dropped,
            answer_by: answer_by(deadline, span),
        };
        self.start_over();
        Some(done)
    }

    /// Forgets every chunk held (a new session), keeping the budget.
    pub fn start_over(&mut self) {
        *self = Self::with_objects(self.budget_bytes, self.budget_objects, self.cost);
    }

    fn drop_one(&mut self, why: Reason) {
        self.drop_many(1, why);
    }

    fn drop_many(&mut self, objects: usize, why: Reason) {
        self.dropped += objects;
        if objects > 0 && !self.logged {
            self.logged = true;
            warn!(
                budget_bytes = self.budget_bytes,
                budget_objects = self.budget_objects,
                charged_bytes = self.charged_bytes(),
                too_late = why == Reason::Late,
                "Synchronize is larger than we hold or arrives too late for the runtime's timeout; answering with what fits"
            );
        }
    }

    /// Bytes charged now: the held buffer's capacity and what the objects
    /// in it cost their receiver.
    pub fn charged_bytes(&self) -> usize {
        let spare = self.held.bytes.capacity() - self.held.bytes.len();
        self.costs.saturating_add(spare)
    }
}

/// Why an object is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Budget,
    Late,
}

/// Chunks are taken until 5/8 of the time has passed, leaving the rest
/// for deciding and answering.
fn accept_until(deadline: Instant, span: Duration) -> Instant {
    deadline.checked_sub(span * 3 / 8).unwrap_or(deadline)
}

/// When deciding stops so that the answer still leaves in time: at 3/4
/// of the time. What is left after it is spent recording what was not
/// decided and answering, which on a starved node (a few percent of a
/// core) took more than the last 1/8.
fn answer_by(deadline: Instant, span: Duration) -> Option<Instant> {
    deadline.checked_sub(span / 4)
}

#[cfg(test)]
impl Complete {
    /// A whole Synchronize of `snapshot`'s pods and containers, as the
    /// reassembler gives it (the fields nri-qos reads).
    pub(crate) fn of(snapshot: &Snapshot) -> Self {
        let req = api::SynchronizeRequest {
            pods: snapshot.pods.clone(),
            containers: snapshot.containers.clone(),
            ..Default::default()
        };
        let bytes = protobuf::Message::write_to_bytes(&req).unwrap_or_default();
        let mut r = SyncReassembler::with_objects(usize::MAX, usize::MAX, bytes_only);
        r.push(&bytes, None, Instant::now())
            .ok()
            .flatten()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use protobuf::Message;

    use super::*;

    fn ctr(id: &str, pad: usize) -> api::Container {
        let mut c = api::Container::new();
        c.id = id.into();
        c.name = "x".repeat(pad);
        c
    }

    fn chunk(containers: Vec<api::Container>, more: bool) -> Vec<u8> {
        api::SynchronizeRequest {
            containers,
            more,
            ..Default::default()
        }
        .write_to_bytes()
        .unwrap()
    }

    fn ids(done: &Complete) -> Vec<String> {
        let snap = done.held.decode().unwrap();
        snap.containers.into_iter().map(|c| c.id).collect()
    }

    fn push(r: &mut SyncReassembler, chunk: &[u8]) -> Option<Complete> {
        r.push(chunk, None, Instant::now()).unwrap()
    }

    #[test]
    fn chunks_are_joined_in_order() {
        let mut r = SyncReassembler::default();
        assert!(push(&mut r, &chunk(vec![ctr("a", 1)], true)).is_none());
        let done = push(&mut r, &chunk(vec![ctr("b", 1)], false)).unwrap();
        assert_eq!(ids(&done), ["a", "b"]);
        assert_eq!((done.held.pods, done.held.containers), (0, 2));
        assert_eq!(done.dropped, 0);
        // Starts over for the next Synchronize.
        let done = push(&mut r, &chunk(vec![], false)).unwrap();
        assert!(done.held.bytes.is_empty());
    }

    #[test]
    fn bytes_beyond_the_budget_are_dropped_and_what_fits_is_kept() {
        let mut r = SyncReassembler::with_objects(10_000, 1_000, bytes_only);
        for i in 0..10 {
            assert!(push(&mut r, &chunk(vec![ctr(&format!("c{i}"), 3_000)], true)).is_none());
            assert!(r.charged_bytes() <= 10_000);
        }
        let done = push(&mut r, &chunk(vec![ctr("small", 1)], false)).unwrap();
        assert_eq!(ids(&done), ["c0", "c1", "c2", "small"]);
        assert_eq!(done.dropped, 7);
        assert!(done.held.bytes.capacity() <= 10_000);
    }

    #[test]
    fn what_the_receiver_builds_is_charged_beside_the_bytes() {
        let mut r = SyncReassembler::with_objects(10_000, 1_000, |_| 2_000);
        let many: Vec<_> = (0..10).map(|i| ctr(&i.to_string(), 0)).collect();
        let done = push(&mut r, &chunk(many, false)).unwrap();
        assert_eq!(done.held.containers, 4, "2,000 bytes and a few each");
        assert_eq!(done.dropped, 6);
    }

    #[test]
    fn annotations_and_labels_nri_qos_does_not_read_are_never_held() {
        let mut c = ctr("c", 0);
        for k in 0..10_000 {
            c.annotations
                .insert(format!("example.com/{k}"), "v".repeat(50));
            c.labels.insert(format!("label-{k}"), "v".into());
        }
        c.annotations.insert(
            crate::qos::policy::CONTAINER_TYPE_ANNOTATION.into(),
            "sandbox".into(),
        );
        // nri-qos's own, which tells its `unified` keys from the kubelet's.
        c.annotations.insert(
            crate::nri::view::OWN_UNIFIED_ANNOTATION.into(),
            "memory.low".into(),
        );
        let wire = chunk(vec![c], false);
        assert!(wire.len() > 500_000);
        let mut r = SyncReassembler::with_objects(4_096, 1_000, bytes_only);
        let done = push(&mut r, &wire).unwrap();
        assert!(
            done.held.bytes.len() < 100,
            "{} bytes",
            done.held.bytes.len()
        );
        let kept = &done.held.decode().unwrap().containers[0];
        assert_eq!(kept.annotations.len(), 2);
        assert!(kept.labels.is_empty());
    }

    #[test]
    fn a_chunk_that_does_not_decode_is_refused_and_nothing_of_it_kept() {
        let mut r = SyncReassembler::default();
        assert!(push(&mut r, &chunk(vec![ctr("a", 1)], true)).is_none());
        // Two good containers, then a field cut short.
        let mut bad = chunk(vec![ctr("b", 1), ctr("c", 1)], true);
        bad.extend([0x12, 0x40, 0x0a]);
        assert!(r.push(&bad, None, Instant::now()).is_err());
        let done = push(&mut r, &chunk(vec![ctr("d", 1)], false)).unwrap();
        assert_eq!(ids(&done), ["a", "d"]);
    }

    #[test]
    fn once_nothing_fits_a_chunk_is_counted_not_decoded() {
        let mut r = SyncReassembler::with_objects(4_000, 1_000, |_| 100);
        // A container that does not decode is not looked at, in the chunk
        // that filled the budget or after it.
        let mut bad = chunk(vec![ctr("big", 3_800), ctr("a", 1)], true);
        bad.extend([0x12, 0x03, 0xff, 0xff, 0xff]);
        assert!(push(&mut r, &bad).is_none());
        assert!(r.is_full());
        let mut bad = chunk(vec![ctr("b", 1)], false);
        bad.extend([0x12, 0x03, 0xff, 0xff, 0xff]);
        let done = push(&mut r, &bad).unwrap();
        assert_eq!(ids(&done), ["big"]);
        assert_eq!(done.dropped, 4);
    }

    #[test]
    fn objects_beyond_the_count_are_dropped() {
        let mut r = SyncReassembler::with_objects(usize::MAX, 5, bytes_only);
        let many: Vec<_> = (0..8).map(|i| ctr(&i.to_string(), 0)).collect();
        let done = push(&mut r, &chunk(many, false)).unwrap();
        assert_eq!((done.held.containers, done.dropped), (5, 3));
    }

    #[test]
    fn chunks_that_arrive_too_late_for_the_timeout_are_not_held() {
        let mut r = SyncReassembler::default();
        let t = Instant::now();
        let timeout = Some(Duration::from_secs(2));
        let early = chunk(vec![ctr("early", 1)], true);
        assert!(r.push(&early, timeout, t).unwrap().is_none());
        // 1.9 s later: the runtime gives up at 2 s; holding more only makes us late.
        let later = t + Duration::from_millis(1_900);
        let late = chunk(vec![ctr("late", 1)], false);
        let done = r
            .push(&late, Some(Duration::from_millis(100)), later)
            .unwrap()
            .unwrap();
        assert_eq!(ids(&done), ["early"]);
        assert_eq!(done.dropped, 1);
        assert!(done.answer_by.unwrap() <= t + Duration::from_secs(2));
    }

    proptest! {
        /// Whatever the sizes and costs, the charge (bytes, spare capacity
        /// and costs) stays within the budget, every object is kept or
        /// counted dropped, and what is kept comes back in the order sent.
        #[test]
        fn the_charge_never_passes_the_budget(
            budget in 0usize..20_000,
            chunks in prop::collection::vec(prop::collection::vec(0usize..3_000, 0..6), 1..8),
        ) {
            let cost: Cost = |o| match o {
                Object::Container(c) => c.name.len() / 2,
                Object::Pod(_) => 0,
            };
            let mut r = SyncReassembler::with_objects(budget, 1_000, cost);
            let (mut sent, mut n) = (Vec::new(), 0);
            for (k, sizes) in chunks.iter().enumerate() {
                let more = k + 1 < chunks.len();
                let cs: Vec<_> = sizes.iter().map(|&s| { n += 1; ctr(&n.to_string(), s) }).collect();
                sent.extend(cs.iter().map(|c| c.id.clone()));
                let done = push(&mut r, &chunk(cs, more));
                prop_assert!(r.charged_bytes() <= budget);
                if let Some(done) = done {
                    prop_assert!(done.held.bytes.capacity() <= budget);
                    let kept = ids(&done);
                    prop_assert_eq!(kept.len() + done.dropped, sent.len());
                    let mut rest = sent.iter();
                    prop_assert!(kept.iter().all(|id| rest.any(|s| s == id)), "in order");
                }
            }
        }
    }
}
