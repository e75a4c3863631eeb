//! The ground floor: facts about the node read once at start (paths
//! injected for tests), the QoS class, the kubelet's cgroup layout
//! ([`layout`]), reading/writing cgroup files ([`cgroupfs`]) and durations
//! as whole numbers ([`time`]). Imports nothing of ours.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub mod cgroup_files;
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
pub mod runtime;

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
    #[error("{what} needs the unified cgroup v2 hierarchy, and {} holds {layout}; move the node to cgroup v2 (systemd.unified_cgroup_hierarchy=1), which the kubelet requires from 1.35 unless failCgroupV1 is false", root.display())]
    NotCgroupV2 {
        what: &'static str,
        root: PathBuf,
        layout: CgroupLayout,
    },
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
    cgroup_root.join(cgroup_files::CGROUP_CONTROLLERS).is_file()
}

/// What is mounted at the cgroup root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// The unified cgroup v2 hierarchy.
    Unified,
    /// systemd's hybrid layout: the controllers on cgroup v1 hierarchies,
    /// v2 mounted at `unified/` without any.
    Hybrid { controllers: Vec<String> },
    /// cgroup v1 hierarchies only.
    Legacy { controllers: Vec<String> },
    /// Neither: nothing mounted there, or not readable.
    Unknown,
}

impl std::fmt::Display for CgroupLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CgroupLayout::Unified => f.write_str("cgroup v2"),
            CgroupLayout::Hybrid { controllers } => write!(
                f,
                "a hybrid cgroup layout (v1 hierarchies {}; v2 at unified/ without controllers)",
                controllers.join(" ")
            ),
            CgroupLayout::Legacy { controllers } => {
                write!(f, "cgroup v1 (hierarchies {})", controllers.join(" "))
            }
            CgroupLayout::Unknown => f.write_str("no cgroup hierarchy nri-qos recognises"),
        }
    }
}

/// The layout at `root`: v2 has `cgroup.controllers` at the root; each v1
/// hierarchy is a directory with `cgroup.procs` (systemd's named one and
/// the hybrid's `unified/` are not controllers). A few dozen directory
/// entries at most are looked at.
pub fn cgroup_layout(root: &Path) -> CgroupLayout {
    if is_cgroup_v2(root) {
        return CgroupLayout::Unified;
    }
    let mut controllers: Vec<String> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .take(64)
        .filter_map(Result::ok)
        // The `cpu` and `cpuacct` symlinks name `cpu,cpuacct` again.
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.path().join(cgroup_files::CGROUP_PROCS).is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != "unified" && n != "systemd")
        .collect();
    controllers.sort();
    match (controllers.is_empty(), is_cgroup_v2(&root.join("unified"))) {
        (true, _) => CgroupLayout::Unknown,
        (false, true) => CgroupLayout::Hybrid { controllers },
        (false, false) => CgroupLayout::Legacy { controllers },
    }
}

/// Refuses what cannot work without cgroup v2 (`what`, e.g. "the pressure
/// monitor"), naming the mount and what it holds.
pub fn require_cgroup_v2(what: &'static str, root: &Path) -> Result<(), NodeError> {
    match cgroup_layout(root) {
        CgroupLayout::Unified => Ok(()),
        layout => Err(NodeError::NotCgroupV2 {
            what,
            root: root.to_path_buf(),
            layout,
        }),
    }
}

/// What the plugin says once at start on a node without cgroup v2: the
/// mount, what it holds, and what nri-qos still does there.
pub fn cgroup_v1_notice(root: &Path) -> String {
    format!(
        "{} holds {}: nri-qos applies only oom_score_adj by QoS class and the CPU shares/quota clamps there;          cpu.weight, memory.min/low/high, the hierarchy keeper, the pressure monitor and the throttle guard need cgroup v2.          The kubelet refuses cgroup v1 from 1.35 unless failCgroupV1 is false; move the node to cgroup v2          (systemd.unified_cgroup_hierarchy=1)",
        root.display(),
        cgroup_layout(root)
    )
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

    /// The three layouts a node may have, on fake trees shaped like them.
    #[test]
    fn cgroup_layouts_are_told_apart_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let hierarchy = |name: &str| {
            std::fs::create_dir_all(root.join(name)).unwrap();
            std::fs::write(root.join(name).join("cgroup.procs"), "").unwrap();
        };
        assert_eq!(cgroup_layout(root), CgroupLayout::Unknown);
        for name in ["memory", "cpu,cpuacct", "systemd"] {
            hierarchy(name);
        }
        std::os::unix::fs::symlink(root.join("cpu,cpuacct"), root.join("cpu")).unwrap();
        let controllers = vec!["cpu,cpuacct".to_string(), "memory".to_string()];
        assert_eq!(
            cgroup_layout(root),
            CgroupLayout::Legacy {
                controllers: controllers.clone()
            }
        );
        std::fs::create_dir_all(root.join("unified")).unwrap();
        std::fs::write(root.join("unified/cgroup.controllers"), "").unwrap();
        let hybrid = cgroup_layout(root);
        assert_eq!(hybrid, CgroupLayout::Hybrid { controllers });
        let err = require_cgroup_v2("the pressure monitor", root).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("the pressure monitor needs the unified cgroup v2 hierarchy"),
            "{text}"
        );
        assert!(text.contains(&root.display().to_string()), "{text}");
        assert!(
            text.contains("hybrid") && text.contains("cpu,cpuacct memory"),
            "{text}"
        );
        let notice = cgroup_v1_notice(root);
        assert!(
            notice.contains("oom_score_adj") && notice.contains("failCgroupV1"),
            "{notice}"
        );
        std::fs::write(root.join("cgroup.controllers"), "cpu memory\n").unwrap();
        assert_eq!(cgroup_layout(root), CgroupLayout::Unified);
        assert!(require_cgroup_v2("the pressure monitor", root).is_ok());
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
