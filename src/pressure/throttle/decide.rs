//! The pure state machine: samples and time in, a [`Decision`] out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Counters, Sample, ThrottleConfig};
use crate::qos::QosClass;

/// PSI avg10 is a 10 s exponential average: after relaxing, the stall it
/// reports decays over about this long even when throttling stopped at once.
pub const PSI_SETTLE: Duration = Duration::from_secs(10);

/// After a relax (or when a container is first seen already relaxed), PSI
/// alone counts again only this much later: three avg10 time constants, by
/// which a stall that ended at the relax reads under 5 % of what it was.
/// Not forever: a relaxed container stalled by a limit that is not its own
/// (its pod's memory.high, a thrashing node) must still be evicted.
pub const PSI_AFTER_RELAX: Duration = Duration::from_secs(30);

/// Event rates are taken over at least this long (see [`Guard::observe`]).
/// Two seconds: the longest penalty sleep the kernel puts a task over its
/// memory.high into (5.9+), so every window of a throttled allocator
/// holds some events.
pub const RATE_WINDOW: Duration = Duration::from_secs(2);

/// Bound on tracked containers (bounded memory on a weird host).
const MAX_TRACKED: usize = 8192;

/// The three signals of one container at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Signals {
    /// `high` events per second since the previous sample.
    pub high_rate: f64,
    pub max_rate: f64,
    /// `some avg10`, percent.
    pub psi_some_avg10: f64,
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
pub enum Decision {
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
    last: Option<(Duration, Counters)>,
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
pub struct Guard {
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

impl Guard {
    pub fn new(cfg: ThrottleConfig) -> Self {
        Guard {
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

    /// The signals last computed for a container.
    pub fn signals(&self, path: &Path) -> Option<Signals> {
        self.tracks.get(path).map(|t| t.signals)
    }

    /// Feeds one sample and returns what to do. Guaranteed is never acted on.
    pub fn observe(&mut self, now: Duration, s: &Sample) -> Decision {
        if s.class == QosClass::Guaranteed {
            return Decision::Calm;
        }
        if !self.tracks.contains_key(&s.path) && self.tracks.len() >= MAX_TRACKED {
            return Decision::Calm;
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

    /// Tracked container paths (for the monitor's quiet/prune pass).
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
) -> Decision {
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
            return if active {
                Decision::Settling
            } else {
                Decision::Calm
            };
        }
        t.settle_until = None;
    }
    if !active {
        t.under_since = None;
        return Decision::Calm;
    }
    let since = *t.under_since.get_or_insert(now);
    let held = now.saturating_sub(since);
    if held < cfg.grace_period.0 {
        return Decision::Throttled { for_: held };
    }
    if high && !relaxed && !t.relax_done {
        // Exactly once per container id, whether the write works or not.
        t.relax_done = true;
        t.under_since = None;
        t.settle_until = Some(now + PSI_SETTLE);
        t.psi_from = Some(now + PSI_AFTER_RELAX);
        return Decision::Relax;
    }
    match signals.strongest(cfg) {
        Some(signal) => Decision::Evict { signal },
        None => Decision::Calm,
    }
}
