//! The memory.high throttle guard.
//!
//! A container whose anonymous memory sits between memory.high and
//! memory.max on a node without swap is throttled on every allocation and
//! never OOM-killed: the kernel leaves that failure mode to userspace. We put
//! memory.high on Burstable and BestEffort containers, so we watch it:
//!
//! - signals per container cgroup: the rates of `memory.events` `high` and
//!   `max` (delta / elapsed; a counter that goes down or a new container id
//!   starts a new baseline) and `memory.pressure` `some avg10`;
//! - a container is under throttle while any signal is above its threshold;
//!   the timer restarts only when all are below;
//! - stage 1: `high` active past the grace period ⇒ raise memory.high to
//!   memory.max (`max` without a limit), once;
//! - stage 2: still under throttle a grace period after relaxing (plus the
//!   time PSI avg10 needs to decay; PSI alone only from [`PSI_AFTER_RELAX`]
//!   on), or past grace without `high` at all (a stall that is not at the
//!   container's own memory.high) ⇒ the pod is an eviction candidate,
//!   ranked like node pressure.
//!
//! Guaranteed pods are never read. Reading is cheap: the QoS parents'
//! hierarchical `memory.events` and `memory.pressure` are read first and a
//! class is descended into only when they moved (see [`sample`]).
//!
//! The state machine ([`Guard`]) is pure: samples and time come in as
//! arguments.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::HumanDuration;
use super::MonitorError;
use crate::node::cgroupfs as stat;
use crate::node::relax::{RelaxRequest, RelaxVia, Relaxer};

mod decide;
mod sample;

pub use decide::{
    rate, Decision, Guard, Signal, Signals, PSI_AFTER_RELAX, PSI_SETTLE, RATE_WINDOW,
};
pub use sample::{
    containers_of, qos_parent, read_container, read_counters, read_psi, Counters, Filter, Sample,
};

/// The `[throttle]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ThrottleConfig {
    /// Watch containers' memory.high throttling at all.
    pub enabled: bool,
    /// Log the decisions, change nothing (the monitor's dry-run also applies).
    pub dry_run: bool,
    /// `memory.events` `high` per second above which the signal is active.
    pub high_rate: f64,
    /// `memory.events` `max` per second above which the signal is active.
    pub max_rate: f64,
    /// `memory.pressure` `some avg10` (percent) above which it is active.
    pub psi_some_avg10: f64,
    /// How long a container must stay under throttle before we act.
    pub grace_period: HumanDuration,
    /// While any container is under throttle, look this often.
    pub interval: HumanDuration,
    /// Who writes the relaxed memory.high (see [`RelaxVia`]).
    pub relax_via: RelaxVia,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            enabled: true,
            dry_run: false,
            high_rate: 50.0,
            max_rate: 50.0,
            psi_some_avg10: 10.0,
            grace_period: HumanDuration(Duration::from_secs(10)),
            interval: HumanDuration(Duration::from_millis(500)),
            relax_via: RelaxVia::CgroupFile,
        }
    }
}

impl ThrottleConfig {
    /// Rejects values that would make the guard misbehave, naming the key.
    pub fn validate(&self) -> Result<(), MonitorError> {
        let err = |m: String| Err(MonitorError::Config(m));
        for (key, v) in [("high-rate", self.high_rate), ("max-rate", self.max_rate)] {
            if !v.is_finite() || v <= 0.0 {
                return err(format!(
                    "throttle.{key} {v} must be a number of events per second > 0"
                ));
            }
        }
        let p = self.psi_some_avg10;
        if !p.is_finite() || !(0.0..100.0).contains(&p) || p == 0.0 {
            return err(format!(
                "throttle.psi-some-avg10 {p} must be a percentage in (0, 100)"
            ));
        }
        if self.grace_period.0.is_zero() {
            return err("throttle.grace-period must be > 0".into());
        }
        if self.interval.0.is_zero() || self.interval.0 > self.grace_period.0 {
            return err(format!(
                "throttle.interval {} must be > 0 and at most grace-period {}",
                self.interval, self.grace_period
            ));
        }
        Ok(())
    }

    /// Reads the `[throttle]` table of a TOML document (other tables ignored).
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, MonitorError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            throttle: Option<toml::Value>,
        }
        let bad = |at: String| move |source| MonitorError::ConfigParse { at, source };
        let file: File = toml::from_str(text).map_err(bad(format!("{origin}: ")))?;
        let cfg: ThrottleConfig = match file.throttle {
            Some(v) => v
                .try_into()
                .map_err(bad(format!("{origin}: [throttle] ")))?,
            None => ThrottleConfig::default(),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// memory.high as written to the file: bytes, or "max".
pub fn high_value(v: Option<u64>) -> String {
    v.map_or_else(|| "max".to_string(), |b| b.to_string())
}

impl Sample {
    /// What relaxing this container asks for: memory.high up to
    /// [`Sample::relax_value`].
    pub fn relax_request(&self) -> RelaxRequest {
        RelaxRequest {
            container_id: self.id.clone(),
            cgroup: self.path.clone(),
            value: high_value(self.relax_value()),
        }
    }
}

/// Writes memory.high of the container cgroup: the monitor alone (no NRI
/// session to tell the runtime through).
#[derive(Debug, Default)]
pub struct FileRelaxer;

impl Relaxer for FileRelaxer {
    fn relax(&self, r: &RelaxRequest) -> Result<&'static str, String> {
        stat::write_file(&r.cgroup.join("memory.high"), &r.value)
            .map(|()| "cgroup-file")
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::QosClass;
    use proptest::prelude::*;
    use std::path::PathBuf;

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
            counters: Counters { high, max },
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
        g: &mut Guard,
        start: f64,
        dur: f64,
        per_s: u64,
        base: &mut u64,
        sample: impl Fn(u64) -> Sample,
    ) -> Vec<Decision> {
        let mut out = Vec::new();
        let mut t = start;
        while t <= start + dur + 1e-9 {
            out.push(g.observe(secs(t), &sample(*base)));
            *base += per_s / 2;
            t += 0.5;
        }
        out
    }

    #[test]
    fn throttle_rate_and_reset() {
        assert_eq!(rate(10, 30, secs(2.0)), Some(10.0));
        assert_eq!(rate(30, 10, secs(2.0)), None);
        assert_eq!(rate(5, 5, Duration::ZERO), Some(0.0));
    }

    #[test]
    fn throttle_transient_spike_shorter_than_grace_does_nothing() {
        let mut g = Guard::new(cfg());
        let mut n = 0;
        // 5 s of 1000 high/s, then quiet: never past the 10 s grace.
        let d = run(&mut g, 0.0, 5.0, 1000, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 30.0)
        });
        assert!(d
            .iter()
            .all(|d| matches!(d, Decision::Calm | Decision::Throttled { .. })));
        let d = run(&mut g, 5.5, 20.0, 0, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 0.0)
        });
        assert!(
            d.iter()
                .all(|d| matches!(d, Decision::Calm | Decision::Throttled { .. })),
            "{d:?}"
        );
        assert_eq!(d.last(), Some(&Decision::Calm));
        assert_eq!(g.under_throttle(), 0);
    }

    #[test]
    fn throttle_sustained_high_relaxes_exactly_once_then_evicts_if_it_persists() {
        let mut g = Guard::new(cfg());
        let mut n = 0;
        let d = run(&mut g, 0.0, 12.0, 200, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 5.0)
        });
        let relaxes: Vec<usize> = (0..d.len()).filter(|&i| d[i] == Decision::Relax).collect();
        // The first sample only sets the baseline, the first rate comes
        // after RATE_WINDOW: throttled from 2 s, relaxed at 12 s, once.
        assert_eq!(relaxes.len(), 1, "{d:?}");
        assert_eq!(relaxes[0], 24);
        // Still `high` (the tree says not relaxed: the write was dropped):
        // no second relax; stage 2 after the PSI settle time plus grace.
        let d = run(&mut g, 12.5, 30.0, 200, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 5.0)
        });
        assert!(!d.contains(&Decision::Relax));
        // PSI avg10 settles for 10 s after the relax: no new grace yet.
        assert!(d[..19].iter().all(|d| *d == Decision::Settling), "{d:?}");
        let first_evict = d
            .iter()
            .position(|d| matches!(d, Decision::Evict { .. }))
            .unwrap();
        let at = 12.5 + first_evict as f64 * 0.5;
        assert!(at >= 12.0 + 10.0 + 10.0 - 1e-9, "evicted at {at}");
        assert_eq!(
            d[first_evict],
            Decision::Evict {
                signal: Signal::High
            }
        );
    }

    #[test]
    fn throttle_relaxed_container_that_calms_down_is_left_alone() {
        let mut g = Guard::new(cfg());
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
                !matches!(d, Decision::Evict { .. } | Decision::Relax),
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
        let mut g = Guard::new(cfg());
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
            if d == Decision::Relax {
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
        let mut g = Guard::new(cfg());
        let mut r = s(QosClass::Burstable, "c", 0, 0, 40.0);
        r.high = r.max;
        let mut n = 0;
        let d = run(&mut g, 0.0, 60.0, 0, &mut n, |_| r.clone());
        let first = d.iter().position(|d| *d != Decision::Calm).unwrap();
        assert_eq!(first as f64 * 0.5, PSI_AFTER_RELAX.as_secs_f64(), "{d:?}");
        let evict = d
            .iter()
            .position(|d| matches!(d, Decision::Evict { .. }))
            .unwrap();
        assert_eq!(evict as f64 * 0.5, 40.0, "{d:?}");
        assert_eq!(
            d[evict],
            Decision::Evict {
                signal: Signal::Psi
            }
        );
        assert!(!d.contains(&Decision::Relax));
    }

    /// Relaxed by us, the `high` events stop, but the container stays
    /// stalled (its pod's memory.high, a thrashing node: a limit that is
    /// not its own): the lagging PSI is ignored for PSI_AFTER_RELAX, then
    /// the stall counts and the pod is evicted, naming PSI. Before, PSI
    /// never counted again and such a pod stayed stalled for good.
    #[test]
    fn throttle_relaxed_container_still_stalled_is_evicted_on_psi() {
        let mut g = Guard::new(cfg());
        let mut n = 0;
        let d = run(&mut g, 0.0, 12.0, 200, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 5.0)
        });
        assert_eq!(d.last(), Some(&Decision::Relax));
        let mut relaxed = s(QosClass::Burstable, "c", n, 0, 40.0);
        relaxed.high = relaxed.max;
        let d = run(&mut g, 12.5, 40.0, 0, &mut n, |_| relaxed.clone());
        let at = |i: usize| 12.5 + i as f64 * 0.5;
        let evict = d
            .iter()
            .position(|d| matches!(d, Decision::Evict { .. }))
            .expect("evicted");
        assert_eq!(at(evict), 12.0 + 30.0 + 10.0, "{d:?}");
        assert_eq!(
            d[evict],
            Decision::Evict {
                signal: Signal::Psi
            }
        );
        // Nothing before: settling, then PSI ignored (Calm), then the grace.
        assert!(d[..evict].iter().all(|d| matches!(
            d,
            Decision::Settling | Decision::Calm | Decision::Throttled { .. }
        )));
        assert!(!d.contains(&Decision::Relax));
    }

    #[test]
    fn throttle_without_high_goes_straight_to_stage_2() {
        let mut g = Guard::new(cfg());
        let mut n = 0;
        let d = run(&mut g, 0.0, 12.0, 0, &mut n, |c| {
            s(QosClass::Burstable, "c", c, 0, 40.0)
        });
        assert!(!d.contains(&Decision::Relax));
        assert_eq!(
            d.last(),
            Some(&Decision::Evict {
                signal: Signal::Psi
            })
        );
        // Only max events (at the limit, no stall reported): stage 2 too.
        let mut g = Guard::new(cfg());
        let d = run(&mut g, 0.0, 12.0, 400, &mut n, |c| {
            s(QosClass::Burstable, "c", 0, c, 0.0)
        });
        assert_eq!(
            d.last(),
            Some(&Decision::Evict {
                signal: Signal::Max
            })
        );
    }

    #[test]
    fn throttle_guaranteed_is_never_touched() {
        let mut g = Guard::new(cfg());
        let mut n = 0;
        let d = run(&mut g, 0.0, 60.0, 5000, &mut n, |c| {
            s(QosClass::Guaranteed, "c", c, c, 90.0)
        });
        assert!(d.iter().all(|d| *d == Decision::Calm));
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
        assert_eq!(x.relax_value(), None);
        // Found relaxed after a restart: never relaxed again, stage 2 only.
        let mut g = Guard::new(cfg());
        let mut n = 0;
        let mut r = s(QosClass::Burstable, "c", 0, 0, 0.0);
        r.high = r.max;
        let d = run(&mut g, 0.0, 12.0, 400, &mut n, |c| {
            let mut r = r.clone();
            r.counters.high = c;
            r
        });
        assert!(!d.contains(&Decision::Relax));
        assert!(matches!(d.last(), Some(Decision::Evict { .. })));
    }

    #[test]
    fn throttle_config_validates_and_names_the_key() {
        assert!(ThrottleConfig::default().validate().is_ok());
        for (text, key) in [
            ("[throttle]\nhigh-rate = 0.0\n", "throttle.high-rate"),
            ("[throttle]\nmax-rate = -1.0\n", "throttle.max-rate"),
            (
                "[throttle]\npsi-some-avg10 = 100.0\n",
                "throttle.psi-some-avg10",
            ),
            (
                "[throttle]\ngrace-period = \"0s\"\n",
                "throttle.grace-period",
            ),
            ("[throttle]\ninterval = \"20s\"\n", "throttle.interval"),
            ("[throttle]\ngrace = \"1s\"\n", "grace"),
        ] {
            let e = ThrottleConfig::from_toml(text, "t")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        let c = ThrottleConfig::from_toml("[throttle]\nenabled = false\n", "t").unwrap();
        assert!(!c.enabled);
        assert_eq!(
            ThrottleConfig::from_toml("[monitor]\n", "t").unwrap(),
            ThrottleConfig::default()
        );
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
            let mut g = Guard::new(c.clone());
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
                    Decision::Relax => {
                        prop_assert!(!guaranteed);
                        prop_assert_eq!(relaxes_this_id, 0);
                        prop_assert!(active_since.is_some_and(|s| now - s >= grace));
                        relaxes_this_id += 1;
                        relaxed_at = Some(now);
                    }
                    Decision::Evict { .. } => {
                        prop_assert!(!guaranteed);
                        prop_assert!(active_since.is_some_and(|s| now - s >= grace));
                        if let Some(r) = relaxed_at {
                            prop_assert!(now >= r + PSI_SETTLE + grace);
                        }
                    }
                    Decision::Calm | Decision::Throttled { .. } | Decision::Settling => {}
                }
            }
        }
    }
}
