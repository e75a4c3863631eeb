//! The decision state machine: thresholds on memory.available with the
//! kubelet's minimum-reclaim hysteresis, a soft grace period and a
//! transition period for the pressure state. Whether an eviction may start
//! at all (one in flight, its cooldown) is the shared eviction path's
//! ([`crate::evict::Hold`]), passed in. Pure: time comes in as an argument,
//! so tests drive a fake clock.
//!
//! PSI never reaches this module: pressure only wakes the monitor up, and
//! every action here is gated on the node's working set.

use std::time::Duration;

use super::config::{MonitorConfig, SizeOrPercent};
pub use crate::evict::Hold;

#[derive(Debug, Clone, PartialEq)]
pub struct DecideConfig {
    pub hard: SizeOrPercent,
    /// Zero disables the soft threshold.
    pub soft: SizeOrPercent,
    pub soft_grace: Duration,
    pub min_reclaim: SizeOrPercent,
    pub transition: Duration,
    pub reclaim: bool,
    pub reclaim_interval: Duration,
}

impl From<&MonitorConfig> for DecideConfig {
    fn from(c: &MonitorConfig) -> Self {
        DecideConfig {
            hard: c.hard_threshold,
            soft: c.soft_threshold,
            soft_grace: c.soft_grace_period.0,
            min_reclaim: c.min_reclaim,
            transition: c.transition_period.0,
            reclaim: c.reclaim,
            reclaim_interval: c.reclaim_interval.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Hard,
    /// The soft threshold held for its whole grace period.
    Soft,
}

/// What to do now. `deficit` = bytes needed to get back to threshold +
/// min-reclaim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PressurePlan {
    /// No threshold met.
    Calm,
    /// Soft threshold met, within grace, reclaim already done recently.
    Watch,
    Reclaim {
        deficit: u64,
    },
    Evict {
        reason: Reason,
        deficit: u64,
    },
    Hold(Hold),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub plan: PressurePlan,
    /// The node-pressure condition (with transition period).
    pub pressure: bool,
    pub hard_met: bool,
    pub soft_met: bool,
    /// Resolved thresholds in bytes, for the log line.
    pub hard: u64,
    pub soft: u64,
    /// The pod in flight did not empty within kill-timeout (set by the
    /// monitor from the eviction path, not by [`Decider::observe`]).
    pub kill_timed_out: bool,
}

#[derive(Debug, Clone)]
pub struct Decider {
    cfg: DecideConfig,
    hard_met: bool,
    soft_met: bool,
    soft_since: Option<Duration>,
    last_met: Option<Duration>,
    /// Start of the current episode with a threshold met (for latency logs).
    met_since: Option<Duration>,
    pressure: bool,
    last_reclaim: Option<Duration>,
}

/// The kubelet's rule: met when threshold (+ min-reclaim if already met)
/// > available. A zero threshold is off.
fn met(threshold: u64, min_reclaim: u64, was_met: bool, available: u64) -> bool {
    let bar = if was_met {
        threshold.saturating_add(min_reclaim)
    } else {
        threshold
    };
    threshold > 0 && available < bar
}

impl Decider {
    pub fn new(cfg: DecideConfig) -> Self {
        Decider {
            cfg,
            hard_met: false,
            soft_met: false,
            soft_since: None,
            last_met: None,
            met_since: None,
            pressure: false,
            last_reclaim: None,
        }
    }

    pub fn pressure(&self) -> bool {
        self.pressure
    }

    /// When the current threshold-met episode began.
    pub fn met_since(&self) -> Option<Duration> {
        self.met_since
    }

    /// True while the monitor should look often: under pressure or soft
    /// threshold pending (a kill in flight or cooling down is the eviction
    /// path's to say).
    pub fn busy(&self) -> bool {
        self.pressure || self.soft_met
    }

    /// Feeds one measurement and returns what to do; `hold` is why the
    /// eviction path can take no eviction now, if it cannot.
    pub fn observe(
        &mut self,
        now: Duration,
        available: u64,
        capacity: u64,
        hold: Option<Hold>,
    ) -> Verdict {
        let hard = self.cfg.hard.resolve(capacity);
        let soft = self.cfg.soft.resolve(capacity);
        let mr = self.cfg.min_reclaim.resolve(capacity);

        self.hard_met = met(hard, mr, self.hard_met, available);
        let soft_now = met(soft, mr, self.soft_met, available);
        if !soft_now {
            self.soft_since = None;
        } else if !self.soft_met {
            self.soft_since = Some(now);
        }
        self.soft_met = soft_now;

        if self.hard_met || self.soft_met {
            self.met_since.get_or_insert(now);
            self.last_met = Some(now);
            self.pressure = true;
        } else {
            self.met_since = None;
            let quiet_for = self.last_met.map(|t| now.saturating_sub(t));
            if self.pressure && quiet_for.is_none_or(|q| q >= self.cfg.transition) {
                self.pressure = false;
            }
        }

        let mut v = Verdict {
            plan: PressurePlan::Calm,
            pressure: self.pressure,
            hard_met: self.hard_met,
            soft_met: self.soft_met,
            hard,
            soft,
            kill_timed_out: false,
        };

        if let Some(h) = hold {
            v.plan = PressurePlan::Hold(h);
            return v;
        }

        let deficit = |t: u64| t.saturating_add(mr).saturating_sub(available);
        v.plan = if self.hard_met {
            PressurePlan::Evict {
                reason: Reason::Hard,
                deficit: deficit(hard),
            }
        } else if self.soft_met {
            let since = self.soft_since.unwrap_or(now);
            if now.saturating_sub(since) >= self.cfg.soft_grace {
                PressurePlan::Evict {
                    reason: Reason::Soft,
                    deficit: deficit(soft),
                }
            } else if self.cfg.reclaim
                && self
                    .last_reclaim
                    .is_none_or(|t| now.saturating_sub(t) >= self.cfg.reclaim_interval)
            {
                self.last_reclaim = Some(now);
                PressurePlan::Reclaim {
                    deficit: deficit(soft),
                }
            } else {
                PressurePlan::Watch
            }
        } else {
            PressurePlan::Calm
        };
        v
    }

    /// The recheck right before a kill, on a fresh measurement: is an
    /// eviction still warranted? Does not change state.
    pub fn still_warranted(&self, now: Duration, available: u64, capacity: u64) -> bool {
        let mr = self.cfg.min_reclaim.resolve(capacity);
        let hard = met(
            self.cfg.hard.resolve(capacity),
            mr,
            self.hard_met,
            available,
        );
        let soft = met(
            self.cfg.soft.resolve(capacity),
            mr,
            self.soft_met,
            available,
        ) && self
            .soft_since
            .is_some_and(|s| now.saturating_sub(s) >= self.cfg.soft_grace);
        hard || soft
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;
    const CAP: u64 = 16 << 30;

    fn cfg() -> DecideConfig {
        DecideConfig {
            hard: SizeOrPercent::Bytes(100 * MI),
            soft: SizeOrPercent::Bytes(300 * MI),
            soft_grace: Duration::from_secs(2),
            min_reclaim: SizeOrPercent::Bytes(64 * MI),
            transition: Duration::from_secs(10),
            reclaim: true,
            reclaim_interval: Duration::from_secs(1),
        }
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn pressure_decide_calm_above_thresholds() {
        let mut d = Decider::new(cfg());
        let v = d.observe(ms(0), 4096 * MI, CAP, None);
        assert_eq!(v.plan, PressurePlan::Calm);
        assert!(!v.pressure && !d.busy());
    }

    #[test]
    fn pressure_decide_hard_evicts_with_min_reclaim_hysteresis() {
        let mut d = Decider::new(cfg());
        let v = d.observe(ms(0), 90 * MI, CAP, None);
        assert_eq!(
            v.plan,
            PressurePlan::Evict {
                reason: Reason::Hard,
                deficit: 74 * MI
            }
        );
        // Above the bare threshold but below threshold + min-reclaim: still met.
        let v = d.observe(ms(100), 150 * MI, CAP, None);
        assert!(v.hard_met);
        assert!(matches!(
            v.plan,
            PressurePlan::Evict {
                reason: Reason::Hard,
                ..
            }
        ));
        // Clear once available >= threshold + min-reclaim.
        let v = d.observe(ms(200), 164 * MI, CAP, None);
        assert!(!v.hard_met);
        // Not flapping back on a wobble just above 100Mi after clearing.
        assert!(!d.observe(ms(300), 120 * MI, CAP, None).hard_met);
    }

    #[test]
    fn pressure_decide_soft_reclaims_during_grace_then_evicts() {
        let mut d = Decider::new(cfg());
        assert_eq!(
            d.observe(ms(0), 250 * MI, CAP, None).plan,
            PressurePlan::Reclaim { deficit: 114 * MI }
        );
        // Reclaim is paced by reclaim-interval.
        assert_eq!(
            d.observe(ms(500), 250 * MI, CAP, None).plan,
            PressurePlan::Watch
        );
        assert_eq!(
            d.observe(ms(1000), 250 * MI, CAP, None).plan,
            PressurePlan::Reclaim { deficit: 114 * MI }
        );
        assert!(!d.still_warranted(ms(1500), 250 * MI, CAP));
        let v = d.observe(ms(2000), 250 * MI, CAP, None);
        assert!(matches!(
            v.plan,
            PressurePlan::Evict {
                reason: Reason::Soft,
                ..
            }
        ));
        assert!(d.still_warranted(ms(2000), 250 * MI, CAP));
    }

    #[test]
    fn pressure_decide_soft_grace_restarts_after_clearing() {
        let mut d = Decider::new(cfg());
        d.observe(ms(0), 250 * MI, CAP, None);
        d.observe(ms(1500), 400 * MI, CAP, None); // cleared (>= 300 + 64)
        d.observe(ms(1600), 250 * MI, CAP, None); // met again: grace restarts
        assert!(!matches!(
            d.observe(ms(3000), 250 * MI, CAP, None).plan,
            PressurePlan::Evict { .. }
        ));
        assert!(matches!(
            d.observe(ms(3600), 250 * MI, CAP, None).plan,
            PressurePlan::Evict { .. }
        ));
    }

    /// The eviction path's hold wins over any threshold, and the
    /// thresholds keep being tracked meanwhile.
    #[test]
    fn pressure_decide_holds_whatever_the_eviction_path_holds() {
        let mut d = Decider::new(cfg());
        assert!(matches!(
            d.observe(ms(0), 50 * MI, CAP, None).plan,
            PressurePlan::Evict { .. }
        ));
        let v = d.observe(ms(100), 50 * MI, CAP, Some(Hold::KillInFlight));
        assert_eq!(v.plan, PressurePlan::Hold(Hold::KillInFlight));
        assert!(v.hard_met && v.pressure);
        let cooling = Some(Hold::Cooldown { remaining: ms(900) });
        assert_eq!(
            d.observe(ms(400), 50 * MI, CAP, cooling).plan,
            PressurePlan::Hold(Hold::Cooldown { remaining: ms(900) })
        );
        assert!(d.busy());
        assert!(matches!(
            d.observe(ms(1300), 50 * MI, CAP, None).plan,
            PressurePlan::Evict { .. }
        ));
    }

    #[test]
    fn pressure_decide_transition_period_keeps_condition() {
        let mut d = Decider::new(cfg());
        d.observe(ms(0), 50 * MI, CAP, None);
        assert!(d.observe(ms(100), 8 << 30, CAP, None).pressure);
        assert!(d.observe(ms(9_999), 8 << 30, CAP, None).pressure);
        let v = d.observe(ms(10_000), 8 << 30, CAP, None);
        assert!(!v.pressure);
        assert_eq!(v.plan, PressurePlan::Calm);
    }

    #[test]
    fn pressure_decide_percent_and_disabled_soft() {
        let mut c = cfg();
        c.hard = SizeOrPercent::Percent(10.0);
        c.soft = SizeOrPercent::Bytes(0);
        c.min_reclaim = SizeOrPercent::Bytes(0);
        let mut d = Decider::new(c);
        assert_eq!(
            d.observe(ms(0), 1000, 10_000, None).plan,
            PressurePlan::Calm
        ); // 1000 is not < 1000
        assert!(matches!(
            d.observe(ms(1), 999, 10_000, None).plan,
            PressurePlan::Evict { .. }
        ));
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        /// Over random measurement sequences with the eviction path's one
        /// kill in flight and its cooldown modelled alongside: never an
        /// eviction while a kill is in flight or cooling down, never one
        /// above hard + min-reclaim unless the soft threshold held for its
        /// grace period, and never a reclaim or eviction with every
        /// threshold clear.
        #[test]
        fn pressure_decide_never_overkills(
            steps in proptest::collection::vec((0u64..500, 1u64..400, proptest::bool::ANY), 1..200)
        ) {
            let c = cfg();
            let (cooldown, kill_timeout) = (ms(1000), ms(5000));
            let mut d = Decider::new(c.clone());
            let mut now = Duration::ZERO;
            let mut in_flight_since: Option<Duration> = None;
            let mut cooldown_until = Duration::ZERO;
            for (avail_mi, dt_ms, finishes) in steps {
                now += ms(dt_ms);
                let timed_out = in_flight_since.is_some_and(|s| now - s >= kill_timeout);
                if (finishes || timed_out) && in_flight_since.take().is_some() {
                    cooldown_until = now + cooldown;
                }
                let hold = match in_flight_since {
                    Some(_) => Some(Hold::KillInFlight),
                    None if now < cooldown_until => Some(Hold::Cooldown { remaining: cooldown_until - now }),
                    None => None,
                };
                let v = d.observe(now, avail_mi * MI, CAP, hold);
                match v.plan {
                    PressurePlan::Evict { reason, .. } => {
                        prop_assert!(in_flight_since.is_none());
                        prop_assert!(now >= cooldown_until);
                        match reason {
                            Reason::Hard => prop_assert!(avail_mi < 164),
                            Reason::Soft => prop_assert!(avail_mi < 364),
                        }
                        in_flight_since = Some(now);
                    }
                    PressurePlan::Reclaim { .. } | PressurePlan::Watch => prop_assert!(avail_mi < 364),
                    PressurePlan::Calm => prop_assert!(avail_mi >= 100),
                    PressurePlan::Hold(_) => prop_assert!(in_flight_since.is_some() || now < cooldown_until),
                }
            }
        }
    }
}
