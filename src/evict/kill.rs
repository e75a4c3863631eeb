//! The I/O of killing a whole pod cgroup: `cgroup.kill`, else SIGKILL per
//! pid, followed by `process_mrelease`; and what the kill path checks on a
//! pod first (populated, only its sandbox left, node-critical). Process
//! syscalls sit behind [`ProcessOps`] so tests on a fake tree never signal
//! a real pid.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::node::cgroupfs::{self as stat, write_file, WriteError};

fn os_error(e: &WriteError) -> Option<i32> {
    let WriteError::Write { source, .. } = e;
    source.raw_os_error()
}

fn not_found(e: &WriteError) -> bool {
    let WriteError::Write { source, .. } = e;
    source.kind() == io::ErrorKind::NotFound
}

/// Process syscalls used by a kill.
pub trait ProcessOps: Send + Sync {
    /// pidfd_open(2): pins the process so a recycled pid cannot be hit.
    fn pidfd_open(&self, pid: i32) -> io::Result<OwnedFd>;
    /// SIGKILL through the pidfd (pidfd_send_signal, 5.1+).
    fn kill_pidfd(&self, fd: &OwnedFd) -> io::Result<()>;
    /// SIGKILL by pid, when pidfds are unavailable.
    fn kill_pid(&self, pid: i32) -> io::Result<()>;
    /// process_mrelease(2) (5.15+): free a dying process's memory now.
    fn mrelease(&self, fd: &OwnedFd) -> io::Result<()>;
}

/// The real syscalls: `kill` through `nix`; nix has no pidfd_open,
/// pidfd_send_signal or process_mrelease, so those are raw `libc` syscalls.
#[derive(Debug, Default)]
pub struct Syscalls;

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl ProcessOps for Syscalls {
    fn pidfd_open(&self, pid: i32) -> io::Result<OwnedFd> {
        // SAFETY: plain syscall with integer arguments; on success the
        // return value is a new fd that we own.
        let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
        let fd = i32::try_from(fd).map_err(|_| io::Error::other("pidfd out of range"))?;
        // SAFETY: fd was just returned by the kernel and is owned by no one else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn kill_pidfd(&self, fd: &OwnedFd) -> io::Result<()> {
        // SAFETY: valid fd, null siginfo is allowed, flags 0.
        check(unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        })
        .map(|_| ())
    }

    fn kill_pid(&self, pid: i32) -> io::Result<()> {
        kill(Pid::from_raw(pid), Signal::SIGKILL).map_err(io::Error::from)
    }

    fn mrelease(&self, fd: &OwnedFd) -> io::Result<()> {
        // SAFETY: valid fd, flags 0.
        check(unsafe { libc::syscall(libc::SYS_process_mrelease, fd.as_raw_fd(), 0) }).map(|_| ())
    }
}

/// Bound on pids handled per kill (bounded memory and time).
pub const MAX_PIDS: usize = 4096;
const MAX_DEPTH: usize = 4;

/// The processes of a cgroup subtree as `cgroup.procs` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubtreePids {
    /// Pids in our pid namespace, at most [`MAX_PIDS`].
    pub pids: Vec<i32>,
    /// Processes listed as 0: they are outside our pid namespace (a
    /// container without the host's), so no pid of theirs can be used.
    pub outside: usize,
}

/// All processes in the cgroup subtree at `cg`.
pub fn subtree(cg: &Path) -> SubtreePids {
    let mut out = SubtreePids::default();
    collect_pids(cg, 0, &mut out);
    if out.outside > 0 {
        warn_outside_once();
    }
    out
}

/// All pids in the cgroup subtree at `cg` that we can use, at most `MAX_PIDS`.
pub fn subtree_pids(cg: &Path) -> Vec<i32> {
    subtree(cg).pids
}

fn collect_pids(cg: &Path, depth: usize, out: &mut SubtreePids) {
    if depth > MAX_DEPTH || out.pids.len() >= MAX_PIDS {
        return;
    }
    let procs = cg.join("cgroup.procs");
    match stat::read(&procs) {
        // Each process in the reader's pid namespace, 0 for one outside it.
        Ok(text) => {
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                match line.parse::<i32>() {
                    Ok(0) => out.outside += 1,
                    Ok(pid) if pid > 0 && out.pids.len() < MAX_PIDS => out.pids.push(pid),
                    Ok(_) => {}
                    Err(_) => tracing::debug!(path = %procs.display(), line, "not a pid"),
                }
            }
        }
        Err(e) if e.is_not_found() => {}
        Err(e) => tracing::debug!(error = %e, "cannot read pids"),
    }
    if let Ok(entries) = std::fs::read_dir(cg) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_pids(&e.path(), depth + 1, out);
            }
        }
    }
}

/// Said once per process: without the host's pid namespace the kill path
/// cannot tell a sandbox-only pod, release a victim's memory, or SIGKILL
/// per pid on kernels without `cgroup.kill`.
fn warn_outside_once() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "cgroup.procs lists processes outside this pid namespace (0): run nri-qos in the host's pid namespace \
             (DaemonSet: hostPID: true); until then no pod is known to hold only its sandbox, \
             process_mrelease and the per-pid kill fallback find no pid"
        );
    }
}

/// `populated` from `cgroup.events`; a vanished cgroup counts as empty.
pub fn populated(cg: &Path) -> bool {
    match stat::read_populated(cg) {
        Ok(populated) => populated,
        Err(e) if e.is_not_found() => false,
        // Unreadable but present: assume still busy, kill-timeout bounds it.
        Err(_) => true,
    }
}

/// True when every process left in the pod is the sandbox (`pause`), so
/// killing the pod would free nothing worth a kill. Vacuously true when empty.
pub fn pause_only(pod: &Path, proc_root: &Path) -> bool {
    let procs = subtree(pod);
    // A process we cannot see or inspect (just exited, or hidden) is not
    // proof of a pause-only pod.
    procs.outside == 0
        && procs
            .pids
            .into_iter()
            .take(64)
            .all(|pid| comm(proc_root, pid).is_some_and(|c| c == "pause"))
}

fn comm(proc_root: &Path, pid: i32) -> Option<String> {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
        .ok()
        .map(|c| c.trim().to_string())
}

/// The kubelet's `oom_score_adj` for the containers of a node-critical pod
/// (priority class `system-node-critical`), the same as a Guaranteed pod's.
/// A Burstable container gets 3..=999 otherwise, so on a Burstable pod
/// this value says "node-critical" without the API server.
pub const NODE_CRITICAL_OOM_SCORE_ADJ: i32 = -997;

/// True when a process of the pod other than its sandbox holds
/// [`NODE_CRITICAL_OOM_SCORE_ADJ`]. Meaningful for Burstable pods only.
pub fn holds_node_critical_score(pod: &Path, proc_root: &Path) -> bool {
    subtree(pod).pids.into_iter().take(64).any(|pid| {
        comm(proc_root, pid).is_some_and(|c| c != "pause")
            && std::fs::read_to_string(proc_root.join(pid.to_string()).join("oom_score_adj"))
                .ok()
                .and_then(|v| v.trim().parse::<i32>().ok())
                == Some(NODE_CRITICAL_OOM_SCORE_ADJ)
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillMethod {
    CgroupKill,
    /// Per-pid SIGKILL, re-reading cgroup.procs `passes` times.
    Sigkill {
        passes: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillReport {
    pub method: KillMethod,
    pub pids: usize,
    /// Victims whose memory process_mrelease freed from here.
    pub mreleased: usize,
    /// Victims already past giving up their mm (ESRCH): they were running
    /// and are tearing down their own memory; nothing left for us to reap.
    /// process_mrelease pays off for victims that cannot run (stalled in
    /// reclaim, starved of CPU), which is when a node needs it most.
    pub mrelease_exiting: usize,
    /// process_mrelease is missing (ENOSYS): do not try again.
    pub mrelease_unsupported: bool,
}

/// Kills every process in the pod cgroup at `cg`.
pub fn kill_pod(cg: &Path, ops: &dyn ProcessOps, mrelease: bool) -> Result<KillReport, WriteError> {
    // Pin the processes first, so mrelease after the kill hits the right ones.
    let pids = subtree_pids(cg);
    let fds: Vec<OwnedFd> = if mrelease {
        pids.iter()
            .filter_map(|&p| ops.pidfd_open(p).ok())
            .collect()
    } else {
        Vec::new()
    };

    let method = match write_file(&cg.join("cgroup.kill"), "1") {
        Ok(()) => KillMethod::CgroupKill,
        // Missing (kernel < 5.14) or refused (threaded cgroup): do it by hand.
        Err(e) if not_found(&e) || os_error(&e) == Some(libc::EOPNOTSUPP) => {
            tracing::debug!(error = %e, "cgroup.kill unavailable, killing per pid");
            sigkill_subtree(cg, ops)
        }
        Err(e) => return Err(e),
    };

    let mut mreleased = 0;
    let mut exiting = 0;
    let mut unsupported = false;
    for fd in &fds {
        match ops.mrelease(fd) {
            Ok(()) => mreleased += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                unsupported = true;
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => exiting += 1,
            // EINVAL: not dying (yet) or already reaped; EAGAIN/EINTR: the
            // kernel gave up on its lock. The victim still dies; say so only
            // in debug logs.
            Err(e) => tracing::debug!(error = %e, "process_mrelease"),
        }
    }
    Ok(KillReport {
        method,
        pids: pids.len(),
        mreleased,
        mrelease_exiting: exiting,
        mrelease_unsupported: unsupported,
    })
}

/// SIGKILL every pid, re-reading cgroup.procs until a pass finds nothing
/// new, so children forked meanwhile are caught too.
fn sigkill_subtree(cg: &Path, ops: &dyn ProcessOps) -> KillMethod {
    let mut signalled = std::collections::HashSet::new();
    let mut passes = 0;
    while passes < 20 {
        passes += 1;
        let fresh: Vec<i32> = subtree_pids(cg)
            .into_iter()
            .filter(|p| !signalled.contains(p))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            let r = match ops.pidfd_open(pid) {
                Ok(fd) => ops.kill_pidfd(&fd),
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => ops.kill_pid(pid),
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                tracing::debug!(pid, error = %e, "sigkill failed (process likely gone)");
            }
            if signalled.len() < MAX_PIDS * 4 {
                signalled.insert(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    KillMethod::Sigkill { passes }
}

#[cfg(test)]
pub mod fake {
    //! Records syscalls instead of making them.
    use super::*;
    use std::sync::Mutex;

    #[derive(Debug, Default)]
    pub struct FakeOps {
        pub killed: Mutex<Vec<i32>>,
        pub opened: Mutex<Vec<i32>>,
        pub mreleased: Mutex<usize>,
        /// errno every process_mrelease fails with, when set.
        pub mrelease_errno: Option<i32>,
    }

    impl ProcessOps for FakeOps {
        fn pidfd_open(&self, pid: i32) -> io::Result<OwnedFd> {
            self.opened.lock().unwrap().push(pid);
            // Any real fd works as a token; /dev/null is harmless.
            Ok(OwnedFd::from(std::fs::File::open("/dev/null")?))
        }
        fn kill_pidfd(&self, _fd: &OwnedFd) -> io::Result<()> {
            let pid = *self.opened.lock().unwrap().last().unwrap_or(&0);
            self.killed.lock().unwrap().push(pid);
            Ok(())
        }
        fn kill_pid(&self, pid: i32) -> io::Result<()> {
            self.killed.lock().unwrap().push(pid);
            Ok(())
        }
        fn mrelease(&self, _fd: &OwnedFd) -> io::Result<()> {
            if let Some(errno) = self.mrelease_errno {
                return Err(io::Error::from_raw_os_error(errno));
            }
            *self.mreleased.lock().unwrap() += 1;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakeOps;
    use super::*;
    use std::fs;

    fn pod_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("c1")).unwrap();
        fs::write(d.path().join("cgroup.procs"), "").unwrap();
        fs::write(d.path().join("c1/cgroup.procs"), "101\n102\n").unwrap();
        d
    }

    #[test]
    fn pressure_kill_uses_cgroup_kill_and_mrelease() {
        let d = pod_dir();
        fs::write(d.path().join("cgroup.kill"), "").unwrap();
        let ops = FakeOps::default();
        let r = kill_pod(d.path(), &ops, true).unwrap();
        assert_eq!(r.method, KillMethod::CgroupKill);
        assert_eq!((r.pids, r.mreleased), (2, 2));
        assert_eq!(
            fs::read_to_string(d.path().join("cgroup.kill")).unwrap(),
            "1"
        );
        assert!(ops.killed.lock().unwrap().is_empty());
    }

    #[test]
    fn victims_already_exiting_are_counted_apart_from_mrelease_failures() {
        let d = pod_dir();
        fs::write(d.path().join("cgroup.kill"), "").unwrap();
        for (errno, exiting, unsupported) in [
            (libc::ESRCH, 2, false),
            (libc::EINVAL, 0, false),
            (libc::ENOSYS, 0, true),
        ] {
            let ops = FakeOps {
                mrelease_errno: Some(errno),
                ..FakeOps::default()
            };
            let r = kill_pod(d.path(), &ops, true).unwrap();
            assert_eq!(r.method, KillMethod::CgroupKill, "errno {errno}");
            assert_eq!(
                (r.mreleased, r.mrelease_exiting, r.mrelease_unsupported),
                (0, exiting, unsupported),
                "errno {errno}"
            );
        }
    }

    #[test]
    fn pressure_kill_falls_back_to_sigkill_per_pid() {
        let d = pod_dir(); // no cgroup.kill file: an old kernel
        let ops = FakeOps::default();
        let r = kill_pod(d.path(), &ops, false).unwrap();
        // The fake processes never exit, so the second pass finds nothing new.
        assert_eq!(r.method, KillMethod::Sigkill { passes: 2 });
        let mut k = ops.killed.lock().unwrap().clone();
        k.sort();
        assert_eq!(k, vec![101, 102]);
    }

    #[test]
    fn pressure_populated_from_cgroup_events() {
        let d = tempfile::tempdir().unwrap();
        assert!(!populated(d.path()));
        fs::write(d.path().join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert!(populated(d.path()));
    }

    #[test]
    fn pressure_pause_only_detection() {
        let d = pod_dir();
        let proc_root = tempfile::tempdir().unwrap();
        for (pid, comm) in [(101, "pause\n"), (102, "java\n")] {
            fs::create_dir_all(proc_root.path().join(pid.to_string())).unwrap();
            fs::write(proc_root.path().join(format!("{pid}/comm")), comm).unwrap();
        }
        assert!(!pause_only(d.path(), proc_root.path()));
        fs::write(d.path().join("c1/cgroup.procs"), "101\n").unwrap();
        assert!(pause_only(d.path(), proc_root.path()));
        // An uninspectable pid is not proof.
        fs::write(d.path().join("c1/cgroup.procs"), "101\n999\n").unwrap();
        assert!(!pause_only(d.path(), proc_root.path()));
    }

    /// Read from a pid namespace that is not the host's, cgroup.procs
    /// lists 0 for every process outside it: nothing is proof of a
    /// sandbox-only pod, and no 0 is ever signalled.
    #[test]
    fn pids_outside_our_namespace_prove_nothing() {
        let d = pod_dir();
        fs::write(d.path().join("c1/cgroup.procs"), "0\n0\n").unwrap();
        let proc_root = tempfile::tempdir().unwrap();
        assert_eq!(
            subtree(d.path()),
            SubtreePids {
                pids: vec![],
                outside: 2
            }
        );
        assert!(!pause_only(d.path(), proc_root.path()));
        let ops = FakeOps::default();
        let r = kill_pod(d.path(), &ops, true).unwrap();
        assert_eq!(r.method, KillMethod::Sigkill { passes: 1 });
        assert!(ops.killed.lock().unwrap().is_empty());
    }

    #[test]
    fn node_critical_burstable_is_told_by_its_oom_score_adj() {
        let d = pod_dir();
        let proc_root = tempfile::tempdir().unwrap();
        let proc = |pid: i32, comm: &str, adj: i32| {
            let dir = proc_root.path().join(pid.to_string());
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(dir.join("oom_score_adj"), format!("{adj}\n")).unwrap();
        };
        // The sandbox's -998 and an ordinary Burstable score say nothing.
        proc(101, "pause", -998);
        proc(102, "calico-node", 935);
        assert!(!holds_node_critical_score(d.path(), proc_root.path()));
        proc(102, "calico-node", NODE_CRITICAL_OOM_SCORE_ADJ);
        assert!(holds_node_critical_score(d.path(), proc_root.path()));
        proc(102, "pause", NODE_CRITICAL_OOM_SCORE_ADJ);
        assert!(!holds_node_critical_score(d.path(), proc_root.path()));
    }
}
