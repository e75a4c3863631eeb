//! Reassembly of a Synchronize the runtime split into chunks (`more=true`
//! on every chunk but the last), bounded in bytes, objects and time.
//!
//! The runtime is trusted but may be buggy: whatever it sends, we hold at
//! most [`SYNC_BUDGET_BYTES`] of pods and containers and answer before its
//! request timeout. Past a bound we keep what fits, log once, and answer
//! with that; the plugin and `nri-qos audit` both use this one reassembler.

use std::time::{Duration, Instant};

use protobuf::Message;
use tracing::warn;

use super::proto::api;

/// Encoded bytes of pods and containers held for one Synchronize. A node
/// of 1,000 pods / 3,000 containers is about 2 MiB.
pub const SYNC_BUDGET_BYTES: usize = 64 << 20;
/// Objects held for one Synchronize (far above any real node).
pub const SYNC_BUDGET_OBJECTS: usize = 200_000;
/// Request timeout the runtime uses when the request does not say (NRI v0.6.1).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Every pod and container the runtime knows, from one Synchronize.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub pods: Vec<api::PodSandbox>,
    pub containers: Vec<api::Container>,
    /// Configure's `runtime_name`, where the receiver keeps it (audit).
    pub runtime: String,
}

/// A whole Synchronize and what had to be left out of it.
#[derive(Debug, Default)]
pub struct Complete {
    pub snapshot: Snapshot,
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
    held: Snapshot,
    bytes: usize,
    dropped: usize,
    /// When the runtime gives up on the whole Synchronize, and the timeout
    /// its first chunk carried.
    deadline: Option<(Instant, Duration)>,
    logged: bool,
}

impl Default for SyncReassembler {
    fn default() -> Self {
        Self::with_budget(SYNC_BUDGET_BYTES)
    }
}

impl SyncReassembler {
    /// `budget_bytes` of pods and containers, the usual object bound.
    pub fn with_budget(budget_bytes: usize) -> Self {
        Self::new(budget_bytes, SYNC_BUDGET_OBJECTS)
    }

    pub fn new(budget_bytes: usize, budget_objects: usize) -> Self {
        SyncReassembler {
            budget_bytes,
            budget_objects,
            held: Snapshot::default(),
            bytes: 0,
            dropped: 0,
            deadline: None,
            logged: false,
        }
    }

    /// Adds one chunk. `timeout` is what the request carries (ttrpc
    /// `timeout_nano`; `None` = the runtime's default). Returns the whole
    /// Synchronize on the last chunk (`more=false`) and starts over.
    pub fn push(
        &mut self,
        req: api::SynchronizeRequest,
        timeout: Option<Duration>,
        now: Instant,
    ) -> Option<Complete> {
        // One timeout covers all chunks; each chunk's timeout is what is
        // left of it, so the earliest end wins.
        let timeout = timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        let ends = now + timeout;
        let (deadline, span) = match self.deadline {
            Some((d, span)) => (d.min(ends), span),
            None => (ends, timeout),
        };
        self.deadline = Some((deadline, span));
        let late = now > accept_until(deadline, span);
        let more = req.more;
        let api::SynchronizeRequest {
            pods, containers, ..
        } = req;
        let sizes = |pods: &[api::PodSandbox], containers: &[api::Container]| {
            let p = pods.iter().map(object_size);
            p.chain(containers.iter().map(object_size))
                .fold(0usize, usize::saturating_add)
        };
        let first = self.held.pods.is_empty() && self.held.containers.is_empty();
        if !late && first && pods.len() + containers.len() <= self.budget_objects {
            // The usual case, one message within the bounds: keep its
            // vectors rather than copy every object into new ones.
            let bytes = sizes(&pods, &containers);
            if bytes <= self.budget_bytes {
                self.bytes = bytes;
                self.held = Snapshot {
                    pods,
                    containers,
                    runtime: String::new(),
                };
                return self.finish(more, deadline, span);
            }
        }
        for pod in pods {
            if !late && self.fits(object_size(&pod)) {
                self.held.pods.push(pod);
            } else {
                self.drop_one(late);
            }
        }
        for c in containers {
            if !late && self.fits(object_size(&c)) {
                self.held.containers.push(c);
            } else {
                self.drop_one(late);
            }
        }
        self.finish(more, deadline, span)
    }

    /// Whether nothing of a Synchronize is held yet, so that a message
    /// may be taken whole by [`Self::take_whole`].
    pub fn is_fresh(&self) -> bool {
        self.deadline.is_none()
    }

    /// Takes a fresh Synchronize sent as one message (`more` false) of
    /// `objects` pods and containers in `bytes` encoded bytes (at least
    /// what [`Self::push`] counts of them) that [`Self::push`] would keep
    /// whole: returns until when its answer is in time. `None` (and
    /// nothing changed) for any other message, which goes to
    /// [`Self::push`].
    pub fn take_whole(
        &self,
        objects: usize,
        bytes: usize,
        more: bool,
        timeout: Option<Duration>,
        now: Instant,
    ) -> Option<Option<Instant>> {
        // A fresh message is never late: its whole timeout lies ahead.
        if !self.is_fresh() || more || objects > self.budget_objects || bytes > self.budget_bytes {
            return None;
        }
        let span = timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        Some(answer_by(now + span, span))
    }

    /// The whole Synchronize once its last chunk is in.
    fn finish(&mut self, more: bool, deadline: Instant, span: Duration) -> Option<Complete> {
        if more {
            return None;
        }
        let done = Complete {
            snapshot: std::mem::take(&mut self.held),
            dropped: self.dropped,
            answer_by: answer_by(deadline, span),
        };
        self.start_over();
        Some(done)
    }

    /// Forgets every chunk held (a new session), keeping the budget.
    pub fn start_over(&mut self) {
        *self = Self::new(self.budget_bytes, self.budget_objects);
    }

    fn fits(&mut self, size: usize) -> bool {
        let objects = self.held.pods.len() + self.held.containers.len();
        if objects >= self.budget_objects || self.bytes.saturating_add(size) > self.budget_bytes {
            return false;
        }
        self.bytes += size;
        true
    }

    fn drop_one(&mut self, late: bool) {
        self.dropped += 1;
        if !self.logged {
            self.logged = true;
            warn!(
                budget_bytes = self.budget_bytes,
                budget_objects = self.budget_objects,
                held_bytes = self.bytes,
                too_late = late,
                "Synchronize is larger than we hold or arrives too late for the runtime's timeout; answering with what fits"
            );
        }
    }

    /// Encoded bytes held now.
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }
}

/// An object's encoded size; one too large for `usize` reads as `usize::MAX`,
/// so it fails [`SyncReassembler::fits`] and is dropped like any oversized one.
fn object_size(o: &impl Message) -> usize {
    usize::try_from(o.compute_size()).unwrap_or(usize::MAX)
}

/// Chunks are taken until a quarter of the time is left, for deciding
/// and answering.
fn accept_until(deadline: Instant, span: Duration) -> Instant {
    deadline.checked_sub(span / 4).unwrap_or(deadline)
}

/// When deciding stops so that the answer still leaves in time.
fn answer_by(deadline: Instant, span: Duration) -> Option<Instant> {
    deadline.checked_sub(span / 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctr(id: &str, pad: usize) -> api::Container {
        let mut c = api::Container::new();
        c.id = id.into();
        c.name = "x".repeat(pad);
        c
    }

    fn chunk(containers: Vec<api::Container>, more: bool) -> api::SynchronizeRequest {
        api::SynchronizeRequest {
            containers,
            more,
            ..Default::default()
        }
    }

    #[test]
    fn chunks_are_joined_in_order() {
        let mut r = SyncReassembler::default();
        let t = Instant::now();
        assert!(r.push(chunk(vec![ctr("a", 1)], true), None, t).is_none());
        let done = r.push(chunk(vec![ctr("b", 1)], false), None, t).unwrap();
        let ids: Vec<_> = done
            .snapshot
            .containers
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(done.dropped, 0);
        // Starts over for the next Synchronize.
        let done = r.push(chunk(vec![], false), None, t).unwrap();
        assert!(done.snapshot.containers.is_empty());
    }

    #[test]
    fn bytes_beyond_the_budget_are_dropped_and_what_fits_is_kept() {
        let mut r = SyncReassembler::new(10_000, 1_000);
        let t = Instant::now();
        for i in 0..10 {
            assert!(r
                .push(chunk(vec![ctr(&format!("c{i}"), 3_000)], true), None, t)
                .is_none());
            assert!(r.held_bytes() <= 10_000);
        }
        let done = r
            .push(chunk(vec![ctr("small", 1)], false), None, t)
            .unwrap();
        assert_eq!(
            done.snapshot.containers.len(),
            4,
            "3 big ones and the small one fit"
        );
        assert_eq!(done.dropped, 7);
    }

    #[test]
    fn only_a_fresh_last_message_within_the_bounds_is_taken_whole() {
        let t = Instant::now();
        let mut r = SyncReassembler::new(1_000, 10);
        assert!(r.take_whole(10, 1_000, false, None, t).is_some());
        for (objects, bytes, more) in [(11, 1, false), (1, 1_001, false), (1, 1, true)] {
            assert!(r.take_whole(objects, bytes, more, None, t).is_none());
            assert!(r.is_fresh(), "nothing changed");
        }
        assert!(r.push(chunk(vec![ctr("a", 1)], true), None, t).is_none());
        assert!(
            r.take_whole(1, 1, false, None, t).is_none(),
            "a chunk is held"
        );
        let done = r.push(chunk(vec![ctr("b", 1)], false), None, t).unwrap();
        assert_eq!(done.snapshot.containers.len(), 2);
        let answer_by = r.take_whole(1, 1, false, Some(Duration::from_secs(8)), t);
        assert_eq!(answer_by, Some(Some(t + Duration::from_secs(7))));
    }

    #[test]
    fn objects_beyond_the_count_are_dropped() {
        let mut r = SyncReassembler::new(usize::MAX, 5);
        let t = Instant::now();
        let many: Vec<_> = (0..8).map(|i| ctr(&i.to_string(), 0)).collect();
        let done = r.push(chunk(many, false), None, t).unwrap();
        assert_eq!((done.snapshot.containers.len(), done.dropped), (5, 3));
    }

    #[test]
    fn chunks_that_arrive_too_late_for_the_timeout_are_not_held() {
        let mut r = SyncReassembler::default();
        let t = Instant::now();
        let timeout = Some(Duration::from_secs(2));
        assert!(r
            .push(chunk(vec![ctr("early", 1)], true), timeout, t)
            .is_none());
        // 1.9 s later: the runtime gives up at 2 s; holding more only makes us late.
        let later = t + Duration::from_millis(1_900);
        let done = r
            .push(
                chunk(vec![ctr("late", 1)], false),
                Some(Duration::from_millis(100)),
                later,
            )
            .unwrap();
        assert_eq!(done.snapshot.containers.len(), 1);
        assert_eq!(done.dropped, 1);
        assert!(done.answer_by.unwrap() <= t + Duration::from_secs(2));
    }
}
