//! Logging, set up once per process: to stderr, optionally to a file, and to
//! the systemd journal when asked (a pre-launched plugin's stdout and stderr
//! are /dev/null, so the journal is where its logs can go).

use std::path::Path;

use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Where logs go besides stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Journal {
    /// Also log to journald if its socket exists.
    IfPresent,
    Off,
}

/// Checks a `plugin.log-level` value: a level or tracing filter
/// (`info`, `nri_qos=debug,warn`). An invalid one is an error, not a
/// silent fall back to `info`.
pub fn check_level(level: &str) -> Result<(), String> {
    if level.trim().is_empty() {
        return Err("empty log level".into());
    }
    EnvFilter::builder()
        .with_regex(false)
        .parse(level)
        .map(drop)
        .map_err(|e| format!("{level:?} is not a log level or tracing filter: {e}"))
}

/// `level` is a tracing filter ("info", "nri_qos=debug"); `RUST_LOG` wins.
pub fn init(
    format: &str,
    level: &str,
    file: Option<&Path>,
    journal: Journal,
) -> std::io::Result<()> {
    let filter = || {
        EnvFilter::try_from_default_env()
            .or_else(|_| EnvFilter::try_new(level))
            .unwrap_or_else(|_| EnvFilter::new("info"))
    };
    let file = match file {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        ),
        None => None,
    };
    let writer = match file {
        Some(f) => BoxMakeWriter::new(std::io::stderr.and(std::sync::Mutex::new(f))),
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(false);
    let fmt = if format == "json" {
        fmt.json().with_filter(filter()).boxed()
    } else {
        fmt.with_filter(filter()).boxed()
    };
    let journald = match journal {
        Journal::IfPresent if Path::new("/run/systemd/journal/socket").exists() => {
            tracing_journald::layer().ok().map(|l| {
                l.with_syslog_identifier("nri-qos".into())
                    .with_filter(filter())
            })
        }
        _ => None,
    };
    // A second init (tests) is harmless.
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(journald)
        .try_init();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_are_checked() {
        for ok in [
            "info",
            "debug",
            "nri_qos=debug",
            "warn,nri_qos::pressure=trace",
        ] {
            check_level(ok).unwrap();
        }
        for bad in ["(((", "", "nri_qos=loud", "[[["] {
            assert!(check_level(bad).is_err(), "{bad:?}");
        }
    }
}
