//! Logging, set up once per process: to stderr, optionally to a file, and to
//! the systemd journal when asked (a pre-launched plugin's stdout and stderr
//! are /dev/null, so the journal is where its logs can go).

use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;
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

/// How log lines are written (`plugin.log-format`, `--log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// A `log-format` value that is neither `text` nor `json`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0:?} is not \"text\" or \"json\"")]
pub struct UnknownLogFormat(pub String);

impl FromStr for LogFormat {
    type Err = UnknownLogFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(UnknownLogFormat(other.to_string())),
        }
    }
}

/// A `plugin.log-level` value tracing cannot use.
#[derive(Debug, Error)]
pub enum LogLevelError {
    #[error("empty log level")]
    Empty,
    #[error("{level:?} is not a log level or tracing filter: {reason}")]
    Invalid {
        level: String,
        reason: tracing_subscriber::filter::ParseError,
    },
}

/// Checks a `plugin.log-level` value: a level or tracing filter
/// (`info`, `nri_qos=debug,warn`). An invalid one is an error, not a
/// silent fall back to `info`.
pub fn check_level(level: &str) -> Result<(), LogLevelError> {
    if level.trim().is_empty() {
        return Err(LogLevelError::Empty);
    }
    EnvFilter::builder()
        .with_regex(false)
        .parse(level)
        .map(drop)
        .map_err(|reason| LogLevelError::Invalid {
            level: level.to_string(),
            reason,
        })
}

/// `level` is a tracing filter ("info", "nri_qos=debug"); `RUST_LOG` wins.
pub fn init(
    format: LogFormat,
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
    let fmt = match format {
        LogFormat::Json => fmt.json().with_filter(filter()).boxed(),
        LogFormat::Text => fmt.with_filter(filter()).boxed(),
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

    #[test]
    fn log_formats_parse_as_written() {
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        let err = "xml".parse::<LogFormat>().unwrap_err();
        assert_eq!(err.to_string(), r#""xml" is not "text" or "json""#);
    }
}
