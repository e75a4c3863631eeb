//! containerd 1.7 (NRI v0.6) drops `oom_score_adj` adjustments silently, so
//! once such a container runs we write `/proc/<pid>/oom_score_adj` of its
//! init process ourselves. The pid comes from the runtime; we write only to
//! a process that is in the container's cgroup, and never to another
//! process that merely got the same pid number.
//!
//! How: the `/proc/<pid>` directory is opened once and everything else is
//! opened relative to that descriptor. Such a descriptor holds the kernel's
//! process identity, not the number (the kernel accepts it as a pidfd, see
//! pidfd_send_signal(2)): once that process is gone, every open below it
//! fails even if the number was reused. `pidfd_open(2)` itself is not used
//! because it resolves the number in our own pid namespace, while the
//! DaemonSet runs without `hostPID` and reads the host's procfs at
//! `/host/proc`; the directory descriptor is right in both cases.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use thiserror::Error;

use crate::node::layout::container_cgroup_dir;

#[derive(Debug, Error)]
pub enum OomFallbackError {
    #[error("container cgroups path {0:?} not understood")]
    CgroupsPath(String),
    #[error("process {pid} is gone")]
    Gone { pid: u32 },
    #[error("process {pid} is in cgroup {actual:?}, not the container's {expected}; not writing")]
    NotInContainer {
        pid: u32,
        actual: String,
        expected: String,
    },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether a `/proc/<pid>/cgroup` text puts the process in the cgroup
/// `expected` (relative to the cgroup root) or below it: the v2 line
/// `0::/path`, or any v1 hierarchy's line on a hybrid node.
///
/// Read from inside a cgroup namespace (the DaemonSet's container), paths
/// are shown relative to our own cgroup: `/../../../burstable/pod<uid>/<id>`
/// climbs to an ancestor both share, then names the rest. Then the part
/// after the climb must be how `expected` ends; it names the pod and the
/// container, which no other process's cgroup does.
pub fn in_cgroup(proc_cgroup: &str, expected: &Path) -> bool {
    proc_cgroup.lines().any(|line| {
        let Some(shown) = line.splitn(3, ':').nth(2) else {
            return false;
        };
        let parts: Vec<Component> = Path::new(shown)
            .components()
            .filter(|c| !matches!(c, Component::RootDir | Component::CurDir))
            .collect();
        let climbed = parts
            .iter()
            .take_while(|c| **c == Component::ParentDir)
            .count();
        let rest = &parts[climbed..];
        if rest.is_empty() || !rest.iter().all(|c| matches!(c, Component::Normal(_))) {
            return false;
        }
        let rest: PathBuf = rest.iter().collect();
        if climbed == 0 {
            return rest.starts_with(expected);
        }
        rest.ancestors()
            .any(|a| !a.as_os_str().is_empty() && expected.ends_with(a))
    })
}

fn open_below(dir: &File, name: &str, flags: OFlag) -> nix::Result<File> {
    let fd = openat(
        Some(dir.as_raw_fd()),
        name,
        flags | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: openat just returned this descriptor and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Writes `adj` to the `oom_score_adj` of process `pid` (below `proc_root`)
/// if, and only if, that process is in the cgroup `cgroups_path` (the
/// runtime's form: `/parent/id` or `slice:prefix:id`).
pub fn write_oom_score_adj(
    proc_root: &Path,
    pid: u32,
    cgroups_path: &str,
    adj: i64,
) -> Result<(), OomFallbackError> {
    let expected = container_cgroup_dir(cgroups_path)
        .ok_or_else(|| OomFallbackError::CgroupsPath(cgroups_path.to_string()))?;
    let dir_path = proc_root.join(pid.to_string());
    let io = |name: &str, source: std::io::Error| OomFallbackError::Io {
        path: dir_path.join(name),
        source,
    };
    // Pins the process: see the module comment.
    let dir = File::open(&dir_path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => OomFallbackError::Gone { pid },
        _ => io("", e),
    })?;
    let gone_or = |name: &str, e: nix::Error| match e {
        nix::Error::ENOENT | nix::Error::ESRCH => OomFallbackError::Gone { pid },
        e => io(name, e.into()),
    };
    let mut cgroup = String::new();
    open_below(&dir, "cgroup", OFlag::O_RDONLY)
        .map_err(|e| gone_or("cgroup", e))?
        .take(64 * 1024)
        .read_to_string(&mut cgroup)
        .map_err(|e| io("cgroup", e))?;
    if !in_cgroup(&cgroup, &expected) {
        return Err(OomFallbackError::NotInContainer {
            pid,
            actual: cgroup.trim().to_string(),
            expected: format!("/{}", expected.display()),
        });
    }
    open_below(&dir, "oom_score_adj", OFlag::O_WRONLY)
        .map_err(|e| gone_or("oom_score_adj", e))?
        .write_all(adj.to_string().as_bytes())
        .map_err(|e| io("oom_score_adj", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake procfs entry for `pid` in cgroup `cgroup`.
    fn fake_proc(root: &Path, pid: u32, cgroup: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), cgroup).unwrap();
        std::fs::write(dir.join("oom_score_adj"), "0").unwrap();
    }

    fn adj_of(root: &Path, pid: u32) -> String {
        std::fs::read_to_string(root.join(pid.to_string()).join("oom_score_adj")).unwrap()
    }

    #[test]
    fn writes_only_into_the_containers_cgroup() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        fake_proc(root, 10, "0::/kubepods/burstable/poda/c1\n");
        fake_proc(root, 11, "0::/system.slice/sshd.service\n");
        fake_proc(root, 12, "0::/kubepods/burstable/poda/c10\n");
        fake_proc(
            root,
            13,
            "12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda.slice/cri-containerd-c1.scope\n0::/\n",
        );
        // Seen from inside a cgroup namespace (the DaemonSet's).
        fake_proc(root, 14, "0::/../../../burstable/poda/c1\n");
        fake_proc(root, 15, "0::/../../../burstable/podb/c1\n");
        fake_proc(root, 16, "0::/../../../burstable/poda/c1/sub\n");
        fake_proc(root, 17, "0::/../..\n");

        for pid in [10, 14, 16] {
            write_oom_score_adj(root, pid, "/kubepods/burstable/poda/c1", 985).unwrap();
            assert_eq!(adj_of(root, pid), "985");
        }
        // The runtime named a pid that is now someone else's.
        for (pid, path) in [
            (11, "/kubepods/burstable/poda/c1"),
            (12, "/kubepods/burstable/poda/c1"),
            (15, "/kubepods/burstable/poda/c1"),
            (17, "/kubepods/burstable/poda/c1"),
        ] {
            let e = write_oom_score_adj(root, pid, path, 985).unwrap_err();
            assert!(matches!(e, OomFallbackError::NotInContainer { .. }), "{e}");
            assert_eq!(adj_of(root, pid), "0");
        }
        // systemd driver, v1 hierarchy line of a hybrid node.
        write_oom_score_adj(
            root,
            13,
            "kubepods-burstable-poda.slice:cri-containerd:c1",
            -997,
        )
        .unwrap();
        assert_eq!(adj_of(root, 13), "-997");
        // Gone, and paths that are not a container's.
        assert!(matches!(
            write_oom_score_adj(root, 99, "/kubepods/burstable/poda/c1", 985),
            Err(OomFallbackError::Gone { pid: 99 })
        ));
        for bad in ["", "/kubepods/../../etc", "a:b"] {
            assert!(matches!(
                write_oom_score_adj(root, 10, bad, 1),
                Err(OomFallbackError::CgroupsPath(_))
            ));
        }
    }

    /// The property the module relies on, on the real kernel (read-only):
    /// a `/proc/<pid>` descriptor of a process that has exited and been
    /// reaped opens nothing, whatever now has that number.
    #[test]
    fn a_proc_directory_descriptor_outlives_nothing() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let dir = File::open(format!("/proc/{}", child.id())).unwrap();
        assert!(open_below(&dir, "cgroup", OFlag::O_RDONLY).is_ok());
        child.kill().unwrap();
        child.wait().unwrap();
        let e = open_below(&dir, "cgroup", OFlag::O_RDONLY).unwrap_err();
        assert!(matches!(e, nix::Error::ENOENT | nix::Error::ESRCH), "{e}");
    }
}
