//! Keeping the monitor itself responsive while the node runs short, as
//! lmkd and earlyoom do: its memory stays resident and its thread gets more
//! CPU weight than the workloads it may have to kill.

use std::io;

/// CAP_IPC_LOCK, the bit in the effective set of `/proc/self/status`.
const CAP_IPC_LOCK: u32 = 14;

/// Whether `CapEff` of a `/proc/<pid>/status` text holds CAP_IPC_LOCK.
fn status_has_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Locks the process's pages in memory as they are touched (`mlockall`
/// with `MCL_ONFAULT`: nothing is prefaulted, so RSS does not grow). Under
/// pressure the kernel evicts file-backed pages first, the monitor's own
/// code among them, and a monitor that must page its code back in from
/// disk while the node thrashes is late.
///
/// Only with CAP_IPC_LOCK or an unlimited RLIMIT_MEMLOCK: locked mappings
/// (thread stacks, malloc arenas: far more than RSS) count against the
/// limit, and once it is reached every later mmap fails, so allocations
/// would abort; refused with `PermissionDenied` otherwise.
pub fn lock_memory() -> io::Result<()> {
    let capable = std::fs::read_to_string("/proc/self/status")
        .map(|s| status_has_ipc_lock(&s))
        .unwrap_or(false);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    let unlimited = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0
        && limit.rlim_cur == libc::RLIM_INFINITY;
    if !capable && !unlimited {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "neither CAP_IPC_LOCK nor an unlimited RLIMIT_MEMLOCK",
        ));
    }
    // SAFETY: mlockall takes only flags and touches no memory of ours.
    let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's kernel id: the "process" a per-thread
/// setpriority/getpriority call names.
fn current_tid() -> io::Result<libc::id_t> {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    libc::id_t::try_from(tid).map_err(|_| io::Error::other("thread id out of range"))
}

/// Sets the nice value of the calling thread only (Linux keeps one per
/// thread). Lowering it needs CAP_SYS_NICE.
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, current_tid()?, nice) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's nice value.
    fn thread_nice() -> io::Result<i32> {
        let tid = current_tid()?;
        // getpriority returns the nice value, and -1 is a valid one: clear errno first.
        // SAFETY: __errno_location points at this thread's errno; getpriority takes integers.
        unsafe {
            *libc::__errno_location() = 0;
            let n = libc::getpriority(libc::PRIO_PROCESS, tid);
            match io::Error::last_os_error().raw_os_error() {
                Some(0) | None => Ok(n),
                Some(_) => Err(io::Error::last_os_error()),
            }
        }
    }

    #[test]
    fn cap_ipc_lock_is_read_from_the_effective_set() {
        let status =
            |eff: &str| format!("Name:\tnri-qos\nCapInh:\t0000000000000000\nCapEff:\t{eff}\n");
        assert!(status_has_ipc_lock(&status("000001ffffffffff")));
        assert!(status_has_ipc_lock(&status("0000000000004000")));
        assert!(!status_has_ipc_lock(&status("0000000001000002")));
        assert!(!status_has_ipc_lock(&status("junk")));
        assert!(!status_has_ipc_lock("Name:\tx\n"));
    }

    #[test]
    fn raising_the_nice_value_of_one_thread_leaves_the_others() {
        // Raising (lowering priority) needs no privilege, so this runs anywhere.
        let before = thread_nice().unwrap();
        let other = std::thread::spawn(move || {
            set_thread_nice((before + 1).min(19)).unwrap();
            thread_nice().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(other, (before + 1).min(19));
        assert_eq!(
            thread_nice().unwrap(),
            before,
            "only the spawned thread changed"
        );
    }
}
