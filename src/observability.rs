//! Logging, set up once per process. Logs go to stderr (a pre-launched
//! plugin's stdout is discarded by the runtime) and optionally to a file.

use std::path::Path;

use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
use tracing_subscriber::EnvFilter;

/// `level` is a tracing filter ("info", "nri_qos=debug"); `RUST_LOG` wins.
pub fn init(format: &str, level: &str, file: Option<&Path>) -> std::io::Result<()> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false);
    let result = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    // A second init (tests) is harmless.
    let _ = result;
    Ok(())
}
