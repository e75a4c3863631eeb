//! The `[throttle]` table: the guard's thresholds, cadence and relax route,
//! and whether memory.high may be set while no guard acts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::GuardError;
use crate::node::relax::RelaxVia;
use crate::node::time::HumanDuration;

/// A calm look rarer than this would leave a stall unwatched too long.
const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(60);

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
    /// While none is, look this often (four small reads of the QoS parents).
    pub check_interval: HumanDuration,
    /// Who writes the relaxed memory.high (see [`RelaxVia`]).
    pub relax_via: RelaxVia,
    /// `[policy] memory-high` with this guard off (or only logging) is
    /// refused unless this says `accept`: see [`UnguardedMemoryHigh`].
    pub unguarded_memory_high: UnguardedMemoryHigh,
}

/// What to make of memory.high set on containers while no throttle guard
/// acts on them (`[throttle] enabled = false`, or a dry run): such a
/// container can sit throttled between memory.high and memory.max for
/// good, which the kernel never resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnguardedMemoryHigh {
    /// The plugin refuses to start (and `check-config` the file).
    #[default]
    Refuse,
    /// The operator takes the risk, e.g. with a guard of their own.
    Accept,
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
            check_interval: HumanDuration(Duration::from_secs(2)),
            relax_via: RelaxVia::CgroupFile,
            unguarded_memory_high: UnguardedMemoryHigh::Refuse,
        }
    }
}

impl ThrottleConfig {
    /// The guard runs and acts: on, and not a dry run (`evict_dry_run`:
    /// the eviction path's, i.e. `[monitor] dry-run`).
    pub fn acts(&self, evict_dry_run: bool) -> bool {
        self.enabled && !self.dry_run && !evict_dry_run
    }

    /// Rejects values that would make the guard misbehave, naming the key.
    pub fn validate(&self) -> Result<(), GuardError> {
        let err = |m: String| Err(GuardError::Config(m));
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
        let calm = self.check_interval.0;
        if calm < self.interval.0 || calm > MAX_CHECK_INTERVAL {
            return err(format!(
                "throttle.check-interval {} must be at least interval {} and at most {}",
                self.check_interval,
                self.interval,
                HumanDuration(MAX_CHECK_INTERVAL)
            ));
        }
        Ok(())
    }

    /// Reads the `[throttle]` table of a TOML document (other tables ignored).
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, GuardError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            throttle: Option<toml::Value>,
        }
        let bad = |at: String| move |source| GuardError::ConfigParse { at, source };
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

#[cfg(test)]
mod tests {
    use super::*;

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
            (
                "[throttle]\ncheck-interval = \"100ms\"\n",
                "throttle.check-interval",
            ),
            (
                "[throttle]\ncheck-interval = \"2m\"\n",
                "throttle.check-interval",
            ),
            (
                "[throttle]\nunguarded-memory-high = \"yes\"\n",
                "unguarded-memory-high",
            ),
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
}
