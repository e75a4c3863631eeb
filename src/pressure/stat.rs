//! Parsers for the flat files the monitor reads: `memory.stat`,
//! `memory.events(.local)`, `/proc/meminfo`, single-value files and
//! `cgroup.events`. Junk yields an error naming file and line, never a panic.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

/// A file that could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parse {path} line {line}: {msg}")]
    Parse {
        path: PathBuf,
        line: usize,
        msg: String,
    },
}

impl ReadError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
    fn parse(path: &Path, line: usize, msg: impl Into<String>) -> Self {
        ReadError::Parse {
            path: path.to_path_buf(),
            line,
            msg: msg.into(),
        }
    }
}

/// Reads a small kernel file; these are at most a few KiB, so the whole
/// file fits in memory.
pub fn read(path: &Path) -> Result<String, ReadError> {
    std::fs::read_to_string(path).map_err(|source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// `key value` lines (memory.stat, memory.events, cgroup.events).
pub fn parse_flat_keyed(path: &Path, text: &str) -> Result<HashMap<String, u64>, ReadError> {
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let (Some(k), Some(v), None) = (it.next(), it.next(), it.next()) else {
            return Err(ReadError::parse(
                path,
                i + 1,
                format!("want `key value`, got {line:?}"),
            ));
        };
        let v: u64 = v.parse().map_err(|_| {
            ReadError::parse(path, i + 1, format!("value of {k} is not a number: {v:?}"))
        })?;
        out.insert(k.to_string(), v);
    }
    Ok(out)
}

/// Reads and parses a `key value` file.
pub fn read_flat_keyed(path: &Path) -> Result<HashMap<String, u64>, ReadError> {
    parse_flat_keyed(path, &read(path)?)
}

/// `populated` of a cgroup's `cgroup.events`: whether any process is in its
/// subtree. Callers decide what an unreadable file means for them.
pub fn read_populated(cg: &Path) -> Result<bool, ReadError> {
    let events = read_flat_keyed(&cg.join("cgroup.events"))?;
    Ok(events.get("populated").copied().unwrap_or(0) != 0)
}

/// `/proc/meminfo`: `Key:   123 kB` lines, returned in bytes.
pub fn parse_meminfo(path: &Path, text: &str) -> Result<HashMap<String, u64>, ReadError> {
    let mut out = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((k, rest)) = line.split_once(':') else {
            return Err(ReadError::parse(path, i + 1, format!("no ':' in {line:?}")));
        };
        let mut it = rest.split_whitespace();
        let num = it
            .next()
            .ok_or_else(|| ReadError::parse(path, i + 1, format!("no value for {k}")))?;
        let n: u64 = num.parse().map_err(|_| {
            ReadError::parse(
                path,
                i + 1,
                format!("value of {k} is not a number: {num:?}"),
            )
        })?;
        let bytes = match it.next() {
            None => n, // HugePages_Total and friends are counts
            Some("kB") => n
                .checked_mul(1024)
                .ok_or_else(|| ReadError::parse(path, i + 1, "value overflows"))?,
            Some(u) => return Err(ReadError::parse(path, i + 1, format!("unknown unit {u:?}"))),
        };
        out.insert(k.trim().to_string(), bytes);
    }
    Ok(out)
}

/// A single-value file such as `memory.current` or `memory.max`.
/// `max` reads as `None`.
pub fn parse_single(path: &Path, text: &str) -> Result<Option<u64>, ReadError> {
    let t = text.trim();
    if t == "max" {
        return Ok(None);
    }
    t.parse()
        .map(Some)
        .map_err(|_| ReadError::parse(path, 1, format!("not a number or \"max\": {t:?}")))
}

pub fn read_single(path: &Path) -> Result<Option<u64>, ReadError> {
    parse_single(path, &read(path)?)
}

/// `cgroup.procs`: one pid per line, at most `cap` of them (bounded memory).
pub fn parse_pids(path: &Path, text: &str, cap: usize) -> Result<Vec<i32>, ReadError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let pid: i32 = t
            .parse()
            .map_err(|_| ReadError::parse(path, i + 1, format!("not a pid: {t:?}")))?;
        if pid <= 0 {
            return Err(ReadError::parse(path, i + 1, format!("not a pid: {t:?}")));
        }
        if out.len() >= cap {
            break;
        }
        out.push(pid);
    }
    Ok(out)
}

/// Working set the way cAdvisor computes it: usage minus inactive_file,
/// floored at 0.
pub fn working_set(usage: u64, inactive_file: u64) -> u64 {
    usage.saturating_sub(inactive_file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("/fake/memory.stat")
    }

    #[test]
    fn pressure_flat_keyed_parses_and_names_bad_line() {
        let m = parse_flat_keyed(p(), "anon 10\nfile 20\n\ninactive_file 5\n").unwrap();
        assert_eq!((m["anon"], m["file"], m["inactive_file"]), (10, 20, 5));
        let e = parse_flat_keyed(p(), "anon 10\nfile x\n").unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("/fake/memory.stat") && s.contains("line 2"),
            "{s}"
        );
        assert!(parse_flat_keyed(p(), "anon 1 2\n").is_err());
        assert!(parse_flat_keyed(p(), "anon\n").is_err());
        assert!(parse_flat_keyed(p(), "anon -1\n").is_err());
    }

    #[test]
    fn pressure_meminfo_parses_kb_and_counts() {
        let t = "MemTotal:       16384 kB\nMemAvailable:    8192 kB\nHugePages_Total:       0\n";
        let m = parse_meminfo(p(), t).unwrap();
        assert_eq!(m["MemTotal"], 16384 * 1024);
        assert_eq!(m["HugePages_Total"], 0);
        for junk in [
            "MemTotal 1 kB",
            "MemTotal:",
            "MemTotal: x kB",
            "MemTotal: 1 MB",
            "X: 18446744073709551615 kB",
        ] {
            let e = parse_meminfo(p(), junk).unwrap_err();
            assert!(e.to_string().contains("line 1"), "{junk}: {e}");
        }
    }

    #[test]
    fn pressure_single_value_and_pids() {
        assert_eq!(parse_single(p(), "123\n").unwrap(), Some(123));
        assert_eq!(parse_single(p(), "max\n").unwrap(), None);
        assert!(parse_single(p(), "").is_err());
        assert_eq!(parse_pids(p(), "1\n2\n\n3\n", 2).unwrap(), vec![1, 2]);
        assert!(parse_pids(p(), "1\nx\n", 10).is_err());
        assert!(parse_pids(p(), "0\n", 10).is_err());
        assert_eq!(working_set(10, 20), 0);
        assert_eq!(working_set(30, 20), 10);
    }
}
