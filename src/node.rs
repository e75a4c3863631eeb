//! The ground floor: facts about the node read once at start (paths
//! injected for tests), the QoS class, the kubelet's cgroup layout
//! ([`layout`]), reading/writing cgroup files ([`cgroupfs`]) and durations
//! as whole numbers ([`time`]). Imports nothing of ours.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub mod cgroupfs;
pub mod layout;
pub mod psi;
pub mod time;

/// Kubernetes QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// Facts about the node the policy needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts {
    /// MemTotal in bytes (the kubelet's machineInfo.MemoryCapacity).
    pub memory_capacity: u64,
    /// Node allocatable memory in bytes (base of memory.high without a limit).
    pub memory_allocatable: u64,
    pub page_size: u64,
    pub cgroup_v2: bool,
}

pub mod cluster;
pub mod registry;
pub mod relax;

/// Locks `m` even when a holder panicked: our shared maps and links stay
/// usable after a writer panicked mid-update, which matters less than
/// refusing to serve.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Error)]
pub enum NodeError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} has no usable MemTotal line")]
    NoMemTotal { path: PathBuf },
}

/// A path from the runtime (cgroups paths, cgroup parents) or from a config
/// file that would leave the directory it is meant to stay in.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("{path:?} {reason}")]
pub struct UnsafePath {
    pub path: String,
    pub reason: &'static str,
}

/// `rel` as a path below a root: a leading `/` means the root itself (the
/// way cgroups paths are written), `.` is dropped, and `..`, a NUL byte or a
/// Windows prefix is refused. Every path a peer supplies goes through here
/// (or [`join_inside`]) before it touches the filesystem.
pub fn relative_inside(rel: impl AsRef<Path>) -> Result<PathBuf, UnsafePath> {
    let mut out = PathBuf::new();
    push_inside(&mut out, rel.as_ref())?;
    Ok(out)
}

/// `root` joined with `rel`, which can never name anything outside `root`
/// (see [`relative_inside`]). One allocation: a Synchronize joins a path
/// for every running container.
pub fn join_inside(root: &Path, rel: impl AsRef<Path>) -> Result<PathBuf, UnsafePath> {
    let rel = rel.as_ref();
    let mut out = PathBuf::with_capacity(root.as_os_str().len() + rel.as_os_str().len() + 24);
    out.push(root);
    push_inside(&mut out, rel)?;
    Ok(out)
}

/// Pushes the parts of `rel` onto `out` as [`relative_inside`] takes them.
fn push_inside(out: &mut PathBuf, rel: &Path) -> Result<(), UnsafePath> {
    let refuse = |reason| UnsafePath {
        path: rel.display().to_string(),
        reason,
    };
    let bytes = rel.as_os_str().as_encoded_bytes();
    if bytes.contains(&0) {
        return Err(refuse("contains a NUL byte"));
    }
    // The common case, a UTF-8 path, split on `/` directly (as
    // `components` would take it: empty parts and `.` dropped): a
    // Synchronize joins one for every running container.
    if let Some(text) = rel.to_str() {
        for part in text.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(refuse("contains \"..\"")),
                part => out.push(part),
            }
        }
        return Ok(());
    }
    for c in rel.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(refuse("contains \"..\"")),
            Component::Prefix(_) => return Err(refuse("has a path prefix")),
        }
    }
    Ok(())
}

/// MemTotal in bytes from a /proc/meminfo text.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemTotal:")?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// cgroup v2 when the mount point is the unified root (it has
/// `cgroup.controllers`); a v1 or hybrid layout does not.
pub fn is_cgroup_v2(cgroup_root: &Path) -> bool {
    cgroup_root.join("cgroup.controllers").is_file()
}

pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(4096)
}

/// Reads MemTotal, page size and the cgroup version. `allocatable` 0 means
/// "same as MemTotal".
pub fn read_node_facts(
    proc_root: &Path,
    cgroup_root: &Path,
    allocatable: u64,
) -> Result<NodeFacts, NodeError> {
    let path = proc_root.join("meminfo");
    let text = std::fs::read_to_string(&path).map_err(|source| NodeError::Read {
        path: path.clone(),
        source,
    })?;
    let capacity = parse_mem_total(&text).ok_or(NodeError::NoMemTotal { path })?;
    Ok(NodeFacts {
        memory_capacity: capacity,
        memory_allocatable: if allocatable == 0 {
            capacity
        } else {
            allocatable.min(capacity)
        },
        page_size: page_size(),
        cgroup_v2: is_cgroup_v2(cgroup_root),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_facts_from_a_fake_tree() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        let cg = dir.path().join("cg");
        std::fs::create_dir_all(&proc_root).unwrap();
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(
            proc_root.join("meminfo"),
            "MemTotal:       16777216 kB\nMemFree: 1 kB\n",
        )
        .unwrap();
        let f = read_node_facts(&proc_root, &cg, 0).unwrap();
        assert_eq!(f.memory_capacity, 17_179_869_184);
        assert_eq!(f.memory_allocatable, f.memory_capacity);
        assert!(!f.cgroup_v2);
        std::fs::write(cg.join("cgroup.controllers"), "cpu memory\n").unwrap();
        let f = read_node_facts(&proc_root, &cg, 1 << 30).unwrap();
        assert!(f.cgroup_v2);
        assert_eq!(f.memory_allocatable, 1 << 30);
    }

    #[test]
    fn joins_stay_inside_the_root() {
        let root = Path::new("/sys/fs/cgroup");
        for (rel, want) in [
            (
                "kubepods/burstable/poda/c1",
                "/sys/fs/cgroup/kubepods/burstable/poda/c1",
            ),
            ("/kubepods.slice", "/sys/fs/cgroup/kubepods.slice"),
            ("./kubepods//x/", "/sys/fs/cgroup/kubepods/x"),
            ("", "/sys/fs/cgroup"),
        ] {
            assert_eq!(join_inside(root, rel).unwrap(), Path::new(want), "{rel}");
        }
        for rel in [
            "..",
            "../../etc",
            "/kubepods/../../etc",
            "kubepods/burstable/pod../..",
            "a/b/../../..",
            "kube\0pods",
        ] {
            let err = join_inside(root, rel).unwrap_err();
            assert_eq!(err.path, rel, "{err}");
        }
        // "pod..x" is a name, not a parent reference.
        assert!(join_inside(root, "kubepods/pod..x").is_ok());
    }

    proptest::proptest! {
        /// The split on `/` takes a path as `Path::components` does.
        #[test]
        fn relative_paths_split_as_components_do(rel in "[a./]{0,12}") {
            let by_components: Option<PathBuf> = Path::new(&rel)
                .components()
                .filter(|c| !matches!(c, Component::RootDir | Component::CurDir))
                .map(|c| matches!(c, Component::Normal(_)).then_some(c))
                .collect::<Option<Vec<_>>>()
                .map(|parts| parts.iter().collect());
            proptest::prop_assert_eq!(relative_inside(&rel).ok(), by_components);
        }
    }

    #[test]
    fn junk_meminfo_is_an_error_not_a_panic() {
        assert_eq!(parse_mem_total("MemTotal: lots kB"), None);
        assert_eq!(parse_mem_total(""), None);
        assert_eq!(parse_mem_total("MemTotal: 99999999999999999999 kB"), None);
    }
}
