//! Finds the pod cgroups under kubepods on disk (the names are
//! [`crate::node::layout`]'s). Anything else is logged once and skipped.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::node::layout::{classify, Driver, Entry};
use crate::node::QosClass;

/// A pod cgroup found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    /// Pod UID with dashes (systemd's `_` turned back into `-`).
    pub uid: String,
    /// Class implied by where the cgroup sits.
    pub class: QosClass,
    pub path: PathBuf,
}

/// Scans kubepods; remembers which unknown names it already logged so a
/// stray directory costs one log line, not one per scan.
#[derive(Debug, Default)]
pub struct Discovery {
    logged_unknown: HashSet<PathBuf>,
}

/// Bound on remembered unknown names (bounded memory on a weird host).
const MAX_LOGGED_UNKNOWN: usize = 1024;

impl Discovery {
    pub fn scan(&mut self, kubepods: &Path, driver: Driver) -> Vec<PodCgroup> {
        let mut out = Vec::new();
        self.scan_dir(kubepods, driver, None, &mut out);
        out.sort_by(|a, b| a.uid.cmp(&b.uid));
        out
    }

    fn scan_dir(
        &mut self,
        dir: &Path,
        driver: Driver,
        parent: Option<QosClass>,
        out: &mut Vec<PodCgroup>,
    ) {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(path = %dir.display(), error = %e, "cannot list cgroup directory");
                return;
            }
        };
        for entry in entries.flatten() {
            // Only directories are cgroups; the rest are interface files.
            if !entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            match classify(driver, parent, name) {
                Some(Entry::QosParent(class)) => {
                    self.scan_dir(&entry.path(), driver, Some(class), out)
                }
                Some(Entry::Pod { uid, class }) => out.push(PodCgroup {
                    uid,
                    class,
                    path: entry.path(),
                }),
                None => {
                    let p = entry.path();
                    if self.logged_unknown.len() < MAX_LOGGED_UNKNOWN
                        && self.logged_unknown.insert(p.clone())
                    {
                        tracing::warn!(path = %p.display(), ?driver, "unknown cgroup under kubepods, skipped");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::layout::find_kubepods;

    #[test]
    fn pressure_scan_finds_pods_and_skips_unknown() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for p in [
            "kubepods.slice/kubepods-podg_1.slice/cri-containerd-a.scope",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb_1.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pode_1.slice",
            "kubepods.slice/weird",
        ] {
            std::fs::create_dir_all(root.join(p)).unwrap();
        }
        std::fs::write(root.join("kubepods.slice/memory.pressure"), "").unwrap();
        let (kp, driver) = find_kubepods(root, "auto").unwrap();
        assert_eq!(driver, Driver::Systemd);
        let mut disc = Discovery::default();
        let pods = disc.scan(&kp, driver);
        let got: Vec<_> = pods.iter().map(|p| (p.uid.as_str(), p.class)).collect();
        assert_eq!(
            got,
            vec![
                ("b-1", QosClass::Burstable),
                ("e-1", QosClass::BestEffort),
                ("g-1", QosClass::Guaranteed)
            ]
        );
        assert_eq!(disc.logged_unknown.len(), 1);
        disc.scan(&kp, driver);
        assert_eq!(disc.logged_unknown.len(), 1);
        assert!(find_kubepods(root, "nope").is_none());
        assert_eq!(
            find_kubepods(root, "/kubepods.slice").unwrap().1,
            Driver::Systemd
        );
        // A directory outside the root is never the kubepods cgroup.
        std::fs::create_dir_all(root.join("kubepods.slice/x")).unwrap();
        assert!(find_kubepods(&root.join("kubepods.slice/x"), "..").is_none());
    }
}
