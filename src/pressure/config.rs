//! `MonitorConfig`: the `[monitor]` table. Sizes and durations are strings
//! ("100Mi", "5%", "250ms") so the file reads like kubelet flags.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::MonitorError;
pub use crate::node::time::{DurationError, HumanDuration};
use crate::qos::quantity::{self, QuantityError};

/// A memory threshold: absolute bytes or a percentage of capacity, like the
/// kubelet's `memory.available<100Mi` / `<5%`. Zero disables it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum SizeOrPercent {
    Bytes(u64),
    Percent(f64),
}

impl SizeOrPercent {
    /// Bytes this quantity stands for on a node with `capacity` bytes.
    pub fn resolve(&self, capacity: u64) -> u64 {
        match *self {
            SizeOrPercent::Bytes(b) => b,
            // Percent is validated to 0..=100 (NaN fails that), so the product
            // is finite, non-negative and at most capacity.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            SizeOrPercent::Percent(p) => (capacity as f64 * p / 100.0) as u64,
        }
    }
}

/// A `[monitor]` size or percentage that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SizeOrPercentError {
    #[error("invalid percentage {0:?}")]
    Percent(String),
    #[error("percentage {0:?} out of 0..=100")]
    PercentRange(String),
    #[error("invalid size {text:?}: {reason} (want e.g. 100Mi, 1G, 5%)")]
    Size { text: String, reason: QuantityError },
}

impl TryFrom<String> for SizeOrPercent {
    type Error = SizeOrPercentError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<SizeOrPercent> for String {
    fn from(q: SizeOrPercent) -> String {
        q.to_string()
    }
}

impl std::str::FromStr for SizeOrPercent {
    type Err = SizeOrPercentError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| SizeOrPercentError::Percent(s.to_string()))?;
            if !(0.0..=100.0).contains(&v) {
                return Err(SizeOrPercentError::PercentRange(s.to_string()));
            }
            return Ok(SizeOrPercent::Percent(v));
        }
        // A size is a Kubernetes quantity; `K` (not one of its suffixes) is
        // also taken for `k`, as these keys always have.
        let kilo = t
            .strip_suffix('K')
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
        let size = match kilo {
            Some(n) => format!("{n}k"),
            None => t.to_string(),
        };
        quantity::parse_bytes(&size)
            .map(SizeOrPercent::Bytes)
            .map_err(|reason| SizeOrPercentError::Size {
                text: s.to_string(),
                reason,
            })
    }
}

impl fmt::Display for SizeOrPercent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SizeOrPercent::Percent(p) => write!(f, "{p}%"),
            SizeOrPercent::Bytes(b) => {
                for (suffix, unit) in [
                    ("Ti", 1u64 << 40),
                    ("Gi", 1 << 30),
                    ("Mi", 1 << 20),
                    ("Ki", 1 << 10),
                ] {
                    if b != 0 && b % unit == 0 {
                        return write!(f, "{}{suffix}", b / unit);
                    }
                }
                write!(f, "{b}")
            }
        }
    }
}

/// Longest duration any `[monitor]` key may have: beyond an hour a value
/// is a typo, and an unbounded one would overflow timer arithmetic.
pub const MAX_DURATION: HumanDuration = HumanDuration(Duration::from_secs(3600));

fn ms(v: u64) -> HumanDuration {
    HumanDuration(Duration::from_millis(v))
}

/// The `[monitor]` table. See `config/nri-qos.toml` for one line per key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MonitorConfig {
    /// Log what would be done, change nothing.
    pub dry_run: bool,
    /// Evict at once when memory.available drops below this.
    pub hard_threshold: SizeOrPercent,
    /// Reclaim below this, evict if it holds for `soft-grace-period`. 0 = off.
    pub soft_threshold: SizeOrPercent,
    pub soft_grace_period: HumanDuration,
    /// Once met, a threshold stays met until available >= threshold + this.
    pub min_reclaim: SizeOrPercent,
    /// The pressure state ends only after no threshold was met for this long.
    pub transition_period: HumanDuration,
    /// No new decision this long after a kill finished.
    pub cooldown: HumanDuration,
    /// Give up waiting for a killed pod cgroup to empty after this.
    pub kill_timeout: HumanDuration,
    /// Right after a kill, poll the pod's cgroup.events every 5 ms for this
    /// long (nothing else may run while a kill is in flight anyway).
    pub kill_wait: HumanDuration,
    /// Low-rate check of memory.available while calm.
    pub check_interval: HumanDuration,
    /// Check rate while under pressure or while a kill is in flight.
    pub pressure_interval: HumanDuration,
    /// How fast the node's memory could fill (bytes per second). While calm,
    /// the next check comes after at most (available − threshold) / this,
    /// between pressure-interval and check-interval: PSI barely moves while
    /// anonymous memory fills a node without swap, so near the threshold
    /// only a check catches it before the kernel OOM killer does.
    pub max_fill_rate: SizeOrPercent,
    /// PSI triggers ("some|full <stall_us> <window_us>"), one fd each.
    pub psi_triggers: Vec<String>,
    /// Arm the triggers on /proc/pressure/memory.
    pub psi_node: bool,
    /// Arm the triggers on the kubepods cgroup's memory.pressure.
    pub psi_kubepods: bool,
    /// kubepods cgroup relative to the cgroup root; "auto" finds kubepods.slice or kubepods.
    pub kubepods: String,
    /// Also apply the thresholds to kubepods memory.max − kubepods working set
    /// (the kubelet's allocatableMemory.available).
    pub allocatable_signal: bool,
    /// Also apply the thresholds to the kernel's MemAvailable, which counts
    /// the kernel memory the kubelet's formula leaves out.
    pub mem_available_signal: bool,
    /// Pods in these namespaces are never killed.
    pub critical_namespaces: Vec<String>,
    /// Pods with priority >= this are never killed (kubelet: 2000000000).
    pub critical_priority: i32,
    /// Only kill pods the plugin told us about (namespace and priority known).
    pub require_pod_info: bool,
    /// Write memory.reclaim on the top candidates before evicting.
    pub reclaim: bool,
    /// Also reclaim right before a hard-threshold kill (delays the kill).
    pub reclaim_before_hard_kill: bool,
    /// How many top candidates to reclaim from.
    pub reclaim_top_n: usize,
    /// Minimum time between two reclaim rounds.
    pub reclaim_interval: HumanDuration,
    /// Under soft pressure, set memory.high of BestEffort candidates to this
    /// fraction of their usage until pressure ends. 0 = off.
    pub besteffort_memory_high_factor: f64,
    /// Release killed processes' memory at once with process_mrelease (5.15+).
    pub mrelease: bool,
    /// Lock the process's memory as it is touched (mlockall with
    /// MCL_ONFAULT): under pressure the kernel pages out file-backed pages
    /// first, and the monitor's own code is one of them.
    pub lock_memory: bool,
    /// Nice value of the monitor thread (-20..=19; 0 leaves it): the node
    /// is short of CPU too while memory runs out.
    pub nice: i32,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            dry_run: false,
            hard_threshold: SizeOrPercent::Bytes(100 << 20),
            soft_threshold: SizeOrPercent::Bytes(300 << 20),
            soft_grace_period: ms(2000),
            min_reclaim: SizeOrPercent::Bytes(64 << 20),
            transition_period: ms(10_000),
            cooldown: ms(1000),
            kill_timeout: ms(5000),
            kill_wait: ms(500),
            check_interval: ms(5000),
            pressure_interval: ms(100),
            max_fill_rate: SizeOrPercent::Bytes(6000 << 20),
            psi_triggers: vec!["full 100000 1000000".into(), "some 300000 1000000".into()],
            psi_node: true,
            psi_kubepods: true,
            kubepods: "auto".into(),
            allocatable_signal: true,
            mem_available_signal: true,
            critical_namespaces: vec!["kube-system".into()],
            critical_priority: 2_000_000_000,
            require_pod_info: false,
            reclaim: true,
            reclaim_before_hard_kill: false,
            reclaim_top_n: 3,
            reclaim_interval: ms(1000),
            besteffort_memory_high_factor: 0.0,
            mrelease: true,
            lock_memory: true,
            nice: -10,
        }
    }
}

impl MonitorConfig {
    /// Reads the `[monitor]` table of a TOML document; other tables are ignored
    /// so the same file can configure the plugin.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, MonitorError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            monitor: Option<toml::Value>,
        }
        let bad = |source| MonitorError::ConfigParse {
            at: format!("{origin}: "),
            source,
        };
        let file: File = toml::from_str(text).map_err(bad)?;
        let cfg: MonitorConfig = match file.monitor {
            Some(v) => v.try_into().map_err(bad)?,
            None => MonitorConfig::default(),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Rejects values that would make the monitor misbehave.
    pub fn validate(&self) -> Result<(), MonitorError> {
        let err = |m: String| Err(MonitorError::Config(m));
        for t in &self.psi_triggers {
            if let Err(e) = t.parse::<super::psi::Trigger>() {
                return err(format!("psi-triggers: {e}"));
            }
        }
        if !(0.0..1.0).contains(&self.besteffort_memory_high_factor) {
            return err(format!(
                "besteffort-memory-high-factor {} must be in 0..1 (0 = off)",
                self.besteffort_memory_high_factor
            ));
        }
        if self.pressure_interval.0.is_zero() || self.check_interval.0.is_zero() {
            return err("check-interval and pressure-interval must be > 0".into());
        }
        if self.max_fill_rate.resolve(1 << 30) == 0 {
            return err("max-fill-rate must be > 0".into());
        }
        if self.kubepods.trim().is_empty() {
            return err("monitor.kubepods must be \"auto\" or a path".into());
        }
        if self.kubepods != "auto" {
            if let Err(e) = crate::node::relative_inside(&self.kubepods) {
                return err(format!(
                    "monitor.kubepods {e}: it is a path below the cgroup root"
                ));
            }
        }
        for (key, d) in [
            ("soft-grace-period", self.soft_grace_period),
            ("transition-period", self.transition_period),
            ("cooldown", self.cooldown),
            ("kill-timeout", self.kill_timeout),
            ("kill-wait", self.kill_wait),
            ("check-interval", self.check_interval),
            ("pressure-interval", self.pressure_interval),
            ("reclaim-interval", self.reclaim_interval),
        ] {
            if d.0 > MAX_DURATION.0 {
                return err(format!("monitor.{key} {d} is longer than {MAX_DURATION}"));
            }
        }
        let (hard, soft) = (self.hard_threshold, self.soft_threshold);
        // Mixed kinds (5% and 300Mi) depend on the node; only like with
        // like can be judged here.
        let same_kind_below = match (hard, soft) {
            (SizeOrPercent::Bytes(h), SizeOrPercent::Bytes(s)) => s != 0 && s < h,
            (SizeOrPercent::Percent(h), SizeOrPercent::Percent(s)) => s != 0.0 && s < h,
            _ => false,
        };
        if same_kind_below {
            return err(format!(
                "monitor.soft-threshold {soft} is below monitor.hard-threshold {hard} (0 turns the soft threshold off)"
            ));
        }
        if !(-20..=19).contains(&self.nice) {
            return err(format!("nice {} must be in -20..=19", self.nice));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_quantity_parses_kubelet_style() {
        assert_eq!("100Mi".parse(), Ok(SizeOrPercent::Bytes(100 << 20)));
        assert_eq!("1G".parse(), Ok(SizeOrPercent::Bytes(1_000_000_000)));
        assert_eq!("4096".parse(), Ok(SizeOrPercent::Bytes(4096)));
        assert_eq!("5%".parse(), Ok(SizeOrPercent::Percent(5.0)));
        assert!("5x".parse::<SizeOrPercent>().is_err());
        assert!("".parse::<SizeOrPercent>().is_err());
        assert!("101%".parse::<SizeOrPercent>().is_err());
        assert!("99999999999Ti".parse::<SizeOrPercent>().is_err());
        assert_eq!("1K".parse(), Ok(SizeOrPercent::Bytes(1000)));
        assert_eq!(SizeOrPercent::Percent(10.0).resolve(1000), 100);
        assert_eq!(SizeOrPercent::Bytes(100 << 20).to_string(), "100Mi");
    }

    #[test]
    fn pressure_duration_round_trips() {
        for s in ["250ms", "2s", "5m", "0s"] {
            let d: HumanDuration = s.parse().unwrap();
            assert_eq!(d.to_string(), s);
        }
        assert!("2h".parse::<HumanDuration>().is_err());
        assert!("s".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn pressure_example_file_equals_default() {
        let text = include_str!("../../config/nri-qos.toml");
        let cfg = MonitorConfig::from_toml(text, "nri-qos.toml").unwrap();
        assert_eq!(cfg, MonitorConfig::default());
    }

    #[test]
    fn pressure_config_rejects_unknown_keys_and_bad_values() {
        let e = MonitorConfig::from_toml("[monitor]\nhard-treshold = \"1Mi\"\n", "t").unwrap_err();
        assert!(e.to_string().contains("hard-treshold"), "{e}");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the parser's error is kept"
        );
        assert!(
            MonitorConfig::from_toml("[monitor]\npsi-triggers = [\"full 0 1\"]\n", "t").is_err()
        );
        assert!(MonitorConfig::from_toml("[monitor]\nhard-threshold = \"1Q\"\n", "t").is_err());
        // Other tables of the shared file are not ours to judge.
        assert!(MonitorConfig::from_toml("[policy]\nx = 1\n", "t").is_ok());
    }
}
