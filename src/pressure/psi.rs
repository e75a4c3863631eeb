//! PSI triggers: `some|full <stall_us> <window_us>` written to an fd that
//! is then polled for POLLPRI; one open fd per trigger, closing it removes
//! the trigger. Reading a PSI file is the ground floor's ([`crate::node::psi`]).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, TrySendError};

use nix::fcntl::OFlag;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::Wake;
pub use crate::node::psi::{parse, read, Psi, PsiLine};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallKind {
    Some,
    Full,
}

/// A PSI trigger as written to the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trigger {
    pub kind: StallKind,
    pub stall_us: u64,
    pub window_us: u64,
}

/// A PSI trigger line (`psi-triggers`) the kernel would not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TriggerError {
    #[error("trigger {0:?}: want \"some|full <stall_us> <window_us>\"")]
    Shape(String),
    #[error("trigger {0:?}: kind must be some or full")]
    Kind(String),
    #[error("trigger {trigger:?}: {value:?} is not a number")]
    Number { trigger: String, value: String },
    #[error("trigger {0:?}: window must be in 1..=10000000 us")]
    Window(String),
    #[error("trigger {0:?}: stall must be in 1..=window")]
    Stall(String),
}

impl std::str::FromStr for Trigger {
    type Err = TriggerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        let [kind, stall, window] = parts[..] else {
            return Err(TriggerError::Shape(s.to_string()));
        };
        let kind = match kind {
            "some" => StallKind::Some,
            "full" => StallKind::Full,
            _ => return Err(TriggerError::Kind(s.to_string())),
        };
        let num = |v: &str| {
            v.parse::<u64>().map_err(|_| TriggerError::Number {
                trigger: s.to_string(),
                value: v.to_string(),
            })
        };
        let (stall_us, window_us) = (num(stall)?, num(window)?);
        // The kernel's own limits (psi_trigger_create): 0 < window <= 10 s,
        // 0 < stall <= window.
        if window_us == 0 || window_us > 10_000_000 {
            return Err(TriggerError::Window(s.to_string()));
        }
        if stall_us == 0 || stall_us > window_us {
            return Err(TriggerError::Stall(s.to_string()));
        }
        Ok(Trigger {
            kind,
            stall_us,
            window_us,
        })
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            StallKind::Some => "some",
            StallKind::Full => "full",
        };
        write!(f, "{kind} {} {}", self.stall_us, self.window_us)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    #[error("open {path} for trigger {trigger}: {source}")]
    Open {
        path: PathBuf,
        trigger: String,
        source: io::Error,
    },
    #[error("write trigger {trigger} to {path}: {source}")]
    Write {
        path: PathBuf,
        trigger: String,
        source: io::Error,
    },
}

/// True when `path` lives on procfs or cgroup2, i.e. writing a trigger
/// there arms the kernel. A fake tree's plain file is left alone.
pub fn is_kernel_psi_file(path: &Path) -> bool {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, PROC_SUPER_MAGIC};
    statfs(path).is_ok_and(|s| {
        let t = s.filesystem_type();
        t == PROC_SUPER_MAGIC || t == CGROUP2_SUPER_MAGIC
    })
}

/// Opens `path` and writes the trigger. The returned file must stay open
/// for as long as the trigger should exist.
pub fn arm(path: &Path, trigger: &Trigger) -> Result<File, ArmError> {
    let t = trigger.to_string();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|source| ArmError::Open {
            path: path.to_path_buf(),
            trigger: t.clone(),
            source,
        })?;
    // The kernel overwrites the last byte of the write with NUL, so the
    // terminator must be part of the single write (psi.rst's example does
    // strlen + 1).
    let mut buf = t.clone().into_bytes();
    buf.push(0);
    match f.write(&buf) {
        Ok(n) if n == buf.len() => Ok(f),
        Ok(n) => Err(ArmError::Write {
            path: path.to_path_buf(),
            trigger: t,
            source: io::Error::other(format!("short write {n}/{}", buf.len())),
        }),
        Err(source) => Err(ArmError::Write {
            path: path.to_path_buf(),
            trigger: t,
            source,
        }),
    }
}

/// Watches an armed trigger fd on the runtime `rt` and sends `Wake::Psi` to
/// the monitor thread on every POLLPRI. Returns `Err` when the fd cannot be
/// polled (e.g. a regular file in a fake tree); the caller then relies on
/// the periodic check.
pub fn watch(
    label: String,
    file: File,
    tx: SyncSender<Wake>,
    rt: &tokio::runtime::Handle,
) -> io::Result<tokio::task::JoinHandle<()>> {
    // Called from the monitor thread: AsyncFd registers with `rt`'s reactor.
    let _in_runtime = rt.enter();
    // SAFETY: the File owns its fd and moves into the AsyncFd, so the fd
    // stays open and unchanged for the AsyncFd's whole life.
    let afd = unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) }?;
    Ok(rt.spawn(async move {
        loop {
            let mut guard = match afd.ready(Interest::PRIORITY).await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(trigger = %label, error = %e, "psi trigger poll failed");
                    let _ = tx.try_send(Wake::PsiLost { source: label });
                    return;
                }
            };
            if guard.ready().is_error() {
                // POLLERR: the source is gone (cgroup removed).
                let _ = tx.try_send(Wake::PsiLost { source: label });
                return;
            }
            guard.clear_ready();
            // A full channel already holds a wake-up; dropping this one is fine.
            match tx.try_send(Wake::Psi {
                source: label.clone(),
            }) {
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_trigger_parse_and_kernel_limits() {
        let t: Trigger = "full 100000 1000000".parse().unwrap();
        assert_eq!(t.kind, StallKind::Full);
        assert_eq!(t.to_string(), "full 100000 1000000");
        for bad in [
            "full 0 1000000",
            "some 2 1",
            "some 1 10000001",
            "half 1 2",
            "some 1",
            "some a b",
        ] {
            assert!(bad.parse::<Trigger>().is_err(), "{bad}");
        }
    }

    #[test]
    fn pressure_arm_writes_nul_terminated_trigger() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.pressure");
        std::fs::write(&path, "").unwrap();
        let _f = arm(&path, &"some 300000 1000000".parse().unwrap()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"some 300000 1000000\0");
        assert!(arm(&dir.path().join("missing"), &"some 1 2".parse().unwrap()).is_err());
    }

    #[test]
    fn pressure_fake_psi_file_is_not_a_kernel_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.pressure");
        std::fs::write(&path, "").unwrap();
        assert!(!is_kernel_psi_file(&path));
        assert!(!is_kernel_psi_file(&dir.path().join("missing")));
        // statfs only (no write): procfs is recognised.
        assert!(is_kernel_psi_file(Path::new("/proc/self/status")));
    }

    #[tokio::test]
    async fn pressure_watch_on_regular_file_is_refused() {
        // Fake trees hold plain files, which epoll refuses: the monitor must
        // notice and fall back to its periodic check.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.pressure");
        std::fs::write(&path, "").unwrap();
        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        let rt = tokio::runtime::Handle::current();
        assert!(watch("t".into(), File::open(&path).unwrap(), tx, &rt).is_err());
    }
}
