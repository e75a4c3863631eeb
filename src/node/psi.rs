//! PSI files: `memory.pressure` of a cgroup and `/proc/pressure/memory`.

use std::path::Path;

use super::cgroupfs::{self as stat, ReadError};

/// One line of a PSI file; averages are percentages, total is µs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total_us: u64,
}

/// A PSI file. `full` is absent on old kernels' CPU files; for memory it is
/// always there, but we do not insist.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Psi {
    pub some: PsiLine,
    pub full: Option<PsiLine>,
}

pub fn parse(path: &Path, text: &str) -> Result<Psi, ReadError> {
    let bad = |line: usize, msg: String| ReadError::Parse {
        path: path.to_path_buf(),
        line,
        msg,
    };
    let mut some = None;
    let mut full = None;
    for (i, line) in text.lines().enumerate() {
        let mut it = line.split_whitespace();
        let Some(kind) = it.next() else { continue };
        let mut l = PsiLine::default();
        let mut seen = 0;
        for kv in it {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(i + 1, format!("want key=value, got {kv:?}")))?;
            let num_err = || bad(i + 1, format!("{k} is not a number: {v:?}"));
            match k {
                "avg10" => l.avg10 = v.parse().map_err(|_| num_err())?,
                "avg60" => l.avg60 = v.parse().map_err(|_| num_err())?,
                "avg300" => l.avg300 = v.parse().map_err(|_| num_err())?,
                "total" => l.total_us = v.parse().map_err(|_| num_err())?,
                _ => continue, // newer kernels may add keys
            }
            seen += 1;
        }
        if seen < 4 {
            return Err(bad(
                i + 1,
                format!("missing avg10/avg60/avg300/total in {line:?}"),
            ));
        }
        match kind {
            "some" => some = Some(l),
            "full" => full = Some(l),
            other => return Err(bad(i + 1, format!("unknown line kind {other:?}"))),
        }
    }
    let some = some.ok_or_else(|| bad(1, "no `some` line".into()))?;
    Ok(Psi { some, full })
}

pub fn read(path: &Path) -> Result<Psi, ReadError> {
    parse(path, &stat::read(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "some avg10=1.50 avg60=0.20 avg300=0.00 total=12345\n\
                          full avg10=0.75 avg60=0.10 avg300=0.00 total=678\n";

    #[test]
    fn pressure_psi_parses_some_and_full() {
        let p = parse(Path::new("/proc/pressure/memory"), SAMPLE).unwrap();
        assert_eq!(p.some.avg10, 1.5);
        assert_eq!(p.some.total_us, 12345);
        assert_eq!(p.full.unwrap().avg10, 0.75);
    }

    #[test]
    fn pressure_psi_rejects_junk_with_path_and_line() {
        let path = Path::new("/x/memory.pressure");
        for junk in [
            "",
            "some avg10=x avg60=0 avg300=0 total=1",
            "some avg10=0 avg60=0 avg300=0",
            "some avg10=0 avg60=0 avg300=0 total=1\nhalf avg10=0 avg60=0 avg300=0 total=1",
            "some avg10",
        ] {
            let e = parse(path, junk).unwrap_err().to_string();
            assert!(
                e.contains("/x/memory.pressure") && e.contains("line"),
                "{junk:?}: {e}"
            );
        }
    }
}
