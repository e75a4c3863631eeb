//! Reading and writing cgroup (and `/proc`) files on an injected root:
//! `memory.stat`, `memory.events(.local)`, `/proc/meminfo`, single-value
//! files, `cgroup.events`, memory protection, and one-write updates of an
//! existing file. Junk yields an error naming file and line, never a panic.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

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
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let bytes = read_small(path).map_err(io)?;
    String::from_utf8(bytes)
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// A file read in as few syscalls as the kernel allows: open, read, close.
/// `std::fs::read` also asks the size (statx) and reads once more to see
/// the end; a Synchronize reads thousands of these files, and a cgroup
/// file's size says nothing (kernfs reports 0 or 4096). A read of up to a
/// page that returns less than asked has reached the end, for kernfs
/// (seq_file fills the buffer while it has records; a plain kernfs read
/// gives up to a page at a time) as for regular files.
fn read_small(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    const PAGE: usize = 4096;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0; 512];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(2 * len, 0);
        }
        let asked = buf.len() - len;
        let n = match f.read(&mut buf[len..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        len += n;
        if n == 0 || (n < asked && asked <= PAGE) {
            buf.truncate(len);
            return Ok(buf);
        }
    }
}

/// A single-value file's text, trimmed, handed to `f`: one open, one read
/// into a stack buffer and one close, no allocation (a Synchronize reads
/// thousands of these; a longer file is read whole as by [`read`]).
fn with_value<T>(path: &Path, f: impl FnOnce(&str) -> T) -> io::Result<T> {
    use std::io::Read;
    let mut buf = [0u8; 64];
    let mut file = std::fs::File::open(path)?;
    let n = loop {
        match file.read(&mut buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    if n < buf.len() {
        return Ok(f(utf8(&buf[..n])?.trim()));
    }
    let mut whole = buf.to_vec();
    file.read_to_end(&mut whole)?;
    Ok(f(utf8(&whole)?.trim()))
}

fn utf8(bytes: &[u8]) -> io::Result<&str> {
    std::str::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
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

/// A single-value file (`max` is `None`), read through [`with_value`].
pub fn read_single(path: &Path) -> Result<Option<u64>, ReadError> {
    with_value(path, |t| parse_single(path, t)).map_err(|source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    })?
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

/// A cgroup file that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("write {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
}

/// Writes an existing cgroup file in one write; never creates files.
pub fn write_file(path: &Path, value: &str) -> Result<(), WriteError> {
    let failed = |source| WriteError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    };
    // O_TRUNC is ignored by cgroupfs and keeps plain files in fake trees exact.
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(failed)?;
    f.write_all(value.as_bytes()).map_err(failed)
}

/// A small file's text, trimmed; `None` when unreadable.
pub fn read_trimmed(path: &Path) -> Option<String> {
    read(path).ok().map(|s| s.trim().to_string())
}

/// The kernel keeps memory.min/low in whole pages (a write is rounded down),
/// so targets are too: otherwise every pass would see a difference, rewrite,
/// and `audit` would flag the rounding as drift.
pub const PAGE_SIZE: u64 = 4096;

/// memory.min / memory.low of one cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Protection {
    pub min: u64,
    pub low: u64,
}

/// memory.min / memory.low of the cgroup at `dir` (0 where unreadable;
/// `max` reads as `u64::MAX`).
pub fn read_protection(dir: &Path) -> Protection {
    read_protection_present(dir).unwrap_or_default()
}

/// [`read_protection`], or `None` when the cgroup has no memory.min: the
/// directory is gone, or its parent does not enable the memory controller
/// for it. Either way no cgroup below it has memory files either (a
/// controller is enabled top-down), which spares a Synchronize the reads of
/// its containers' files.
pub fn read_protection_present(dir: &Path) -> Option<Protection> {
    let bytes = |r: Result<Option<u64>, ReadError>| r.map_or(0, |v| v.unwrap_or(u64::MAX));
    let mut path = dir.join("memory.min");
    let min = read_single(&path);
    if min.as_ref().is_err_and(ReadError::is_not_found) {
        return None;
    }
    path.set_file_name("memory.low");
    Some(Protection {
        min: bytes(min),
        low: bytes(read_single(&path)),
    })
}

/// With no record of what we wrote (a restart, `audit`): more protection
/// than our own policy gives the cgroup before any budget scaling is
/// someone else's. Our earlier values never exceed it (scaling only lowers
/// them), while the kubelet's exact requests exceed our estimates and its
/// alpha memory.min sits where we would write memory.low.
pub fn exceeds(current: Protection, ours_unscaled: Protection) -> bool {
    current.min > ours_unscaled.min || current.low > ours_unscaled.low
}

/// Who writes a value: decided once per cgroup (and only ever moved from
/// nri-qos to the kubelet), so two writers never take turns on one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Owner {
    /// The kubelet's Memory QoS: never written, never drift.
    Kubelet,
    /// nri-qos sets it (container adjustment or the hierarchy keeper).
    NriQos,
    /// Left to the runtime as the CRI request had it.
    Runtime,
}

impl Owner {
    pub fn label(self) -> &'static str {
        match self {
            Owner::Kubelet => "kubelet",
            Owner::NriQos => "nri-qos",
            Owner::Runtime => "runtime",
        }
    }
}

/// memory.high the throttle guard writes into a container that has no
/// memory.max: 4 EiB, no throttle on any machine, yet unlike `max` it says
/// who wrote it. A container created while no plugin was connected also
/// holds `max`, and only that one a Synchronize must bring in line.
pub const RELAXED_WITHOUT_LIMIT: u64 = 1 << 62;

/// A container the throttle guard relaxed, judged from the tree
/// alone (so it holds across a restart of the plugin): its memory.high
/// (`high`, as in the file) is its memory.max, or [`RELAXED_WITHOUT_LIMIT`]
/// where it has none, while the policy wants `wanted`, a lower value. The
/// policy leaves it so until the container restarts or is resized, and
/// `audit` shows it instead of reporting drift. A `max` is never the
/// guard's: it is a container created while no plugin was connected, which
/// a Synchronize brings in line.
pub fn is_relaxed(wanted: &str, high: &str, max: &str) -> bool {
    let (wanted, high, max) = (wanted.trim(), high.trim(), max.trim());
    let guards_value =
        (high == max && high != "max") || high.parse::<u64>() == Ok(RELAXED_WITHOUT_LIMIT);
    wanted != high && wanted != "max" && guards_value
}

/// [`is_relaxed`] for the container cgroup at `dir`; false when unreadable.
pub fn relaxed_in_tree(dir: &Path, wanted: &str) -> bool {
    relaxed_values_in_tree(dir, wanted).is_some()
}

/// [`relaxed_in_tree`] with what it read: the container's memory.high and
/// memory.max when the guard relaxed it.
pub fn relaxed_values_in_tree(dir: &Path, wanted: &str) -> Option<(String, String)> {
    // A Synchronize asks this for every running container whose update
    // sets memory.high, so no file is read whose answer cannot change the
    // outcome: none when the policy wants `max` (never relaxed), and
    // memory.max only when memory.high is there and differs from what the
    // policy wants (the common case is our own value, never relaxed).
    let wanted = wanted.trim();
    if wanted == "max" {
        return None;
    }
    let mut path = dir.join("memory.high");
    let high = with_value(&path, |h| (h != wanted).then(|| h.to_owned()));
    let Ok(Some(high)) = high else {
        return None;
    };
    path.set_file_name("memory.max");
    let max = with_value(&path, |max| {
        is_relaxed(wanted, &high, max).then(|| max.to_owned())
    });
    Some((high, max.ok()??))
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

    #[test]
    fn throttle_relaxed_judged_from_the_tree() {
        assert!(is_relaxed("247463936", "268435456\n", "268435456\n"));
        assert!(is_relaxed("247463936", "4611686018427387904\n", "max"));
        assert!(!is_relaxed("247463936", "247463936", "268435456"));
        // Not ours to call relaxed: the policy wants no memory.high at all,
        // or someone set another value.
        assert!(!is_relaxed("max", "max", "max"));
        assert!(!is_relaxed("247463936", "250000000", "268435456"));
        // Never set (created while the plugin was away): the guard would
        // have written the limit, or RELAXED_WITHOUT_LIMIT, never `max`.
        assert!(!is_relaxed("63750144", "max", "67108864\n"));
        assert!(!is_relaxed("2815623168", "max", "max"));
    }

    #[test]
    fn throttle_relaxed_reads_memory_max_only_when_it_can_tell() {
        let d = tempfile::tempdir().unwrap();
        let write = |f: &str, v: &str| std::fs::write(d.path().join(f), v).unwrap();
        // memory.max is a directory here: reading it would fail, so a
        // right answer where it matters shows it was not read.
        std::fs::create_dir(d.path().join("memory.max")).unwrap();
        assert!(!relaxed_in_tree(d.path(), "247463936"), "no memory.high");
        write("memory.high", "247463936\n");
        assert!(!relaxed_in_tree(d.path(), " 247463936"), "our own value");
        write("memory.high", "max\n");
        assert!(!relaxed_in_tree(d.path(), "max"), "the policy wants none");
        std::fs::remove_dir(d.path().join("memory.max")).unwrap();
        write("memory.max", "max\n");
        assert!(!relaxed_in_tree(d.path(), "247463936"), "never set");
        write("memory.high", &format!("{RELAXED_WITHOUT_LIMIT}\n"));
        assert!(relaxed_in_tree(d.path(), "247463936"));
        write("memory.high", "268435456\n");
        write("memory.max", "268435456\n");
        assert!(relaxed_in_tree(d.path(), "247463936"));
        write("memory.high", "250000000\n");
        assert!(!relaxed_in_tree(d.path(), "247463936"), "someone else's");
    }

    #[test]
    fn values_read_trimmed_at_any_length_and_absence_is_told() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("memory.low");
        assert_eq!(
            with_value(&f, |_| ()).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(read_protection_present(d.path()), None);
        for text in ["8192\n".to_string(), format!("{:>100}\n", 8192)] {
            std::fs::write(&f, &text).unwrap();
            assert_eq!(with_value(&f, str::to_owned).unwrap(), "8192");
            assert_eq!(read_single(&f).ok(), Some(Some(8192)));
        }
        std::fs::write(&f, [0xff, b'\n']).unwrap();
        assert!(with_value(&f, |_| ()).is_err());
        assert!(read_single(&f).is_err());
        std::fs::write(d.path().join("memory.min"), "max\n").unwrap();
        std::fs::write(&f, "8192\n").unwrap();
        assert_eq!(
            read_protection_present(d.path()),
            Some(Protection {
                min: u64::MAX,
                low: 8192
            })
        );
    }

    #[test]
    fn small_reads_return_whole_files_of_any_size() {
        let d = tempfile::tempdir().unwrap();
        for size in [0, 1, 511, 512, 513, 4095, 4096, 4097, 70_000] {
            let text: String = "abcdefghijklmnopqrstuvwxyz"
                .chars()
                .cycle()
                .take(size)
                .collect();
            let path = d.path().join(format!("f{size}"));
            std::fs::write(&path, &text).unwrap();
            assert_eq!(read(&path).unwrap(), text, "{size} bytes");
        }
        assert!(read(&d.path().join("absent")).unwrap_err().is_not_found());
    }

    #[test]
    fn protection_reads_max_and_junk() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_protection(d.path()), Protection::default());
        std::fs::write(d.path().join("memory.min"), "max\n").unwrap();
        std::fs::write(d.path().join("memory.low"), "junk\n").unwrap();
        assert_eq!(
            read_protection(d.path()),
            Protection {
                min: u64::MAX,
                low: 0
            }
        );
        std::fs::write(d.path().join("memory.low"), " 8192\n").unwrap();
        assert_eq!(read_protection(d.path()).low, 8192);
        let f = d.path().join("memory.high");
        assert!(write_file(&d.path().join("nope"), "1").is_err());
        std::fs::write(&f, "123456").unwrap();
        write_file(&f, "max").unwrap();
        assert_eq!(read_trimmed(&f).as_deref(), Some("max"));
    }
}
