//! A stand-in for systemd-journald in the e2e VM, whose guest has no
//! systemd: a pre-launched plugin's stderr is discarded by the runtime, so
//! nri-qos logs to the journal when its socket exists, and this is that
//! socket. Each datagram of the journal's native protocol becomes one line
//! of the output file, prefixed with when it arrived:
//!
//!   journal-sink [/run/systemd/journal/socket] [/var/log/journal.log]
//!   -> `<epoch_ms> MESSAGE="..." POD="..." ...`
//!
//! Fields are `KEY=VALUE\n`, or `KEY\n` + a little-endian u64 length + the
//! value + `\n` for values with a newline. Never meant for anything but a
//! test guest.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

/// The fields of one datagram as `KEY="value"` pairs (quotes escaped).
fn fields(mut d: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    while !d.is_empty() {
        let line_end = d.iter().position(|&b| b == b'\n').unwrap_or(d.len());
        let line = &d[..line_end];
        let (key, value, rest) = match line.iter().position(|&b| b == b'=') {
            Some(eq) => (&line[..eq], line[eq + 1..].to_vec(), d.get(line_end + 1..)),
            None => {
                // Binary-safe form: the length follows the key's newline.
                let after = d.get(line_end + 1..).unwrap_or_default();
                let Some(len) = after.get(..8) else { break };
                let len = u64::from_le_bytes(len.try_into().unwrap_or_default());
                // A length past the datagram gives an empty value and ends the entry.
                let end = usize::try_from(len).map_or(usize::MAX, |l| l.saturating_add(8));
                let value = after.get(8..end).unwrap_or_default().to_vec();
                (line, value, after.get(end.saturating_add(1)..))
            }
        };
        let value = String::from_utf8_lossy(&value)
            .replace('\\', "\\\\")
            .replace('"', "\\\"");
        out.push(format!(
            "{}=\"{}\"",
            String::from_utf8_lossy(key),
            value.replace('\n', "\\n")
        ));
        d = rest.unwrap_or_default();
    }
    out
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let socket = args
        .next()
        .unwrap_or_else(|| "/run/systemd/journal/socket".into());
    let out = args.next().unwrap_or_else(|| "/var/log/journal.log".into());
    if let Some(dir) = std::path::Path::new(&socket).parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&socket);
    let sock = UnixDatagram::bind(&socket).with_context(|| format!("bind {socket}"))?;
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&out)
        .with_context(|| format!("open {out}"))?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = sock.recv(&mut buf).context("recv")?;
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        writeln!(file, "{ms} {}", fields(&buf[..n]).join(" "))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_field_forms() {
        let mut d = b"PRIORITY=6\nMESSAGE=a \"b\"\n".to_vec();
        d.extend_from_slice(b"POD\n");
        d.extend_from_slice(&5u64.to_le_bytes());
        d.extend_from_slice(b"x\ny z\n");
        assert_eq!(
            fields(&d),
            [
                "PRIORITY=\"6\"",
                "MESSAGE=\"a \\\"b\\\"\"",
                "POD=\"x\\ny z\""
            ]
        );
    }
}
