//! Durations as the whole numbers logs, metrics and ttrpc carry. Each one
//! saturates: a duration too long for the type (centuries) reads as its
//! maximum rather than wrapping.

use std::time::Duration;

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
