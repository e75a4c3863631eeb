//! The pure state machine: samples and time in, a [`ThrottleDecision`] out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::config::ThrottleConfig;
use super::sample::{EventCounts, Sample};
use crate::node::QosClass;

/// PSI avg10 is a 10 s exponential average: after relaxing, the stall it
/// reports decays over about this long even when throttling stopped at once.
pub const PSI_SETTLE: Duration = Duration::from_secs(10);

/// After a relax (or when a container is first seen already relaxed), PSI
/// alone counts again only this much later: three avg10 time constants, by
/// which a stall that ended at the relax reads under 5 % of what it was.
/// Not forever: a relaxed container stalled by a limit that is not its own
/// (its pod's memory.high, a thrashing node) must still be evicted.
pub const PSI_AFTER_RELAX: Duration = Duration::from_secs(30);

/// Event rates are taken over at least this long (see [`Throttles::observe`]).
/// Two seconds: the longest penalty sleep the kernel puts a task over its
/// memory.high into (5.9+), so every window of a throttled allocator
/// holds some events.
pub const RATE_WINDOW: Duration = Duration::from_secs(2);

/// Bound on tracked containers (bounded memory on a weird host).
const MAX_TRACKED: usize = 8192;

/// The three signals of one container at one moment, and how long it has
/// been under throttle.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Signals {
    /// `high` events per second since the previous sample.
    pub high_rate: f64,
    pub max_rate: f64,
    /// `some avg10`, percent.
    pub psi_some_avg10: f64,
    /// Since the grace period started (zero while not under throttle), by
    /// the guard's clock: at a relax, detection to relax.
    pub under_throttle_for: Duration,
}

/// Which signal made a decision; a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    High,
    Max,
    Psi,
}

impl Signal {
    pub fn label(self) -> &'static str {
        match self {
            Signal::High => "high",
            Signal::Max => "max",
            Signal::Psi => "psi",
        }
    }
}

impl Signals {
    fn active(&self, cfg: &ThrottleConfig) -> (bool, bool, bool) {
        (
            self.high_rate > cfg.high_rate,
            self.max_rate > cfg.max_rate,
            self.psi_some_avg10 > cfg.psi_some_avg10,
        )
    }

    /// The signal named with an eviction: PSI (the stall) first, then max,
    /// then high.
    fn strongest(&self, cfg: &ThrottleConfig) -> Option<Signal> {
        match self.active(cfg) {
            (_, _, true) => Some(Signal::Psi),
            (_, true, _) => Some(Signal::Max),
            (true, _, _) => Some(Signal::High),
            _ => None,
        }
    }
}

/// What the guard wants done with one container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThrottleDecision {
    /// No signal above its threshold.
    Calm,
    /// Under throttle, within the grace period.
    Throttled { for_: Duration },
    /// Relaxed a moment ago: signals are given PSI_SETTLE to fall.
    Settling,
    /// Stage 1: raise memory.high to memory.max.
    Relax,
    /// Stage 2: the pod is an eviction candidate.
    Evict { signal: Signal },
}

#[derive(Debug, Clone)]
struct Track {
    id: String,
    last: Option<(Duration, EventCounts)>,
    signals: Signals,
    under_since: Option<Duration>,
    /// We relaxed it (or tried to): never again for this container id.
    relax_done: bool,
    /// No stage 2 before this (PSI avg10 decays after a relax).
    settle_until: Option<Duration>,
    /// PSI alone does not count before this (see [`PSI_AFTER_RELAX`]).
    psi_from: Option<Duration>,
    /// Only a baseline so far: look again soon for a rate.
    pending: bool,
}

impl Track {
    /// Needs a look at the guard's interval rather than the calm one.
    fn busy(&self) -> bool {
        self.pending || self.under_since.is_some() || self.settle_until.is_some()
    }

    fn new(id: &str) -> Self {
        Track {
            id: id.to_string(),
            last: None,
            signals: Signals::default(),
            under_since: None,
            relax_done: false,
            settle_until: None,
            psi_from: None,
            pending: true,
        }
    }
}

/// Per-container throttle state.
#[derive(Debug, Clone)]
pub struct Throttles {
    cfg: ThrottleConfig,
    tracks: HashMap<PathBuf, Track>,
}

/// Rate of a counter between two reads; a counter that went down (a new
/// cgroup under the same path) yields `None`.
pub fn rate(before: u64, after: u64, elapsed: Duration) -> Option<f64> {
    let delta = after.checked_sub(before)?;
    let secs = elapsed.as_secs_f64();
    Some(if secs > 0.0 { delta as f64 / secs } else { 0.0 })
}

impl Throttles {
    pub fn new(cfg: ThrottleConfig) -> Self {
        Throttles {
            cfg,
            tracks: HashMap::new(),
        }
    }

    pub fn config(&self) -> &ThrottleConfig {
        &self.cfg
    }

    /// Containers under throttle now (the gauge).
    pub fn under_throttle(&self) -> usize {
        self.tracks
            .values()
            .filter(|t| t.under_since.is_some())
            .count()
    }

    /// True while some container needs watching at the guard's interval.
    pub fn busy(&self) -> bool {
        self.tracks.values().any(Track::busy)
    }

    /// How long until the earliest grace period (or settle time) still
    /// ahead ends, so the guard looks right then rather than up to an
    /// interval later.
    pub fn next_due(&self, now: Duration) -> Option<Duration> {
        self.tracks
            .values()
            .flat_map(|t| {
                let grace_ends = t.under_since.map(|s| s + self.cfg.grace_period.0);
                [grace_ends, t.settle_until]
            })
            .flatten()
            .filter(|&due| due > now)
            .map(|due| due - now)
            .min()
    }

    /// The signals last computed for a container.
    pub fn signals(&self, path: &Path) -> Option<Signals> {
        self.tracks.get(path).map(|t| t.signals)
    }

    /// Feeds one sample and returns what to do. Guaranteed is never acted on.
    pub fn observe(&mut self, now: Duration, s: &Sample) -> ThrottleDecision {
        if s.class == QosClass::Guaranteed {
            return ThrottleDecision::Calm;
        }
        if !self.tracks.contains_key(&s.path) && self.tracks.len() >= MAX_TRACKED {
            return ThrottleDecision::Calm;
        }
        let t = self
            .tracks
            .entry(s.path.clone())
            .or_insert_with(|| Track::new(&s.id));
        if t.id != s.id {
            // The container restarted under the same cgroup name: new baseline.
            *t = Track::new(&s.id);
        }
        let reset = t
            .last
            .is_some_and(|(_, c)| s.counters.high < c.high || s.counters.max < c.max);
        match t.last {
            // A counter went down: a new cgroup under this name. New baseline,
            // and its throttle history is gone too.
            Some(_) if reset => {
                *t = Track::new(&s.id);
                t.last = Some((now, s.counters));
            }
            None => t.last = Some((now, s.counters)),
            // Rates over at least RATE_WINDOW: a throttled allocator sleeps
            // in the kernel's penalty for up to 2 s between bursts of events,
            // and a shorter window would see "no events" in that gap and
            // restart the grace period (seen in the VM with 0.5 s windows).
            Some((at, c)) if now.saturating_sub(at) >= RATE_WINDOW => {
                let dt = now.saturating_sub(at);
                t.signals.high_rate = rate(c.high, s.counters.high, dt).unwrap_or(0.0);
                t.signals.max_rate = rate(c.max, s.counters.max, dt).unwrap_or(0.0);
                t.last = Some((now, s.counters));
                t.pending = false;
            }
            Some(_) => {}
        }
        if t.pending {
            if s.high.is_some() && s.high == s.max {
                // New to us but relaxed (by us before a restart): its PSI
                // may still be the lagging average of the throttle.
                t.psi_from.get_or_insert(now + PSI_AFTER_RELAX);
            }
            // No rate yet (a new baseline starts with no history).
            t.signals.high_rate = 0.0;
            t.signals.max_rate = 0.0;
        }
        t.signals.psi_some_avg10 = s.psi_some_avg10;
        // After a relax, PSI alone does not count for PSI_AFTER_RELAX:
        // avg10 lags, and in the VM a relaxed allocator still showed some
        // avg10 ~17 % with no high or max events 10 s after the relax.
        let psi_counts = t.psi_from.is_none_or(|u| now >= u);
        decide(&self.cfg, t, now, s.relaxed(), psi_counts)
    }

    /// A container that was not read this pass because its QoS parent's or
    /// pod's counters did not move and their PSI is below threshold: every
    /// signal is below. A calm one is forgotten (tracks exist only while
    /// there is something to watch; the next look starts a new baseline and
    /// comes back at the guard's interval for the rate), except one we
    /// relaxed: relaxing stays once per container.
    pub fn quiet(&mut self, now: Duration, path: &Path) {
        let Some(t) = self.tracks.get_mut(path) else {
            return;
        };
        t.signals = Signals::default();
        t.under_since = None;
        t.pending = false;
        if t.settle_until.is_some_and(|u| now >= u) {
            t.settle_until = None;
        }
        if let Some((_, c)) = t.last {
            t.last = Some((now, c));
        }
        if !t.busy() && !t.relax_done {
            self.tracks.remove(path);
        }
    }

    /// Whether any tracked container below `cg` needs watching.
    pub fn busy_under(&self, cg: &Path) -> bool {
        self.tracks
            .iter()
            .any(|(p, t)| t.busy() && p.starts_with(cg))
    }

    pub fn is_tracked(&self, path: &Path) -> bool {
        self.tracks.contains_key(path)
    }

    /// Tracked container paths (for the pass's quiet/prune step).
    pub fn tracked(&self) -> Vec<PathBuf> {
        self.tracks.keys().cloned().collect()
    }

    /// Forgets containers whose cgroup is gone.
    pub fn forget(&mut self, path: &Path) {
        self.tracks.remove(path);
    }
}

/// The pure grace / stage logic of one track.
fn decide(
    cfg: &ThrottleConfig,
    t: &mut Track,
    now: Duration,
    relaxed: bool,
    psi_counts: bool,
) -> ThrottleDecision {
    let mut signals = t.signals;
    if !psi_counts {
        signals.psi_some_avg10 = 0.0;
    }
    let (high, max, psi) = signals.active(cfg);
    let active = high || max || psi;
    if let Some(until) = t.settle_until {
        if now < until {
            // Just relaxed: the signals get time to fall before a new grace.
            t.under_since = None;
            t.signals.under_throttle_for = Duration::ZERO;
            return if active {
                ThrottleDecision::Settling
            } else {
                ThrottleDecision::Calm
            };
        }
        t.settle_until = None;
    }
    if !active {
        t.under_since = None;
        t.signals.under_throttle_for = Duration::ZERO;
        return ThrottleDecision::Calm;
    }
    let since = *t.under_since.get_or_insert(now);
    let held = now.saturating_sub(since);
    t.signals.under_throttle_for = held;
    if held < cfg.grace_period.0 {
        return ThrottleDecision::Throttled { for_: held };
    }
    if high && !relaxed && !t.relax_done {
        // Exactly once per container id, whether the write works or not.
        t.relax_done = true;
        t.under_since = None;
        t.settle_until = Some(now + PSI_SETTLE);
        t.psi_from = Some(now + PSI_AFTER_RELAX);
        return ThrottleDecision::Relax;
    }
    match signals.strongest(cfg) {
        Some(signal) => ThrottleDecision::Evict { signal },
        None => ThrottleDecision::Calm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::cgroupfs::RELAXED_WITHOUT_LIMIT;
    use proptest::prelude::*;

    fn cfg() -> ThrottleConfig {
        ThrottleConfig::default()
    }

    fn s(class: QosClass, id: &str, high: u64, max: u64, psi: f64) -> Sample {
        Sample {
            path: PathBuf::from("/kp/burstable/podu/cri-containerd-c.scope"),
            id: id.into(),
            pod_uid: "u".into(),
            pod_path: PathBuf::from("/kp/burstable/podu"),
            class,
            counters: EventCounts { high, max },
            psi_some_avg10: psi,
            high: Some(236 << 20),
            max: Some(256 << 20),
        }
    }

    fn secs(v: f64) -> Duration {
        Duration::from_secs_f64(v)
    }

    /// Feeds `high` events at `per_s` for `dur` seconds, sampling every
    /// 500 ms from `start`; returns the decisions.
    fn run(
        g: &mut Throttles,
        start: f64,
        dur: f64,
        per_s: u64,
        base: &mut u64,
        sample: impl Fn(u64) -> Sample,
    ) -> Vec<ThrottleDecision> {
        let mut out = Vec::new();
        let mut t = start;
        while t <= start + dur + 1e-9 {
            out.push(g.observe(secs(t), &sample(*base)));
            *base += per_s / 2;
            t += 0.5;
        }
        out
    }

    /// The next look lands on the end of the grace period, not up to an
    /// interval after it.
    #[test]
    fn throttle_next_look_is_due_when_the_grace_ends() {
        let mut g = Throttles::new(cfg());
        assert_eq!(g.next_due(secs(0.0)), None);
        let mut n = 0;
        run(&mut g, 0.0, 3.0, 200, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 5.0)
        });
        // Under throttle from 2 s (the first rate): the grace ends at 12 s.
        assert_eq!(g.next_due(secs(3.0)), Some(secs(9.0)));
        // Past it (stage 2 repeats until it acts): the interval applies.
        assert_eq!(g.next_due(secs(12.3)), None);
    }

    #[test]
    fn throttle_rate_and_reset() {
        assert_eq!(rate(10, 30, secs(2.0)), Some(10.0));
        assert_eq!(rate(30, 10, secs(2.0)), None);
        assert_eq!(rate(5, 5, Duration::ZERO), Some(0.0));
    }

    #[test]
    fn throttle_transient_spike_shorter_than_grace_does_nothing() {
        let mut g = Throttles::new(cfg());
        let mut n = 0;
        // 5 s of 1000 high/s, then quiet: never past the 10 s grace.
        let d = run(&mut g, 0.0, 5.0, 1000, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 30.0)
        });
        assert!(d.iter().all(|d| matches!(
            d,
            ThrottleDecision::Calm | ThrottleDecision::Throttled { .. }
        )));
        let d = run(&mut g, 5.5, 20.0, 0, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 0.0)
        });
        assert!(
            d.iter().all(|d| matches!(
                d,
                ThrottleDecision::Calm | ThrottleDecision::Throttled { .. }
            )),
            "{d:?}"
        );
        assert_eq!(d.last(), Some(&ThrottleDecision::Calm));
        assert_eq!(g.under_throttle(), 0);
    }

    #[test]
    fn throttle_sustained_high_relaxes_exactly_once_then_evicts_if_it_persists() {
        let mut g = Throttles::new(cfg());
        let mut n = 0;
        let d = run(&mut g, 0.0, 12.0, 200, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 5.0)
        });
        let relaxes: Vec<usize> = (0..d.len())
            .filter(|&i| d[i] == ThrottleDecision::Relax)
            .collect();
        // The first sample only sets the baseline, the first rate comes
        // after RATE_WINDOW: throttled from 2 s, relaxed at 12 s, once.
        assert_eq!(relaxes.len(), 1, "{d:?}");
        assert_eq!(relaxes[0], 24);
        // Still `high` (the tree says not relaxed: the write was dropped):
        // no second relax; stage 2 after the PSI settle time plus grace.
        let d = run(&mut g, 12.5, 30.0, 200, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 5.0)
        });
        assert!(!d.contains(&ThrottleDecision::Relax));
        // PSI avg10 settles for 10 s after the relax: no new grace yet.
        assert!(
            d[..19].iter().all(|d| *d == ThrottleDecision::Settling),
            "{d:?}"
        );
        let first_evict = d
            .iter()
            .position(|d| matches!(d, ThrottleDecision::Evict { .. }))
            .unwrap();
        let at = 12.5 + first_evict as f64 * 0.5;
        assert!(at >= 12.0 + 10.0 + 10.0 - 1e-9, "evicted at {at}");
        assert_eq!(
            d[first_evict],
            ThrottleDecision::Evict {
                signal: Signal::High
            }
        );
    }

    #[test]
    fn throttle_relaxed_container_that_calms_down_is_left_alone() {
        let mut g = Throttles::new(cfg());
        let mut n = 0;
        run(&mut g, 0.0, 12.0, 200, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 30.0)
        });
        // After relaxing: no more high events; PSI decays below 10 % in 8 s.
        let mut relaxed = s(QosClass::Burstable, "c", 0, 0, 0.0);
        relaxed.high = relaxed.max;
        let mut t = 12.5;
        while t < 60.0 {
            let psi = 30.0 * (-(t - 12.0) / 7.0f64).exp();
            relaxed.counters.high = n;
            relaxed.psi_some_avg10 = psi;
            let d = g.observe(secs(t), &relaxed);
            assert!(
                !matches!(d, ThrottleDecision::Evict { .. } | ThrottleDecision::Relax),
                "{t}: {d:?}"
            );
            t += 0.5;
        }
        assert!(!g.busy());
    }

    /// A throttled allocator sleeps in the kernel's penalty between bursts
    /// of events: looks that land in a gap must not restart the grace.
    #[test]
    fn throttle_bursty_events_keep_the_grace_running() {
        let mut g = Throttles::new(cfg());
        let mut high = 0;
        let mut relaxed_at = None;
        for i in 0..30u64 {
            if i % 4 == 0 {
                high += 400; // one burst every 2 s: 200/s on average
            }
            let d = g.observe(
                secs(i as f64 * 0.5),
                &s(QosClass::Burstable, "c", high, 0, 3.0),
            );
            if d == ThrottleDecision::Relax {
                relaxed_at = Some(i as f64 * 0.5);
            }
        }
        let at = relaxed_at.expect("relaxed");
        assert!((12.0..=13.0).contains(&at), "relaxed at {at}");
    }

    /// Found relaxed (a relax before our restart) with PSI up and no
    /// events: the PSI may be the throttle's lagging average, so it counts
    /// only from PSI_AFTER_RELAX after first sight; a stall that outlasts
    /// that is real and ends in stage 2, never in a second relax.
    #[test]
    fn throttle_psi_alone_waits_out_a_relax_then_counts() {
        let mut g = Throttles::new(cfg());
        let mut r = s(QosClass::Burstable, "c", 0, 0, 40.0);
        r.high = r.max;
        let mut n = 0;
        let d = run(&mut g, 0.0, 60.0, 0, &mut n, |_| r.clone());
        let first = d.iter().position(|d| *d != ThrottleDecision::Calm).unwrap();
        assert_eq!(first as f64 * 0.5, PSI_AFTER_RELAX.as_secs_f64(), "{d:?}");
        let evict = d
            .iter()
            .position(|d| matches!(d, ThrottleDecision::Evict { .. }))
            .unwrap();
        assert_eq!(evict as f64 * 0.5, 40.0, "{d:?}");
        assert_eq!(
            d[evict],
            ThrottleDecision::Evict {
                signal: Signal::Psi
            }
        );
        assert!(!d.contains(&ThrottleDecision::Relax));
    }

    /// Relaxed by us, the `high` events stop, but the container stays
    /// stalled (its pod's memory.high, a thrashing node: a limit that is
    /// not its own): the lagging PSI is ignored for PSI_AFTER_RELAX, then
    /// the stall counts and the pod is evicted, naming PSI. Before, PSI
    /// never counted again and such a pod stayed stalled for good.
    #[test]
    fn throttle_relaxed_container_still_stalled_is_evicted_on_psi() {
        let mut g = Throttles::new(cfg());
        let mut n = 0;
        let d = run(&mut g, 0.0, 12.0, 200, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 5.0)
        });
        assert_eq!(d.last(), Some(&ThrottleDecision::Relax));
        let mut relaxed = s(QosClass::Burstable, "c", n, 0, 40.0);
        relaxed.high = relaxed.max;
        let d = run(&mut g, 12.5, 40.0, 0, &mut n, |_| relaxed.clone());
        let at = |i: usize| 12.5 + i as f64 * 0.5;
        let evict = d
            .iter()
            .position(|d| matches!(d, ThrottleDecision::Evict { .. }))
            .expect("evicted");
        assert_eq!(at(evict), 12.0 + 30.0 + 10.0, "{d:?}");
        assert_eq!(
            d[evict],
            ThrottleDecision::Evict {
                signal: Signal::Psi
            }
        );
        // Nothing before: settling, then PSI ignored (Calm), then the grace.
        assert!(d[..evict].iter().all(|d| matches!(
            d,
            ThrottleDecision::Settling
                | ThrottleDecision::Calm
                | ThrottleDecision::Throttled { .. }
        )));
        assert!(!d.contains(&ThrottleDecision::Relax));
    }

    #[test]
    fn throttle_without_high_goes_straight_to_stage_2() {
        let mut g = Throttles::new(cfg());
        let mut n = 0;
        let d = run(&mut g, 0.0, 12.0, 0, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 40.0)
        });
        assert!(!d.contains(&ThrottleDecision::Relax));
        assert_eq!(
            d.last(),
            Some(&ThrottleDecision::Evict {
                signal: Signal::Psi
            })
        );
        // Only max events (at the limit, no stall reported): stage 2 too.
        let mut g = Throttles::new(cfg());
        let d = run(&mut g, 0.0, 12.0, 400, &mut n, |c| {
            s(QosClass::Burstable, "c", 0, c, 0.0)
        });
        assert_eq!(
            d.last(),
            Some(&ThrottleDecision::Evict {
                signal: Signal::Max
            })
        );
    }

    #[test]
    fn throttle_guaranteed_is_never_touched() {
        let mut g = Throttles::new(cfg());
        let mut n = 0;
        let d = run(&mut g, 0.0, 60.0, 5000, &mut n, |c| {
            s(QosClass::Guaranteed, "c", c, c, 90.0)
        });
        assert!(d.iter().all(|d| *d == ThrottleDecision::Calm));
        assert_eq!(g.under_throttle(), 0);
    }

    #[test]
    fn throttle_relaxed_state_comes_from_the_tree() {
        let mut x = s(QosClass::Burstable, "c", 0, 0, 0.0);
        assert!(!x.relaxed());
        x.high = x.max;
        assert!(x.relaxed());
        x.max = None;
        x.high = None;
        assert!(x.relaxed());
        assert_eq!(x.relax_value(), RELAXED_WITHOUT_LIMIT);
        x.high = Some(RELAXED_WITHOUT_LIMIT);
        assert!(x.relaxed());
        // Found relaxed after a restart: never relaxed again, stage 2 only.
        let mut g = Throttles::new(cfg());
        let mut n = 0;
        let mut r = s(QosClass::Burstable, "c", 0, 0, 0.0);
        r.high = r.max;
        let d = run(&mut g, 0.0, 12.0, 400, &mut n, |c| {
            let mut r = r.clone();
            r.counters.high = c;
            r
        });
        assert!(!d.contains(&ThrottleDecision::Relax));
        assert!(matches!(d.last(), Some(ThrottleDecision::Evict { .. })));
    }

    /// One step of a generated counter sequence.
    #[derive(Debug, Clone)]
    enum Step {
        /// `high` events in the next 500 ms, PSI.
        Tick(u64, f64),
        /// The container restarted: counters back to a small value, new id.
        Restart(u64),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            prop_oneof![
                10 => (0u64..400, 0.0f64..60.0).prop_map(|(h, p)| Step::Tick(h, p)),
                1 => (0u64..50).prop_map(Step::Restart),
            ],
            1..200,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        /// Over random counter sequences: at most one relax per container id,
        /// a relax or eviction only after a whole grace period under
        /// throttle, an eviction of a container we relaxed only after the
        /// settle time plus grace, and never anything for Guaranteed.
        #[test]
        fn throttle_guard_invariants(seq in steps(), guaranteed in proptest::bool::weighted(0.1)) {
            let c = cfg();
            let grace = c.grace_period.0;
            let mut g = Throttles::new(c.clone());
            let class = if guaranteed { QosClass::Guaranteed } else { QosClass::Burstable };
            let (mut id, mut high) = (0u32, 0u64);
            let mut now = Duration::ZERO;
            // Consecutive samples with any signal active, and since when.
            let mut active_since: Option<Duration> = None;
            let mut relaxed_at: Option<Duration> = None;
            let mut relaxes_this_id = 0;
            let mut base: Option<(u32, Duration, u64)> = None;
            let (mut hr, mut pending) = (0.0f64, true);
            for step in seq {
                now += Duration::from_millis(500);
                let psi = match step {
                    Step::Tick(h, p) => { high += h; p }
                    Step::Restart(h) => {
                        id += 1; high = h; relaxes_this_id = 0; relaxed_at = None; 0.0
                    }
                };
                let mut x = s(class, &format!("c{id}"), high, 0, psi);
                x.path = PathBuf::from("/kp/podu/c");
                let d = g.observe(now, &x);
                // The independent model of "active": a rate needs a baseline
                // of the same id with counters that did not go down, at
                // least RATE_WINDOW old; in between the last rate holds.
                let psi_on = psi > c.psi_some_avg10;
                match base {
                    Some((bid, bt, bh)) if bid == id && bh <= high => {
                        if now - bt >= RATE_WINDOW {
                            hr = (high - bh) as f64 / (now - bt).as_secs_f64();
                            base = Some((id, now, high));
                            pending = false;
                        }
                    }
                    _ => {
                        base = Some((id, now, high));
                        pending = true;
                        active_since = None;
                    }
                }
                if pending {
                    active_since = if psi_on { active_since.or(Some(now)) } else { None };
                } else if hr > c.high_rate || psi_on {
                    active_since.get_or_insert(now);
                } else {
                    active_since = None;
                }
                match d {
                    ThrottleDecision::Relax => {
                        prop_assert!(!guaranteed);
                        prop_assert_eq!(relaxes_this_id, 0);
                        prop_assert!(active_since.is_some_and(|s| now - s >= grace));
                        relaxes_this_id += 1;
                        relaxed_at = Some(now);
                    }
                    ThrottleDecision::Evict { .. } => {
                        prop_assert!(!guaranteed);
                        prop_assert!(active_since.is_some_and(|s| now - s >= grace));
                        if let Some(r) = relaxed_at {
                            prop_assert!(now >= r + PSI_SETTLE + grace);
                        }
                    }
                    ThrottleDecision::Calm | ThrottleDecision::Throttled { .. } | ThrottleDecision::Settling => {}
                }
            }
        }
    }
}
