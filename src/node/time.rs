//! Durations as the whole numbers logs, metrics and ttrpc carry. Each one
//! saturates: a duration too long for the type (centuries) reads as its
//! maximum rather than wrapping. And the clock the node's watchers share.

use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Monotonic time since an arbitrary start; injected so tests use a fake
/// clock. Tasks that compare times (the eviction path's cooldown) share one.
pub trait Clock: Send + Sync {
    fn now(&self) -> Duration;
}

#[derive(Debug)]
pub struct SystemClock(Instant);

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock(Instant::now())
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// Whole milliseconds, for `*_ms` log fields.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whole microseconds, for `*_us` log fields and metrics.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Whole nanoseconds, for metric sums.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whole nanoseconds as the signed timeout a ttrpc context carries.
pub fn nanos_i64(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// A duration written as "250ms", "2s" or "5m".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HumanDuration(pub Duration);

/// A duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?} (want e.g. 250ms, 2s, 5m)")]
    Number(String),
    #[error("unknown duration unit in {0:?}")]
    Unit(String),
}

impl TryFrom<String> for HumanDuration {
    type Error = DurationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<HumanDuration> for String {
    fn from(d: HumanDuration) -> String {
        d.to_string()
    }
}

impl std::str::FromStr for HumanDuration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| DurationError::Number(s.to_string()))?;
        let d = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            _ => return Err(DurationError::Unit(s.to_string())),
        };
        Ok(HumanDuration(d))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(60_000) && ms != 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_exactly_in_range() {
        let d = Duration::new(2, 3_004_005);
        assert_eq!(millis(d), 2_003);
        assert_eq!(micros(d), 2_003_004);
        assert_eq!(nanos(d), 2_003_004_005);
        assert_eq!(nanos_i64(d), 2_003_004_005);
    }

    #[test]
    fn saturates_past_the_type() {
        assert_eq!(millis(Duration::MAX), u64::MAX);
        assert_eq!(micros(Duration::MAX), u64::MAX);
        assert_eq!(nanos(Duration::MAX), u64::MAX);
        assert_eq!(nanos_i64(Duration::MAX), i64::MAX);
    }
}
